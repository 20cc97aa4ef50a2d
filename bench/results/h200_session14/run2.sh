#!/usr/bin/env bash
# Session 14, run 2 (H200): a fresh off-grid draw (300 shapes, seed 4: never fitted on), every path
# timed in batches of one size, to score a table refit on run 1's unbiased grid. Run from the
# repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log heldout; timeout 330 python3 -m bench.llm_grid --device cuda --heldout 300 --seed 4 --budget-s 280 --out $OUT/heldout_seed4.jsonl > $OUT/heldout_seed4.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
