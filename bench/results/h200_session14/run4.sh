#!/usr/bin/env bash
# Session 14, run 4 (H200): an on-card calibration with active sampling (issue 15, item 5), at run 6's
# device time (`--budget-minutes 7.4`, all kernels, lossy conversions measured): a sweep of 128
# problems (about half of what run 6 measured), then rounds that measure what bootstrap fits of the
# cost model disagree on most (`--active-rounds`), each a quarter of the problems so far (no crossover round), until the
# deadline. Its measurements and table come back for scoring against run 6 off the card. Run from the
# repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log calibrate
( time timeout 560 python3 -m attn_dispatch calibrate --device cuda:0 --problems 128 --refine-rounds 0 --active-rounds 8 \
    --budget-minutes 7.4 --allow-lossy any --quiet --results $OUT/active_measurements.jsonl \
    --out $OUT/active_table.json --summary-json $OUT/active_summary.json ) > $OUT/active.log 2>&1
log done
gzip -f $OUT/active_measurements.jsonl $OUT/active_table.json
rm -rf $OUT/home $OUT/loops.tgz
