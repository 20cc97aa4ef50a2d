#!/usr/bin/env bash
# Session 13, run 1 (H200): the fast path before (session 12's HEAD, .whl_old) and after (this tree,
# .whl) serving "forward" plans through ATen's SDPA directly, A/B in one session; then the paired
# grid and the settled decode loop. Run from the repository root with OUT set, carrying
# .whl and .whl_old.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_old .whl_old/*.whl .whl/optuna* .whl/platformdirs* .whl/colorlog* .whl/alembic* .whl/sqlalchemy* .whl/mako* >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
NEW=/tmp/site:$PWD OLD=/tmp/site_old:/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; (PYTHONPATH=$NEW python3 -m attn_dispatch build-fast-path & PYTHONPATH=$OLD python3 -m attn_dispatch build-fast-path & wait) 2>&1 | tail -2
GRID=bench/results/h200_session12/run2_grid_parity.jsonl
for round in 1 2; do
  for v in old new; do
    if [ $v = old ]; then P=$OLD; else P=$NEW; fi
    log kept $v $round; echo "## $v, round $round" >> $OUT/kept_default_overhead.txt
    PYTHONPATH=$P timeout 80 python3 -m bench.diagnostics.kept_default_overhead $GRID --shapes 16 --rounds 15 >> $OUT/kept_default_overhead.txt 2>&1
  done
done
for v in old new; do
  if [ $v = old ]; then P=$OLD; else P=$NEW; fi
  log settled $v; for b in 1 8; do echo "## $v" >> $OUT/decode_settled.txt
    PYTHONPATH=$P timeout 60 python3 -m bench.diagnostics.decode_settled --device cuda --passes 12 --batch $b >> $OUT/decode_settled.txt 2>&1; done
done
log grid; PYTHONPATH=$NEW timeout 230 python3 -m bench.llm_grid --device cuda --paths pytorch,shipped --rounds 15 --budget-s 200 --out $OUT/grid_parity.jsonl > $OUT/grid_parity.txt 2>&1
log done
rm -rf $OUT/home $OUT/loops.tgz
