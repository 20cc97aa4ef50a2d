#!/usr/bin/env bash
# The GPU runs behind docs/RESULTS.md, one stage per argument; everything lands in $OUT/stages.tgz.
#   setup        install the carried wheels (.whl: attn_dispatch built from this tree, optuna, diffusers, ...) into /tmp/site
#   table        refit the bundled H200 table (bench/regenerate_h200_table.sh, on the host) and import it into $ATTN_DISPATCH_HOME
#   coldshape    measure per-shape set-up costs (python -m attn_dispatch.calibration.cold_shape) into $ATTN_DISPATCH_HOME
#   kernels      bench/kernels.py: every kernel side by side on the kernel-library suites (KERNEL_SUITES, KERNEL_DTYPES)
#   kerneltests  the kernel suite on the GPU (ATTN_DISPATCH_TEST_DEVICE=cuda)
#   bench        `attn-dispatch bench --scenario all` and `--scenario heldout --allow-lossy fp32->bf16`, each with and
#                without --tune ($TUNINGS picks: "" and "--tune" by default), with the table in $ATTN_DISPATCH_HOME
#                (or the bundled one)
#   portable-bench  the same two scenarios with `--kernels portable --memory-budget 16GiB` (the gfx906 stand-in), the
#                portable table imported from $PORTABLE_TABLE (default: the recorded H200 portable calibration, run 5)
#   training     bench/training_memory.py (Wan2.1-shaped forward+backward under 16 GiB, portable)
#   overhead     bench/dispatch_overhead.py (dispatcher vs F.sdpa, interleaved)
#   settled      bench/decode_settled.py at batch 1 and 8 (warm parity: every plan PyTorch's own call)
#   grid         bench/llm_grid.py: the 580-shape LLM grid, warm (GRID_FLAGS, e.g. "--paths pytorch,pytorch_again,shipped --rounds 15")
#   tritongrid   the grid's shapes with >= 8k keys and Lq >= TRITON_MIN_Q (default 2), every kernel and the TRITON_CONFIGS
#                timed (`llm_grid --paths pytorch,kernels --extra-kernels`): the points a refit takes the Triton kernels from
#   refitcheck   refit the bundled table with tritongrid's points (EXTRA_GRIDS), import it, and time the same shapes with
#                it (shipped) against the bundled table (shipped_b), an A/A control and the Triton paths (run first: their
#                variants compiled, as in a process that ran them before)
#   heldout      the same on HELDOUT_SHAPES shapes off the grid (llm_grid --heldout, draw HELDOUT_SEED), then the tables (the one
#                before the `table` stage, the bundled one) scored on them off their timings (bench/table_cv.py --folds 0)
#   decode       bench/decode_loop.py: 32 layers per token, contexts 1k/8k/32k, batch 1 and 8
#                (DECODE_FLAGS="--same-process --passes 3": SDPA and the dispatcher in one process, alternating)
#   llm | llm-batch | llm-static | llm-interleaved | dit | portable | fp32   bench/e2e.py matrices (llm-interleaved:
#                sdpa and dispatch models in one process, generations alternating: warm against warm)
# Wheels: pip download into .whl (see /work/.library/device/README.md) plus `pip wheel --no-deps -w .whl .`.
set -u -o pipefail  # `run`'s status is the command's, not tee's
OUT=${OUT:?set OUT to the output folder}
export ATTN_DISPATCH_HOME=${ATTN_DISPATCH_HOME:-$OUT/home} PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD  # $PWD for bench/; attn_dispatch itself comes from the wheel in /tmp/site
mkdir -p "$OUT/stages"
TRITON_CONFIGS=${TRITON_CONFIGS:-"triton_flash[bm=128,bn=128,w=8,s=3];triton_flash[bm=64,bn=64,w=4,s=3];triton_decode[splits=32,bn=128,w=4,s=2];triton_decode[splits=8,bn=64,w=4,s=2]"}
TRITON_SHAPES=(--min-kv 8192 --min-q "${TRITON_MIN_Q:-2}" --seed 21 --extra-kernels "$TRITON_CONFIGS")
LOG="$OUT/stages/log.txt"
run() { echo "== $(date +%T) $*" | tee -a "$LOG" >&2; "$@" 2>&1 | tee -a "$LOG"; }
# `attn-dispatch bench` on both scenarios, with and without tuning:
#   bench_scenarios FILE_PREFIX "HELDOUT-ONLY OPTIONS" [options of both...]
bench_scenarios() {
  local prefix=$1 heldout_only=$2; shift 2
  for tune in ${TUNINGS-"" --tune}; do
    local suffix=${tune:+_tuned}
    run timeout 150 python3 -m attn_dispatch bench --scenario all $tune "$@" \
      --json "$OUT/stages/${prefix}all$suffix.json" --md "$OUT/stages/${prefix}all$suffix.md" > /dev/null
    run timeout 120 python3 -m attn_dispatch bench --scenario heldout $tune $heldout_only "$@" \
      --json "$OUT/stages/${prefix}heldout$suffix.json" --md "$OUT/stages/${prefix}heldout$suffix.md" > /dev/null
  done
}
for stage in "$@"; do
  case $stage in
    setup) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ;;
    table) cp models/tables/nvidia-h200-140gb.json "$OUT/stages/table_before.json"
           PYTHON=python3 run timeout 240 bash bench/regenerate_h200_table.sh && cp models/tables/nvidia-h200-140gb.json "$OUT/stages/" \
             && run python3 -m attn_dispatch import models/tables/nvidia-h200-140gb.json ;;
    coldshape) run timeout 240 python3 -m attn_dispatch.calibration.cold_shape --device cuda --store --json "$OUT/stages/cold_shape.json"
               cp -r "$ATTN_DISPATCH_HOME/cold_shape" "$OUT/stages/cold_shape_store" 2>/dev/null ;;
    kernels) run timeout 300 python3 -m bench.kernels --device cuda:0 --suites ${KERNEL_SUITES:-decode} --dtypes ${KERNEL_DTYPES:-float16} \
               --out "$OUT/stages/kernels.jsonl" --md "$OUT/stages/kernels.md" ;;
    kerneltests) ATTN_DISPATCH_TEST_DEVICE=cuda run timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -n 8 -p no:cacheprovider tests/kernels 2>&1 | tail -40 ;;
    bench) bench_scenarios bench_ "--allow-lossy fp32->bf16" ;;
    portable-bench)
      portable_home=$(mktemp -d)
      zcat -f "${PORTABLE_TABLE:-bench/results/h200_calibrations/run5_portable_16gib_table.json.gz}" > "$portable_home/table.json"
      ATTN_DISPATCH_HOME=$portable_home run python3 -m attn_dispatch import "$portable_home/table.json" > /dev/null
      ATTN_DISPATCH_HOME=$portable_home bench_scenarios portable_bench_ "--shape-budget 1.5" --kernels portable --memory-budget 16GiB ;;
    training) run timeout 300 python3 -m bench.training_memory --device cuda --out "$OUT/stages/training_memory_h200.json" ;;
    overhead) run timeout 240 python3 -m bench.dispatch_overhead --device cuda --rounds 100 --calls 50 --out "$OUT/stages" ;;
    settled) for batch in 1 8; do run timeout 200 python3 -m bench.decode_settled --device cuda --passes 12 --batch $batch; done ;;
    grid) run timeout ${GRID_TIMEOUT:-480} python3 -m bench.llm_grid --device cuda --budget-s ${GRID_BUDGET:-400} ${GRID_FLAGS:-} \
            --out "$OUT/stages/llm_grid.jsonl" ;;
    tritongrid) run timeout ${GRID_TIMEOUT:-480} python3 -m bench.llm_grid --device cuda --budget-s ${GRID_BUDGET:-400} --rounds 3 \
                  --paths pytorch,kernels "${TRITON_SHAPES[@]}" --out "$OUT/stages/grid_triton.jsonl" ;;
    refitcheck) cp models/tables/nvidia-h200-140gb.json "$OUT/stages/table_before.json"
                EXTRA_GRIDS="$OUT/stages/grid_triton.jsonl" PYTHON=python3 run timeout 240 bash bench/regenerate_h200_table.sh \
                  && cp models/tables/nvidia-h200-140gb.json "$OUT/stages/table_refit.json" || continue
                bundled_home=$(mktemp -d)
                run python3 -m attn_dispatch import models/tables/nvidia-h200-140gb.json > /dev/null
                run timeout ${GRID_TIMEOUT:-480} python3 -m bench.llm_grid --device cuda --budget-s ${GRID_BUDGET:-400} --rounds 7 \
                  --paths pytorch,pytorch_again,shipped,shipped_b,triton --home-b "$bundled_home" "${TRITON_SHAPES[@]}" \
                  --out "$OUT/stages/grid_refit.jsonl" ;;
    heldout) run timeout ${HELDOUT_TIMEOUT:-330} python3 -m bench.llm_grid --device cuda --heldout ${HELDOUT_SHAPES:-300} \
               --seed ${HELDOUT_SEED:-0} --budget-s ${HELDOUT_BUDGET:-240} --out "$OUT/stages/heldout_grid.jsonl"
             run timeout 120 python3 -m bench.table_cv bench/results/h200_calibrations/run6_more_problems --folds 0 \
               --table $(ls "$OUT/stages/table_before.json" 2>/dev/null) models/tables/nvidia-h200-140gb.json \
               --score "$OUT/stages/heldout_grid.jsonl" ;;
    decode) run timeout 420 python3 -m bench.decode_loop --device cuda --contexts ${CONTEXTS:-1024,8192,32768} --batches ${BATCHES:-1,8} \
              --tokens ${TOKENS:-32} --layers 32 --repeats ${REPEATS:-1} ${DECODE_FLAGS:-} --out "$OUT/stages/decode_loop.jsonl" ;;
    llm|llm-batch|llm-static|llm-interleaved|dit|portable|fp32)
      run timeout ${STAGE_TIMEOUT:-540} python3 -m bench.e2e --matrix "$stage" --layers ${LAYERS:-8} --tokens ${TOKENS:-32} --repeats ${E2E_REPEATS:-2} \
        --timeout ${CONFIG_TIMEOUT:-240} --out "$OUT/stages/e2e.jsonl" ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
(cd "$OUT" && tar czf stages.tgz stages && rm -rf stages)
