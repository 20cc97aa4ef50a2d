#!/usr/bin/env bash
# Session 15, run 4 (H200): the table refit against the prior's version 2 (fused kernels without key
# splitting stream each block's keys, in waves), on the card: a fresh off-grid draw never fitted on
# nor scored before (seed 5, every path timed in batches of one size: the table-only target of issue
# 15), then the paired grid with an A/A control (same command as run 1, to compare shape by shape).
# Run from the repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log heldout; timeout 300 python3 -m bench.llm_grid --device cuda --heldout 300 --seed 5 --budget-s 250 --out $OUT/heldout_seed5.jsonl > $OUT/heldout_seed5.txt 2>&1
log grid; timeout 230 python3 -m bench.llm_grid --device cuda --paths pytorch,pytorch_again,table,shipped --rounds 15 --budget-s 190 --out $OUT/grid_settled.jsonl > $OUT/grid_settled.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
