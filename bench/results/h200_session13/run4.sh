#!/usr/bin/env bash
# Session 13, run 4 (H200): the paired grid with an A/A control (PyTorch's call timed again as a
# path of its own) beside the shipped dispatcher, with every path of a shape timed in batches of one size (llm_grid after run 3). Run from the
# repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log grid; timeout 260 python3 -m bench.llm_grid --device cuda --paths pytorch,pytorch_again,shipped --rounds 15 --budget-s 240 --out $OUT/grid_control.jsonl > $OUT/grid_control.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
