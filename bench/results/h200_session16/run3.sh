#!/usr/bin/env bash
# Session 16, run 3 (H200): the 580-shape LLM grid with every path (PyTorch's default, every kernel, the
# bundled table alone, as shipped, tuned), in the shuffled order cut at the budget (a fair sample): issue
# 15's table-only target on the grid. Run from the repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log grid; timeout 540 python3 -m bench.llm_grid --device cuda --budget-s 480 --out $OUT/grid_every_path.jsonl > $OUT/grid_every_path.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
