#!/usr/bin/env bash
# Session 15, run 2 (H200): the control for session 14's run 4 (active sampling): the same
# calibration at the same device time (`--budget-minutes 7.4`, all kernels, lossy conversions
# measured) with the random (Halton) sweep only: `--problems 400` is more than 7.4 minutes measure,
# and the sweep's prefix is run 4's 128 sweep problems (same seed). Scored off the card against run 4.
# Run from the repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log calibrate
( time timeout 560 python3 -m attn_dispatch calibrate --device cuda:0 --problems 400 --refine-rounds 0 \
    --budget-minutes 7.4 --allow-lossy any --quiet --results $OUT/random_measurements.jsonl \
    --out $OUT/random_table.json --summary-json $OUT/random_summary.json ) > $OUT/random.log 2>&1
log done
gzip -f $OUT/random_measurements.jsonl $OUT/random_table.json
rm -rf $OUT/home $OUT/loops.tgz
