"""Forward+backward of one attention call through a portable dispatcher under a memory budget:
peak memory, time and gradient error (issue 16's targets).

    python -m bench.training_memory --device cpu --out bench/results/training_memory_cpu.json
    python -m bench.training_memory --device cuda --out bench/results/training_memory_h200.json

CPU (gfx906-like): 1x8x4096x64 fp32 causal, 64 MiB budget, PyTorch held to its math backend;
peak RSS growth (VmHWM reset through /proc/self/clear_refs) must be <= 300 MiB, gradients close
to PyTorch's math backend's (``--compare-math`` also measures that backend's own growth).
CUDA (Wan2.1-shaped): 1x40x32760x128 bf16 non-causal, 16 GiB budget: allocator peak <= 16 GiB,
forward+backward time <= 3.5x the same chunked kernel's forward alone, gradient relative L2
error against float64 (``--check-heads`` heads, computed by the reference) <= 2x the forward's
tolerance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher.decision import parse_memory_size
from attn_dispatch.dispatcher.sdpa_context import respect_sdpa_kernel
from attn_dispatch.kernels import TOLERANCES, kernel_from_name, reference_attention, relative_errors
from attn_dispatch.kernels.base import training_bytes

SCENARIOS = {
    "cpu": {"batch": 1, "heads": 8, "length": 4096, "head_dim": 64, "dtype": "float32", "causal": True,
            "budget": "64MiB", "peak_target": 300 * 2**20, "time_ratio_target": None},
    "cuda": {"batch": 1, "heads": 40, "length": 32760, "head_dim": 128, "dtype": "bfloat16", "causal": False,
             "budget": "16GiB", "peak_target": 16 * 2**30, "time_ratio_target": 3.5},
}
GRADIENT_TOLERANCE_FACTOR = 2  # gradients within 2x the forward's tolerance (issue 16)


class PeakMemory:
    """Extra peak memory of a block: CUDA allocator peak, or the process's peak RSS on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.extra = 0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            self._base = _status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.extra = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self.extra = _status_kib("VmHWM") * 1024 - self._base


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device, reps: int) -> float:
    samples = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _inputs(scenario: dict, device: torch.device):
    generator = torch.Generator(device=device).manual_seed(0)
    shape = (scenario["batch"], scenario["heads"], scenario["length"], scenario["head_dim"])
    dtype = getattr(torch, scenario["dtype"])
    leaves = [torch.randn(shape, generator=generator, device=device, dtype=dtype).requires_grad_(True) for _ in range(3)]
    grad_out = torch.randn(shape, generator=generator, device=device, dtype=dtype)
    return leaves, grad_out


def _train_step(attention, leaves, grad_out, causal: bool):
    return torch.autograd.grad(attention(*leaves, is_causal=causal), leaves, grad_out)


def run(device: torch.device, scenario: dict, *, compare_math: bool, check_heads: int, reps: int) -> dict:
    causal = scenario["causal"]
    leaves, grad_out = _inputs(scenario, device)
    dispatcher = Dispatcher(kernels="portable", memory_budget=scenario["budget"])
    respect_sdpa_kernel(False)  # PyTorch is held to math below as on gfx906; the dispatcher must still decide
    with sdpa_kernel([SDPBackend.MATH]):  # what PyTorch has on gfx906
        decision = dispatcher.explain(*leaves, is_causal=causal)
        with PeakMemory(device) as peak:
            grads = _train_step(dispatcher, leaves, grad_out, causal)
        train_s = _timed(lambda: _train_step(dispatcher, leaves, grad_out, causal), device, reps)
        kernel = kernel_from_name(decision.kernel)
        with torch.no_grad():
            forward_s = _timed(lambda: kernel(*leaves, is_causal=causal), device, reps)
    result = {
        "scenario": {**scenario, "device": str(device), "torch": torch.__version__},
        "kernel": decision.kernel, "route": decision.route, "notes": list(decision.notes),
        "stats": dispatcher.stats(),
        "peak_extra_bytes": peak.extra, "peak_target_bytes": scenario["peak_target"],
        "bound_bytes": training_bytes(kernel, decision.problem),
        "budget_bytes": parse_memory_size(scenario["budget"]),
        "forward_backward_s": train_s, "forward_s": forward_s, "time_ratio": train_s / forward_s,
        "time_ratio_target": scenario["time_ratio_target"],
    }
    if compare_math:
        with sdpa_kernel([SDPBackend.MATH]), PeakMemory(device) as math_peak:
            expected = _train_step(F.scaled_dot_product_attention, leaves, grad_out, causal)
        result["pytorch_math_peak_extra_bytes"] = math_peak.extra
        result["relative_l2_vs_pytorch_math"] = [relative_errors(g, e)[0] for g, e in zip(grads, expected, strict=True)]
        del expected
    if check_heads:
        result.update(_float64_check(leaves, grad_out, grads, causal, check_heads, scenario["dtype"]))
    return result


def _float64_check(leaves, grad_out, grads, causal: bool, heads: int, dtype: str) -> dict:
    """Gradient errors on the first `heads` heads (heads are independent) against float64."""
    subset = [leaf.detach()[:, :heads].double().requires_grad_(True) for leaf in leaves]
    expected = torch.autograd.grad(reference_attention(*subset, is_causal=causal), subset, grad_out[:, :heads].double())
    errors = [relative_errors(g[:, :heads], e)[0] for g, e in zip(grads, expected, strict=True)]
    limit = TOLERANCES[dtype].relative_l2 * GRADIENT_TOLERANCE_FACTOR
    return {"checked_heads": heads, "gradient_relative_l2_vs_float64": errors, "gradient_relative_l2_limit": limit}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=sorted(SCENARIOS))
    parser.add_argument("--scenario", default=None, choices=sorted(SCENARIOS), help="default: the device's")
    parser.add_argument("--length", type=int, default=None, help="override the scenario's tokens (a quick try)")
    parser.add_argument("--heads", type=int, default=None, help="override the scenario's heads")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--compare-math", action="store_true", help="also run PyTorch's math backend (O(L*S) memory)")
    parser.add_argument("--check-heads", type=int, default=1, help="heads checked against float64 (0: none)")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    scenario = dict(SCENARIOS[args.scenario or args.device])
    scenario.update({name: value for name, value in (("length", args.length), ("heads", args.heads)) if value})
    result = run(torch.device(args.device), scenario, compare_math=args.compare_math, check_heads=args.check_heads,
                 reps=args.reps)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
