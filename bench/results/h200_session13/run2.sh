#!/usr/bin/env bash
# Session 13, run 2 (H200): the paired grid with the fast path before (.whl_old) and after (.whl),
# one after the other in one session; then transformers with 32 layers, sdpa and dispatch models
# alternating in one process (llm-interleaved). Run from the repository root with OUT set, carrying
# .whl and .whl_old.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_old .whl_old/*.whl .whl/optuna* .whl/platformdirs* .whl/colorlog* .whl/alembic* .whl/sqlalchemy* .whl/mako* >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
NEW=/tmp/site:$PWD OLD=/tmp/site_old:/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; (PYTHONPATH=$NEW python3 -m attn_dispatch build-fast-path & PYTHONPATH=$OLD python3 -m attn_dispatch build-fast-path & wait) 2>&1 | tail -2
for v in old new; do
  if [ $v = old ]; then P=$OLD; else P=$NEW; fi
  log grid $v; PYTHONPATH=$P timeout 130 python3 -m bench.llm_grid --device cuda --paths pytorch,shipped --rounds 15 --budget-s 110 --out $OUT/grid_$v.jsonl > $OUT/grid_$v.txt 2>&1
done
log e2e; STAGE_TIMEOUT=250 CONFIG_TIMEOUT=100 E2E_REPEATS=4 LAYERS=32 bash bench/h200_loops.sh llm-interleaved > /dev/null 2>&1
log done
rm -rf $OUT/home
