#!/usr/bin/env bash
# Regenerate the bundled H200 table (models/tables/nvidia-h200-140gb.json) from run 6's recorded
# measurements and the LLM grid runs of sessions 6-8 (every grid kernel timed on 440-580 shapes each,
# `bench/grid_measurements.py`), session 9's held-out shapes and session 10's batch-4 grid: the same gate, fit, quality guard and measured entries as `attn-dispatch
# calibrate`'s last step; prints run 6's held-out quality before/after the guard and both tables'
# choices on the recorded benches. About a minute of CPU, no GPU work.
#
# RUN IT ON THE H200 HOST: the features of `sdpa_default` (its workspace, which follows the backend
# PyTorch picks) differ off the card, so a table fitted off the card is ranked with other
# features than on the card it serves (and the bundled table scored off the card picks cuDNN or
# flash over the default on 19 of 35 bench shapes where the card chose the default).
#   bash bench/regenerate_h200_table.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" -m bench.guard_rescore bench/results/h200_calibrations/run6_more_problems \
  --bench bench/results/h200_session3/bench_heldout.json.gz bench/results/h200_session3/bench_all.json.gz \
  --grid bench/results/h200_session6/run1_llm_grid.jsonl bench/results/h200_session7/run1_llm_grid.jsonl \
    bench/results/h200_session7/run5_llm_grid.jsonl bench/results/h200_session8/run3_llm_grid.jsonl \
    bench/results/h200_session9/run2_heldout_grid.jsonl bench/results/h200_session10/run1_llm_grid_b4.jsonl \
  --before models/tables/nvidia-h200-140gb.json --out models/tables/nvidia-h200-140gb.json \
  --note "bundled with attn-dispatch: measured by \`attn-dispatch calibrate --device cuda:0 --problems 320 --budget-minutes 7.4 --allow-lossy any\` on one H200, 2026-11-30 (254 problems measured before the deadline; bench/results/h200_calibrations/run6_more_problems_*; docs/RESULTS.md)" \
  --note "refit with the quality guard and measured entries (issue 15) by \`bash bench/regenerate_h200_table.sh\`" \
  --note "with the points of four \`python -m bench.llm_grid\` runs on the H200 (sessions 6-8, 2026-12-01/02: 1868 shape runs of the 580-shape LLM grid; bench/results/h200_session{6,7,8}/*llm_grid.jsonl)" \
  --note "with 300 shapes off the grid (session 9, \`llm_grid --heldout 300\`: batch 1-4, heads 40/8 and 28/4, head dim 96) and the grid at batch 4 up to 32k keys (session 10, \`llm_grid --batch 4 --max-kv 32768\`: 484 shapes); bench/results/h200_session9/run2_heldout_grid.jsonl, bench/results/h200_session10/run1_llm_grid_b4.jsonl"
