"""Issue 33: does calibrate's crossover refinement round pay? Fit a table the way calibrate does on a
recorded H200 calibration (bench.table_cv.fitted_table) with and without the points of the problems the
refinement round measured (records with extra.phase == "refine*"), and, as a control, without the same
number of random sweep problems; score each table's first choice on recorded grids and draws; "model:" rows
force the model's verdict.

    python -m bench.refine_ablation bench/results/h200_calibrations/run4_fixed_timer [CONTROLS [FIT_SEED]]
"""

from __future__ import annotations

import gzip
import json
import random
import sys
import time
from dataclasses import replace

from attn_dispatch.kernels.assumed_backends import assume_backends_available
from attn_dispatch.models.measured import DEFAULT_KERNEL
from attn_dispatch.models.quality import Guard
from bench.grid_measurements import grid_times
from bench.offline_card import card_line, offline_card_for
from bench.table_cv import first_choice, fitted_table, geomean, read_calibration

R = "bench/results/"
FILES = {"grid14": R + "h200_session14/run1_llm_grid_all_paths.jsonl.gz",
         "grid16": R + "h200_session16/run3_grid_every_path.jsonl.gz",
         "seed4": R + "h200_session14/run2_heldout_seed4.jsonl.gz",
         "seed5": R + "h200_session15/run4_heldout_seed5.jsonl.gz",
         "seed6": R + "h200_session16/run2_heldout_seed6.jsonl.gz"}

run = sys.argv[1]
controls = int(sys.argv[2]) if len(sys.argv) > 2 else 5
fit_seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
identity, points = read_calibration(run)
phases = {}
with gzip.open(f"{run}_measurements.jsonl.gz", "rt") as handle:
    for m, line in zip(points, handle, strict=True):
        phase = json.loads(line).get("extra", {}).get("phase")
        if phase and phase != "tune":
            phases.setdefault(m.problem, set()).add(phase)
refined = {p for p, s in phases.items() if any(x.startswith("refine") for x in s)}
sweep = sorted({p for p, s in phases.items() if "sweep" in s} - refined, key=lambda p: p.key())
print(f"{run}: {len(points)} points, {len({m.problem for m in points})} problems, {len(refined)} refined, {len(sweep)} sweep")
variants = {"full": set(), "no_refine": refined}
for seed in range(controls):
    variants[f"control{seed}"] = set(random.Random(seed).sample(sweep, len(refined)))
shapes = {name: grid_times(path) for name, path in FILES.items()}
card = offline_card_for(identity)
print(card_line(card))
picks = {}
with assume_backends_available(card):
    for name, dropped in variants.items():
        started = time.perf_counter()
        table = fitted_table([m for m in points if m.problem not in dropped], identity, seed=fit_seed)
        print(f"  fit {name}: {time.perf_counter() - started:.0f} s, verdict {table.verdict}: {table.guard.reason}", flush=True)
        for label, t in (("", table), ("model:", replace(table, guard=Guard("table", "forced")))):
            picks[label + name] = {f: [times[first_choice(t, p, times)] for p, times in s] for f, s in shapes.items()}
print("variant    " + "  ".join(f"{f:>26}" for f in FILES) + "   (over default / vs fastest / >3% slower,faster than full)")
for name in picks:
    cells = []
    for f, s in shapes.items():
        got, full = picks[name][f], picks[name.split(":")[0] + ":full" if ":" in name else "full"][f]
        over_default = 1 / geomean([t / times[DEFAULT_KERNEL] for t, (_, times) in zip(got, s, strict=True)])
        to_fastest = geomean([t / min(times.values()) for t, (_, times) in zip(got, s, strict=True)])
        slower = sum(t / u > 1.03 for t, u in zip(got, full, strict=True))
        faster = sum(u / t > 1.03 for t, u in zip(got, full, strict=True))
        cells.append(f"{over_default:.4f}/{to_fastest:.4f}/{slower},{faster}")
    print(f"{name:16} " + "  ".join(f"{c:>26}" for c in cells))
