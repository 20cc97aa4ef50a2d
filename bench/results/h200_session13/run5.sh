#!/usr/bin/env bash
# Session 13, run 5 (H200): HEAD's fast path (warnings kept until a served call succeeds) on the
# kept-default shapes and the settled decode loop, to check runs 1-4's numbers hold for it. Run from
# the repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log kept; timeout 60 python3 -m bench.diagnostics.kept_default_overhead bench/results/h200_session12/run2_grid_parity.jsonl --shapes 16 --rounds 15 > $OUT/kept_default_overhead.txt 2>&1
log settled; for b in 1 8; do timeout 45 python3 -m bench.diagnostics.decode_settled --device cuda --passes 12 --batch $b >> $OUT/decode_settled.txt 2>&1; done
log done
rm -rf $OUT/home $OUT/loops.tgz
