#!/usr/bin/env bash
# Session 15, run 3 (H200): the seed-4 off-grid draw with an A/A control at HEAD (shipped = first-call
# check on tied buckets), then why PyTorch's default is slow at B4 40/8 heads (gqa_fold), then the
# growing-cache decode loop from a fresh process at 1k and 8k. Run from the repository root with OUT
# set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log heldout; timeout 260 python3 -m bench.llm_grid --device cuda --heldout 300 --seed 4 --paths pytorch,pytorch_again,table,shipped --rounds 15 --budget-s 220 --out $OUT/heldout_seed4.jsonl > $OUT/heldout_seed4.txt 2>&1
log fold; timeout 90 python3 -m bench.diagnostics.gqa_fold --device cuda --rounds 15 --out $OUT/gqa_fold.json > $OUT/gqa_fold.txt 2>&1
log decode; timeout 200 python3 -m bench.decode_loop --device cuda --contexts 1024,8192 --batches 1,8 --tokens 32 --layers 32 --repeats 1 --same-process --passes 3 --out $OUT/decode_loop.jsonl > $OUT/decode_loop.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
