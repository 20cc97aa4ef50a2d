#!/usr/bin/env bash
# Session 15, run 5 (H200): padded score rows (kernels/_blocks.py SCORE_ROW_ALIGNMENT) against the old
# layout, paired per round in one process, on odd and aligned key counts; then the kernel contract
# suite on the GPU for the portable kernels (float64 references). Run from the repository root with
# OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log align; timeout 120 python3 -m bench.diagnostics.score_alignment --device cuda --rounds 9 --out $OUT/score_alignment.json > $OUT/score_alignment.txt 2>&1
log tests; ATTN_DISPATCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/kernels/test_contract.py tests/kernels/test_edge_inputs.py tests/kernels/test_workspace.py > $OUT/kernel_tests.txt 2>&1
log done
rm -rf $OUT/home
