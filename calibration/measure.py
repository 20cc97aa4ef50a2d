"""Measure one kernel on one problem: support check, memory check, numerics gate, peak memory
and a trusted timing. Never raises for a kernel's failure: OOM is recorded as infeasible, any
other error as failed, and the allocator is emptied afterwards."""

from __future__ import annotations

import time

import torch

from calibration.inputs import AttentionInputs, make_inputs, rotation_count
from calibration.peak_memory import measure_peak_bytes
from calibration.timer import TimerSettings, time_repetitions
from kernels.base import Kernel
from kernels.problem import Problem
from kernels.reference import reference_attention, relative_errors
from models.measurement import Measurement

# The numerics gate compares this many leading query rows of the first batch element: enough to
# catch a wrong kernel (every kernel treats rows alike, and a prefix keeps top-left causality),
# small enough that the float64 reference of a 128k-deep problem costs milliseconds.
GATE_ROWS = 64


def _run(kernel: Kernel, inputs: AttentionInputs, problem: Problem) -> torch.Tensor:
    return kernel.run(inputs.query, inputs.key, inputs.value, inputs.attn_mask, None, inputs.enable_gqa, problem)


def gate_error(kernel: Kernel, inputs: AttentionInputs, out: torch.Tensor) -> float:
    """Relative L2 error of `out` on the first batch element's leading query rows."""
    rows = min(GATE_ROWS, inputs.query.shape[-2])
    mask = inputs.attn_mask
    if mask is not None:
        mask = mask[:1]
        if mask.shape[-2] > 1:
            mask = mask[..., :rows, :]
    reference = reference_attention(
        inputs.query[:1, :, :rows], inputs.key[:1], inputs.value[:1], mask, inputs.is_causal,
        enable_gqa=inputs.enable_gqa,
    )
    return relative_errors(out[:1, :, :rows], reference)[0]


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(
    kernel: Kernel,
    problem: Problem,
    device: torch.device | str,
    *,
    settings: TimerSettings = TimerSettings(),
    memory_budget: int | None = None,
    check_numerics: bool = True,
    measure_peak: bool = True,
    device_key: str = "",
    seed: int = 0,
) -> Measurement:
    """Time `kernel` on random inputs for `problem`; see module docstring."""
    device = torch.device(device)
    base = {"problem": problem, "kernel": kernel.name, "device_key": device_key, "timestamp": time.time()}
    reasons = kernel.reasons(problem)
    if reasons:
        return Measurement(**base, status="unsupported", reason="; ".join(reasons))
    workspace = kernel.workspace_bytes(problem)
    inputs_bytes = problem.q_bytes + problem.kv_bytes + problem.mask_bytes
    if memory_budget is not None and workspace + inputs_bytes > memory_budget:
        return Measurement(
            **base, status="infeasible",
            reason=f"inputs ({inputs_bytes} B) + workspace ({workspace} B) exceed the memory budget ({memory_budget} B)",
        )
    input_sets: list[AttentionInputs] = []
    try:
        cap = None if memory_budget is None else max(memory_budget - workspace, inputs_bytes)
        count = rotation_count(problem, device, cap)
        input_sets = [make_inputs(problem, device, seed + i) for i in range(count)]
        with torch.inference_mode():
            if measure_peak:
                peak, out = measure_peak_bytes(lambda: _run(kernel, input_sets[0], problem), device)
            else:
                peak, out = None, _run(kernel, input_sets[0], problem)
            error = gate_error(kernel, input_sets[0], out) if check_numerics else None
            del out
            timing = time_repetitions(lambda i: _run(kernel, input_sets[i % count], problem), device, settings)
    except torch.OutOfMemoryError as oom:
        input_sets.clear()
        _empty_cache(device)
        return Measurement(**base, status="infeasible", reason=f"out of memory: {str(oom).splitlines()[0][:200]}")
    except Exception as failure:  # noqa: BLE001 - a failing kernel is a data point, not a crash
        input_sets.clear()
        _empty_cache(device)
        message = str(failure).strip().splitlines()[0][:200] if str(failure).strip() else ""
        return Measurement(**base, status="failed", reason=f"{type(failure).__name__}: {message}")
    finally:
        input_sets.clear()
    status, reason = "ok", ""
    if error is not None and not kernel.tolerance(problem).accepts(error, 0.0):
        status = "inaccurate"
        reason = f"relative error {error:.2e} exceeds the {problem.dtype} tolerance {kernel.tolerance(problem).relative_l2:.0e}"
    return Measurement(
        **base, median_s=timing.median_s, iqr_s=timing.iqr_s, reps=timing.reps, peak_bytes=peak,
        rel_error=error, status=status, reason=reason,
    )
