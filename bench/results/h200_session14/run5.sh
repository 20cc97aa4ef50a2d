#!/usr/bin/env bash
# Session 14, run 5 (H200): the paired grid's shapes up to 2k keys (where run 3's cold-shape picks
# lost) with an A/A control and the shipped dispatcher, after a swap the table calls a tie settles
# (`cold_shape.TIED_LOSS_SHARE`); dispatchers called to their settle point before timing. Run from
# the repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log grid; timeout 150 python3 -m bench.llm_grid --device cuda --paths pytorch,pytorch_again,shipped --rounds 15 --max-kv 2048 --budget-s 120 --out $OUT/grid_settled_2k.jsonl > $OUT/grid_settled_2k.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
