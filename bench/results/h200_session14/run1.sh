#!/usr/bin/env bash
# Session 14, run 1 (H200): the 580-shape grid with every path (PyTorch's default, every kernel,
# the table-only, shipped and tuned dispatchers), every path of a shape timed in batches of one
# size (llm_grid since session 13 run 4): the oracle and the table's columns without the per-path
# batch bias. Run from the repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log grid; timeout 530 python3 -m bench.llm_grid --device cuda --budget-s 480 --out $OUT/llm_grid_all_paths.jsonl > $OUT/llm_grid_all_paths.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
