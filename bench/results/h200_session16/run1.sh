#!/usr/bin/env bash
# Ran on 785b27f's tree plus llm_grid's --score-row-alignment option (run 2); the padding, that option and
# bench/diagnostics/score_alignment.py were removed in the next commit, after these runs measured them.
# Session 16, run 1 (H200): session 15's planned run 5 (padded score rows against the old layout, paired
# per round in one process; the kernel contract suite on the GPU), then the growing-cache decode loop
# with GPU decisions split by key-count alignment (6b844df), same command as session 15's run 3.
# Run from the repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log align; timeout 120 python3 -m bench.diagnostics.score_alignment --device cuda --rounds 9 --out $OUT/score_alignment.json > $OUT/score_alignment.txt 2>&1
log tests; ATTN_DISPATCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/kernels/test_contract.py tests/kernels/test_edge_inputs.py tests/kernels/test_workspace.py tests/kernels/test_score_rows.py > $OUT/kernel_tests.txt 2>&1
log decode; timeout 200 python3 -m bench.decode_loop --device cuda --contexts 1024,8192 --batches 1,8 --tokens 32 --layers 32 --repeats 1 --same-process --passes 3 --out $OUT/decode_loop.jsonl > $OUT/decode_loop.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
