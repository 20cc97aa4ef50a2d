#!/usr/bin/env bash
# Ran on 785b27f's tree plus llm_grid's --score-row-alignment option (run 2); the padding, that option and
# bench/diagnostics/score_alignment.py were removed in the next commit, after these runs measured them.
# Session 16, run 2 (H200): the bundled table alone on a fresh off-grid draw never fitted on nor scored
# (seed 6, every path: issue 15's table-only target), with the shipped layout and with score rows padded
# to 8 (llm_grid --score-row-alignment 8); then the paired grid with an A/A control, padded (run 4's
# command otherwise, to compare shape by shape). Run from the repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log heldout; timeout 200 python3 -m bench.llm_grid --device cuda --heldout 300 --seed 6 --budget-s 170 --out $OUT/heldout_seed6.jsonl > $OUT/heldout_seed6.txt 2>&1
log heldout_padded; timeout 200 python3 -m bench.llm_grid --device cuda --heldout 300 --seed 6 --budget-s 170 --score-row-alignment 8 --out $OUT/heldout_seed6_padded.jsonl > $OUT/heldout_seed6_padded.txt 2>&1
log grid_padded; timeout 170 python3 -m bench.llm_grid --device cuda --paths pytorch,pytorch_again,table,shipped --rounds 15 --budget-s 140 --score-row-alignment 8 --out $OUT/grid_padded.jsonl > $OUT/grid_padded.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
