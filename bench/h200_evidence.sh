#!/usr/bin/env bash
# The H200 evidence runs of docs/RESULTS.md, one stage per argument (each writes under $OUT):
#   bench/h200_evidence.sh kernels    small_q stage variants + kernel table on fp16 decode
#   bench/h200_evidence.sh portable   portable calibration under 16 GiB, then bench all + heldout in that mode
#   bench/h200_evidence.sh portable-bench   the benches alone (with and without --tune), portable table in $PORTABLE_HOME
#                                      or imported from $PORTABLE_TABLE (e.g. bench/results/h200_calibrations/run5_portable_16gib_table.json.gz)
#   bench/h200_evidence.sh full       bench all + heldout with the H200 table in $FULL_HOME, with and without --tune
# $TUNINGS ("" and "--tune" by default) picks the bench variants, e.g. TUNINGS=--tune for the tuned ones alone.
# Needs torch with CUDA, and optuna, platformdirs and attn_dispatch itself on PYTHONPATH: we carry them as
# .gpu_site/ (`pip install --no-deps --target .gpu_site optuna platformdirs colorlog alembic sqlalchemy mako .`).
set -u
OUT=${OUT:?set OUT to the output folder}
export PYTHONPATH=$PWD/.gpu_site:$PWD${PYTHONPATH:+:$PYTHONPATH}  # $PWD for bench/
run() { echo "== $(date +%T) $*" >&2; "$@"; }
for stage in "$@"; do
  case $stage in
    kernels)
      run timeout 45 python -m bench.small_q_variants --device cuda:0 --q-lens 1,4 --kv-lens 131072 --out "$OUT/small_q_variants.json" > "$OUT/small_q_variants.log" 2>&1
      run timeout 100 python -m bench.kernels --device cuda:0 --suites decode --dtypes float16 --out "$OUT/kernels_decode.jsonl" --md "$OUT/kernels_decode.md" > /dev/null 2>&1
      ;;
    portable)
      export ATTN_DISPATCH_HOME=/tmp/home_portable
      run timeout 180 python -m attn_dispatch calibrate --device cuda:0 --kernels portable --memory-budget 16GiB --budget-minutes 2 --allow-lossy any \
        --results "$OUT/portable_measurements.jsonl" --out "$OUT/portable_table.json" --summary-json "$OUT/portable_calib.json" --quiet > "$OUT/portable_calib.log" 2>&1
      gzip -f "$OUT/portable_measurements.jsonl"
      ;&
    portable-bench)  # the portable table from $PORTABLE_HOME (or the portable stage's), or $PORTABLE_TABLE (.json[.gz]) imported
      export ATTN_DISPATCH_HOME=${PORTABLE_HOME:-/tmp/home_portable}
      if [ -n "${PORTABLE_TABLE:-}" ]; then
        zcat -f "$PORTABLE_TABLE" > /tmp/portable_table.json && run python -m attn_dispatch import /tmp/portable_table.json > /dev/null
      fi
      for tune in ${TUNINGS-"" --tune}; do
        suffix=${tune:+_tuned}
        run timeout 150 python -m attn_dispatch bench --scenario all $tune --kernels portable --memory-budget 16GiB --json "$OUT/portable_bench_all$suffix.json" --md "$OUT/portable_bench_all$suffix.md" > /dev/null 2>> "$OUT/portable_bench.log"
        run timeout 100 python -m attn_dispatch bench --scenario heldout $tune --kernels portable --memory-budget 16GiB --shape-budget 1.5 --json "$OUT/portable_bench_heldout$suffix.json" --md "$OUT/portable_bench_heldout$suffix.md" > /dev/null 2>> "$OUT/portable_bench.log"
      done
      ;;
    full)  # the H200 table from $FULL_HOME (default: $ATTN_DISPATCH_HOME)
      export ATTN_DISPATCH_HOME=${FULL_HOME:-${ATTN_DISPATCH_HOME:-/tmp/home_full}}
      for tune in ${TUNINGS-"" --tune}; do
        suffix=${tune:+_tuned}
        run timeout 120 python -m attn_dispatch bench --scenario all $tune --json "$OUT/bench_all$suffix.json" --md "$OUT/bench_all$suffix.md" > /dev/null 2>> "$OUT/bench_full.log"
        run timeout 120 python -m attn_dispatch bench --scenario heldout $tune --allow-lossy 'fp32->bf16' --json "$OUT/bench_heldout$suffix.json" --md "$OUT/bench_heldout$suffix.md" > /dev/null 2>> "$OUT/bench_full.log"
      done
      ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
# The device tool brings back at most 8 files: pack everything into one archive.
(cd "$OUT" && tar czf evidence.tgz --exclude 'evidence*.tgz' -- * && find . -type f ! -name evidence.tgz -delete)
