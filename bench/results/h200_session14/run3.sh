#!/usr/bin/env bash
# Session 14, run 3 (H200): the paired grid with an A/A control, the table-only and the shipped
# dispatcher, each dispatcher called up to its plan's settle point before timing (llm_grid's
# `settle_calls`: warm = every path's steady state), rounds rotated by an even share of the paths.
# Run from the repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log grid; timeout 420 python3 -m bench.llm_grid --device cuda --paths pytorch,pytorch_again,table,shipped --rounds 15 --budget-s 360 --out $OUT/grid_settled.jsonl > $OUT/grid_settled.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
