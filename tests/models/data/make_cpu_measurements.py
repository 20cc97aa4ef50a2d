"""Measure a small, real CPU data set for the cost-model tests (tests/models/test_quality.py).

Run from the repository root:

    python tests/models/data/make_cpu_measurements.py [--problems 160] [--seed 0]

Writes ``cpu_measurements.jsonl.gz`` (one `Measurement.to_dict()` per line) and
``cpu_measurements.conditions.json`` (machine, torch version, threads, load average, timer
settings, wall time) beside this file. The test then runs deterministically on recorded numbers.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import time
from pathlib import Path

import torch

from calibration.measure import measure
from calibration.timer import TimerSettings
from kernels import Problem, kernel_from_name
from models.identity import DeviceIdentity

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "cpu_measurements.jsonl.gz"
CONDITIONS = HERE / "cpu_measurements.conditions.json"

KERNELS = (
    "math", "chunked[q=64,kv=512]", "chunked[q=128,kv=1024]", "chunked[q=512,kv=4096]",
    "small_q[splits=1]", "small_q[splits=8]", "small_q[splits=32]",
    "sdpa_flash", "sdpa_math", "sdpa_default",
    "convert[bf16->fp32]+sdpa_flash", "convert[bf16->fp32]+chunked[q=512,kv=4096]",
    "convert[fp16->fp32]+sdpa_flash", "convert[fp16->fp32]+small_q[splits=8]",
    "convert[fp16->fp32]+chunked[q=512,kv=4096]",
)
# More repetitions than calibration's QUICK preset: this set is the ground truth of a test.
SETTINGS = TimerSettings(warmup=2, min_reps=5, max_reps=25, target_relative_iqr=0.05, budget_s=0.5)
# Keep every point CPU-sized: at most 2^22 score elements (a 16 MiB fp32 score matrix).
MAX_SCORE_ELEMENTS = 1 << 22


def draw_problem(rng: random.Random) -> Problem:
    """One problem from a mix of decode, small-Q, prefill and cross-attention shapes."""
    while True:
        regime = rng.choice(("decode", "small_q", "prefill", "cross"))
        kv_len = int(2 ** rng.uniform(6, 13))
        q_len = {
            "decode": 1, "small_q": rng.choice((2, 4, 8, 16, 32, 64)),
            "prefill": kv_len, "cross": int(2 ** rng.uniform(6, 10)),
        }[regime]
        kv_heads = rng.choice((1, 2, 4, 8))
        q_heads = kv_heads * rng.choice((1, 1, 2, 4))
        batch = rng.choice((1, 1, 2, 4))
        head_dim = rng.choice((32, 64, 128))
        dtype = rng.choices(("float32", "bfloat16", "float16"), weights=(5, 3, 2))[0]
        causal = regime == "prefill" and rng.random() < 0.7
        mask_kind = rng.choices(("none", "bool", "float"), weights=(75, 15, 10))[0]
        mask_shape = (1, 1, q_len, kv_len) if mask_kind != "none" else ()
        if batch * q_heads * q_len * kv_len <= MAX_SCORE_ELEMENTS:
            return Problem(batch, q_heads, kv_heads, q_len, kv_len, head_dim, head_dim, dtype, causal,
                           mask_kind, mask_shape, "cpu")


def warm_up(kernels) -> None:
    """Run every kernel once per dtype first: a kernel's first call in a process pays one-time
    costs (oneDNN set-up, thread pools, backend probes) that are not its speed."""
    for dtype in ("float32", "bfloat16", "float16"):
        for mask_kind, shape in (("none", ()), ("bool", (1, 1, 16, 256))):
            problem = Problem(1, 4, 2, 16, 256, 64, 64, dtype, False, mask_kind, shape, "cpu")
            for kernel in kernels:
                if not kernel.reasons(problem):
                    measure(kernel, problem, "cpu", settings=SETTINGS, measure_peak=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    identity = DeviceIdentity.detect("cpu")
    kernels = [kernel_from_name(name) for name in KERNELS]
    started, load_before = time.time(), os.getloadavg()
    warm_up(kernels)
    lines = []
    for index in range(args.problems):
        problem = draw_problem(rng)
        for kernel in kernels:
            if kernel.reasons(problem):
                continue
            point = measure(kernel, problem, "cpu", settings=SETTINGS, measure_peak=False,
                            device_key=identity.key, seed=index)
            lines.append(json.dumps(point.to_dict(), sort_keys=True))
        print(f"{index + 1}/{args.problems} {problem}", flush=True)
    with gzip.open(OUTPUT, "wt", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    conditions = {
        "identity": identity.to_dict(), "python": platform.python_version(), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "problems": args.problems, "seed": args.seed,
        "points": len(lines), "kernels": list(KERNELS), "timer": SETTINGS.__dict__,
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "wall_s": round(time.time() - started, 1), "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "note": "other processes shared this 2-core machine (see load averages): timings are noisy",
    }
    CONDITIONS.write_text(json.dumps(conditions, indent=2) + "\n")
    print(f"wrote {len(lines)} points to {OUTPUT}")


if __name__ == "__main__":
    main()
