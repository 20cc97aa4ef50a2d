#!/usr/bin/env bash
# The H200 runs of issue 14 (loops users run), one stage per argument; everything lands in $OUT/loops.tgz.
#   setup       install the carried wheels (.whl: attn_dispatch built from this tree, optuna, diffusers, ...) into /tmp/site
#   table       refit the bundled H200 table with the quality guard and measured entries (on the host: see
#               bench/regenerate_h200_table.sh) and import it into $ATTN_DISPATCH_HOME
#   coldshape   measure per-shape set-up costs (python -m attn_dispatch.calibration.cold_shape) into $ATTN_DISPATCH_HOME
#   r5          bench/r5_overflow_cost.py (fp32 scores for half inputs: cost on decode and prefill)
#   kerneltests the kernel suite on the GPU (ATTN_DISPATCH_TEST_DEVICE=cuda)
#   training    bench/training_memory.py (Wan2.1-shaped forward+backward under 16 GiB, portable)
#   overhead    bench/dispatch_overhead.py (dispatcher vs F.sdpa, interleaved)
#   grid        bench/llm_grid.py: the 580-shape LLM grid, warm (PyTorch's default, every kernel, the table alone, as shipped, tuned)
#   heldout     the same on HELDOUT_SHAPES shapes off the grid (llm_grid --heldout, draw HELDOUT_SEED), then the tables (the one
#               before the `table` stage, the bundled one) scored on them off their timings (bench/table_cv.py --folds 0)
#   decode      bench/decode_loop.py: 32 layers per token, contexts 1k/8k/32k, batch 1 and 8, fresh processes
#               (DECODE_FLAGS="--same-process --passes 3": SDPA and the dispatcher in one process, alternating)
#   llm | llm-batch | llm-static | llm-interleaved | dit | portable | fp32   bench/e2e.py matrices (llm-interleaved:
#               sdpa and dispatch models in one process, generations alternating: warm against warm)
# Wheels: pip download into .whl (see /work/.library/device/README.md) plus `pip wheel --no-deps -w .whl .`.
set -u
OUT=${OUT:?set OUT to the output folder}
export ATTN_DISPATCH_HOME=${ATTN_DISPATCH_HOME:-$OUT/home} PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD  # $PWD for bench/; attn_dispatch itself comes from the wheel in /tmp/site
mkdir -p "$OUT/loops"
run() { echo "== $(date +%T) $*" | tee -a "$OUT/loops/log.txt" >&2; "$@" 2>&1 | tee -a "$OUT/loops/log.txt"; }
for stage in "$@"; do
  case $stage in
    setup) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ;;
    table) cp models/tables/nvidia-h200-140gb.json "$OUT/loops/table_before.json"
           PYTHON=python3 run timeout 240 bash bench/regenerate_h200_table.sh && cp models/tables/nvidia-h200-140gb.json "$OUT/loops/" \
             && run python3 -m attn_dispatch import models/tables/nvidia-h200-140gb.json ;;
    coldshape) run timeout 240 python3 -m attn_dispatch.calibration.cold_shape --device cuda --store --json "$OUT/loops/cold_shape.json"
               cp -r "$ATTN_DISPATCH_HOME/cold_shape" "$OUT/loops/cold_shape_store" 2>/dev/null ;;
    r5) run timeout 240 python3 -m bench.r5_overflow_cost --device cuda:0 --out "$OUT/loops/r5_overflow_cost.json" ;;
    kerneltests) ATTN_DISPATCH_TEST_DEVICE=cuda run timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -n 8 -p no:cacheprovider tests/kernels 2>&1 | tail -40 ;;
    training) run timeout 300 python3 -m bench.training_memory --device cuda --out "$OUT/loops/training_memory_h200.json" ;;
    overhead) run timeout 240 python3 -m bench.dispatch_overhead --device cuda --rounds 100 --calls 50 --out "$OUT/loops" ;;
    grid) run timeout ${GRID_TIMEOUT:-480} python3 -m bench.llm_grid --device cuda --budget-s ${GRID_BUDGET:-400} --out "$OUT/loops/llm_grid.jsonl" ;;
    heldout) run timeout ${HELDOUT_TIMEOUT:-330} python3 -m bench.llm_grid --device cuda --heldout ${HELDOUT_SHAPES:-300} \
               --seed ${HELDOUT_SEED:-0} --budget-s ${HELDOUT_BUDGET:-240} --out "$OUT/loops/heldout_grid.jsonl"
             run timeout 120 python3 -m bench.table_cv bench/results/h200_calibrations/run6_more_problems --folds 0 \
               --table $(ls "$OUT/loops/table_before.json" 2>/dev/null) models/tables/nvidia-h200-140gb.json \
               --score "$OUT/loops/heldout_grid.jsonl" ;;
    decode) run timeout 420 python3 -m bench.decode_loop --device cuda --contexts ${CONTEXTS:-1024,8192,32768} --batches ${BATCHES:-1,8} \
              --tokens ${TOKENS:-32} --layers 32 --repeats ${REPEATS:-1} ${DECODE_FLAGS:-} --out "$OUT/loops/decode_loop.jsonl" ;;
    llm|llm-batch|llm-static|llm-interleaved|dit|portable|fp32)
      run timeout ${STAGE_TIMEOUT:-540} python3 -m bench.e2e --matrix "$stage" --layers ${LAYERS:-8} --tokens ${TOKENS:-32} --repeats ${E2E_REPEATS:-2} \
        --timeout ${CONFIG_TIMEOUT:-240} --out "$OUT/loops/e2e.jsonl" ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
(cd "$OUT" && tar czf loops.tgz loops && rm -rf loops)
