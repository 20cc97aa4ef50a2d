"""Measure what each kernel pays on its first call at a new exact shape (`dispatcher.selection`, stage 5).

Per kernel and kind of problem (a decode step, a causal prefill): the first call at each of several
key lengths new to the process, minus the second call at that length. The median over the lengths
is the kernel's per-shape set-up, stored for the card (`models.probe_store`).

    python -m attn_dispatch.calibration.cold_shape --device cuda [--store] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterable
from datetime import datetime, timezone

import torch

from attn_dispatch.calibration.inputs import make_inputs
from attn_dispatch.calibration.timer import synchronize
from attn_dispatch.kernels import Kernel, Problem, kernel_from_name
from attn_dispatch.models.probe_store import save_cold_costs

# PyTorch's backends (cuDNN sets up per shape) and one of each portable family.
PROBE_KERNELS = ("sdpa_default", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "small_q[splits=16]",
                 "chunked[q=512,kv=4096]")
NEW_LENGTHS = 5  # new key lengths timed per kernel and kind
BACK_TO_BACK = 20  # calls timed back to back for a kernel's per-call floor
LENGTH_STEP = 13  # key lengths probed: base + 13 * i (+ a per-kernel offset), each new to every kernel


def probe_problems(dtype: str = "bfloat16") -> dict[str, Problem]:
    """The kinds measured: a Llama-3-8B-shaped decode step against ~4k keys, a causal prefill."""
    return {
        "decode": Problem(1, 32, 8, 1, 4096, 128, 128, dtype, device_type="cuda"),
        "prefill": Problem(1, 32, 32, 1024, 1024, 128, 128, dtype, causal=True, device_type="cuda"),
    }


def _timed_call(kernel: Kernel, problem: Problem, device: torch.device) -> tuple[float, float, float]:
    """(first call seconds, second call seconds, seconds per call of `BACK_TO_BACK` more) of
    `kernel` on new inputs of `problem` (the run the dispatcher's warm path calls)."""
    inputs = make_inputs(problem, device)
    args = (inputs.query, inputs.key, inputs.value, inputs.attn_mask, None, inputs.enable_gqa, problem)
    run = kernel.runner(problem)
    times = []
    for _ in range(2):
        synchronize(device)
        start = time.perf_counter()
        run(*args)
        synchronize(device)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(BACK_TO_BACK):
        run(*args)
    synchronize(device)
    return times[0], times[1], (time.perf_counter() - start) / BACK_TO_BACK


def measure(device: torch.device, kernels: Iterable[Kernel], problems: dict[str, Problem]) -> dict:
    """``{"seconds": {kernel: {kind: set-up seconds}}, "warm": {...}, "floor": {kernel: {kind: seconds
    per call back to back}}, "skipped": {...}}``."""
    seconds: dict[str, dict[str, float]] = {}
    warm: dict[str, dict[str, float]] = {}
    floor: dict[str, dict[str, float]] = {}
    skipped: dict[str, str] = {}
    for offset, kernel in enumerate(kernels):
        for kind, base in problems.items():
            why = kernel.reasons(base)
            if why:
                skipped[f"{kernel.name} {kind}"] = "; ".join(why)
                continue
            extras, warms, floors = [], [], []
            try:
                _timed_call(kernel, base, device)  # the kernel's own first use (libraries loading) is not per shape
                for i in range(1, NEW_LENGTHS + 1):
                    length = base.kv_len + LENGTH_STEP * (i + NEW_LENGTHS * offset)
                    shape = Problem(base.batch, base.q_heads, base.kv_heads,
                                    length if kind == "prefill" else base.q_len, length, base.head_dim,
                                    base.value_dim, base.dtype, causal=base.causal, device_type=base.device_type)
                    first, second, per_call = _timed_call(kernel, shape, device)
                    extras.append(max(0.0, first - second))
                    warms.append(second)
                    floors.append(per_call)
            except Exception as error:  # noqa: BLE001 - a kernel that fails here is reported, not fatal
                skipped[f"{kernel.name} {kind}"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
                continue
            seconds.setdefault(kernel.name, {})[kind] = statistics.median(extras)
            warm.setdefault(kernel.name, {})[kind] = statistics.median(warms)
            floor.setdefault(kernel.name, {})[kind] = min(floors)
    return {"seconds": seconds, "warm": warm, "floor": floor, "skipped": skipped}


def conditions(device: torch.device) -> dict:
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "new_lengths": NEW_LENGTHS, "shapes": {k: p.to_dict() for k, p in probe_problems().items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_dispatch.calibration.cold_shape", description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    parser.add_argument("--store", action="store_true", help="keep the costs for this card (the dispatcher reads them)")
    parser.add_argument("--json", help="also write the measurement (with warm times and conditions) here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}: this PyTorch has no usable CUDA/ROCm device", file=sys.stderr)
        return 2
    result = measure(device, [kernel_from_name(name) for name in PROBE_KERNELS], probe_problems(args.dtype))
    result["conditions"] = conditions(device)
    result["measured"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for name, by_kind in result["seconds"].items():
        cells = ", ".join(f"{kind} {s * 1e3:.3g} ms (warm {result['warm'][name][kind] * 1e3:.3g} ms, "
                          f"floor {result['floor'][name][kind] * 1e3:.3g} ms/call)"
                          for kind, s in by_kind.items())
        print(f"{name:<24} set-up per new shape: {cells}")
    for what, why in result["skipped"].items():
        print(f"{what:<24} not measured: {why}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    if args.store:
        from attn_dispatch.models.identity import DeviceIdentity

        path = save_cold_costs(DeviceIdentity.detect(device), result["seconds"], measured=result["measured"],
                               conditions=result["conditions"], floors=result["floor"])
        print(f"stored: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
