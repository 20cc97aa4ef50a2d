#!/usr/bin/env bash
# Session 15, run 1 (H200): the paired grid with an A/A control at HEAD (session 14's floor fix and
# tie check: same command as session 14's run 3, so the two runs compare shape by shape), then the
# settled decode loop at B1 and B8 (the decode buckets whose entries tie now run a first-call check).
# Run from the repository root with OUT set, carrying .whl.
set -u
bash bench/h200_loops.sh setup >/dev/null 2>&1
export ATTN_DISPATCH_HOME=$OUT/home PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
log() { echo "== $(date +%T) $*" | tee -a $OUT/log.txt >&2; }
log build; python3 -m attn_dispatch build-fast-path 2>&1 | tail -1
log grid; timeout 420 python3 -m bench.llm_grid --device cuda --paths pytorch,pytorch_again,table,shipped --rounds 15 --budget-s 360 --out $OUT/grid_settled.jsonl > $OUT/grid_settled.txt 2>&1
log settled; for b in 1 8; do timeout 45 python3 -m bench.diagnostics.decode_settled --device cuda --passes 12 --batch $b >> $OUT/decode_settled.txt 2>&1; done
log done
rm -rf $OUT/home $OUT/loops.tgz
