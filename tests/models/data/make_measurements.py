"""Measure a small, real data set for the cost-model tests (tests/models/test_real_quality.py).

Run from the repository root, on a machine doing nothing else:

    python tests/models/data/make_measurements.py --device cpu --threads 1 --passes 3 [--problems 160]
    python tests/models/data/make_measurements.py --device cuda --problems 160 --name h200

Writes ``<name>_measurements.jsonl.gz`` (one `Measurement.to_dict()` per line) and
``<name>_measurements.conditions.json`` (machine, versions, threads, load averages, timer
settings, wall time) beside this file, or under ``--out``. Tests then run on recorded numbers.
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

from attn_dispatch.calibration.measure import measure
from attn_dispatch.calibration.timer import TimerSettings
from attn_dispatch.kernels import AccuracyPolicy, Problem, kernel_from_name
from attn_dispatch.models.identity import DeviceIdentity

HERE = Path(__file__).resolve().parent
PORTABLE = (
    "math", "chunked[q=128,kv=1024]", "chunked[q=512,kv=4096]",
    "small_q[splits=1]", "small_q[splits=8]", "small_q[splits=32]", "sdpa_flash", "sdpa_math", "sdpa_default",
)
KERNELS = {
    "cpu": PORTABLE + (
        "chunked[q=64,kv=512]",
        "convert[bf16->fp32]+sdpa_flash", "convert[bf16->fp32]+chunked[q=512,kv=4096]",
        "convert[fp16->fp32]+sdpa_flash", "convert[fp16->fp32]+small_q[splits=8]",
        "convert[fp16->fp32]+chunked[q=512,kv=4096]",
    ),
    "cuda": PORTABLE + (
        "chunked[q=2048,kv=16384]", "sdpa_efficient", "sdpa_cudnn", "convert[fp32->bf16]+sdpa_flash", "convert[fp32->bf16]+sdpa_cudnn",
    ),
}
# Lossy fp32->bf16 conversions are measured (calibration's numerics gate marks them inaccurate
# where they miss the fp32 tolerance).
POLICY = AccuracyPolicy.allowing("any")
# More repetitions than calibration's QUICK preset: this set is the ground truth of a test.
SETTINGS = TimerSettings(warmup=2, min_reps=5, max_reps=25, target_relative_iqr=0.05, budget_s=0.4)
# Keep points short: CPU at most 2^22 score elements (a 16 MiB fp32 score matrix); GPU 2^28
# (the portable kernels' eager launches make bigger points take seconds each).
MAX_SCORE_ELEMENTS = {"cpu": 1 << 22, "cuda": 1 << 28}
MAX_LOG2_KV = {"cpu": 13, "cuda": 16}
HEADS = {"cpu": (1, 2, 4, 8), "cuda": (4, 8, 16, 32)}
HEAD_DIMS = {"cpu": (32, 64, 128), "cuda": (64, 128, 256)}


def draw_problem(rng: random.Random, device: str) -> Problem:
    """One problem from a mix of decode, small-Q, prefill and cross-attention shapes."""
    while True:
        regime = rng.choice(("decode", "small_q", "prefill", "cross"))
        kv_len = int(2 ** rng.uniform(6, MAX_LOG2_KV[device]))
        q_len = {
            "decode": 1, "small_q": rng.choice((2, 4, 8, 16, 32, 64)),
            "prefill": kv_len, "cross": int(2 ** rng.uniform(6, MAX_LOG2_KV[device] - 3)),
        }[regime]
        q_heads = rng.choice(HEADS[device])
        kv_heads = q_heads // rng.choice([g for g in (1, 1, 2, 4) if q_heads % g == 0])
        batch = rng.choice((1, 1, 2, 4))
        head_dim = rng.choice(HEAD_DIMS[device])
        dtype = rng.choices(("float32", "bfloat16", "float16"), weights=(5, 3, 2) if device == "cpu" else (2, 4, 4))[0]
        causal = regime == "prefill" and rng.random() < 0.7
        mask_kind = "none" if causal else rng.choices(("none", "bool", "float"), weights=(75, 15, 10))[0]
        mask_shape = (1, 1, q_len, kv_len) if mask_kind != "none" else ()
        if batch * q_heads * q_len * kv_len <= MAX_SCORE_ELEMENTS[device]:
            return Problem(batch, q_heads, kv_heads, q_len, kv_len, head_dim, head_dim, dtype, causal,
                           mask_kind, mask_shape, device)


def warm_up(kernels, device: str) -> None:
    """Run every kernel once per dtype first: a kernel's first call in a process pays one-time
    costs (library set-up, thread pools, backend probes) that are not its speed."""
    for dtype in ("float32", "bfloat16", "float16"):
        for mask_kind, shape in (("none", ()), ("bool", (1, 1, 16, 256))):
            problem = Problem(1, 4, 2, 16, 256, 64, 64, dtype, False, mask_kind, shape, device)
            for kernel in kernels:
                if not kernel.reasons(problem):
                    measure(kernel, problem, device, settings=SETTINGS, measure_peak=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--problems", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    parser.add_argument("--name", default=None, help="file prefix (default: the device)")
    parser.add_argument("--out", default=str(HERE))
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="stop starting new problems after this many seconds (0: no limit)")
    parser.add_argument("--passes", type=int, default=1,
                        help="measure every kernel of a problem this many times, interleaved, and keep each "
                             "kernel's fastest median (robust to other processes' load)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    name, out = args.name or args.device, Path(args.out)
    rng = random.Random(args.seed)
    identity = DeviceIdentity.detect(args.device)
    kernels = [kernel_from_name(n, policy=POLICY) for n in KERNELS[args.device]]
    started, load_before = time.time(), os.getloadavg()
    warm_up(kernels, args.device)
    lines, done = [], 0
    for index in range(args.problems):
        if args.budget_s and time.time() - started > args.budget_s:
            print(f"time budget spent after {index} problems", flush=True)
            break
        problem = draw_problem(rng, args.device)
        runnable = [kernel for kernel in kernels if not kernel.reasons(problem)]
        best: dict = {}
        for _ in range(args.passes):
            for kernel in runnable:
                point = measure(kernel, problem, args.device, settings=SETTINGS, measure_peak=False,
                                device_key=identity.key, seed=index)
                if kernel.name not in best or point.median_s < best[kernel.name].median_s:
                    best[kernel.name] = point
        lines += [json.dumps(best[kernel.name].to_dict(), sort_keys=True) for kernel in runnable]
        done += 1
        print(f"{index + 1}/{args.problems} {time.time() - started:.0f}s {problem}", flush=True)
    with gzip.open(out / f"{name}_measurements.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    conditions = {
        "identity": identity.to_dict(), "python": platform.python_version(), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "problems": done, "seed": args.seed, "points": len(lines),
        "passes": args.passes,
        "kernels": list(KERNELS[args.device]), "timer": SETTINGS.__dict__,
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "wall_s": round(time.time() - started, 1), "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    (out / f"{name}_measurements.conditions.json").write_text(json.dumps(conditions, indent=2) + "\n")
    print(f"wrote {len(lines)} points to {out}")


if __name__ == "__main__":
    main()
