"""Measure one kernel on one problem: support check, memory check, numerics gate, peak memory
and a trusted timing. Never raises for a kernel's failure: OOM is recorded as infeasible, any
other error as failed, and the allocator is emptied afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from attn_dispatch.calibration.inputs import AttentionInputs, InputCache, gate_errors, rotation_count
from attn_dispatch.calibration.peak_memory import measure_peak_bytes
from attn_dispatch.calibration.timer import DEFAULT, TimerSettings, time_repetitions
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.base import is_out_of_memory
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.measurement import Measurement

REASON_CHARS = 200  # longest reason kept in a record
# One timed repetition, no warm-up: used when the first (untimed) call already spent the budget.
SINGLE_SHOT = TimerSettings(warmup=0, min_reps=1, max_reps=1, target_relative_iqr=float("inf"), budget_s=0.0)
# A suspected clear loser: one warm call (which sizes the batch), then one batched sample.
LOSER_CHECK = TimerSettings(warmup=1, min_reps=1, max_reps=1, target_relative_iqr=float("inf"), budget_s=0.0)


def _run(kernel: Kernel, inputs: AttentionInputs, problem: Problem) -> torch.Tensor:
    return kernel.run(inputs.query, inputs.key, inputs.value, inputs.attn_mask, None, inputs.enable_gqa, problem)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:REASON_CHARS] if text else ""


def empty_cache(device: torch.device) -> None:
    """Give cached blocks back so the next point starts from an empty allocator."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _timing(kernel, problem, input_sets, device, settings, first_call_s, should_stop, single_shot_above_s):
    """Time the kernel. A kernel whose first call alone spent the per-point budget is timed once
    more without warm-up; one whose first call took longer than `single_shot_above_s` (a clear
    loser) gets one warm-up and one batched sample (unless that shows the first call was a cold
    start, when it is timed fully)."""
    count = len(input_sets)

    def run(i: int) -> object:
        return _run(kernel, input_sets[i % count], problem)

    if first_call_s > settings.budget_s:
        timing = time_repetitions(run, device, SINGLE_SHOT)
        if timing.median_s > settings.budget_s / 2:
            return replace(timing, stopped="budget")
    elif single_shot_above_s is not None and first_call_s > single_shot_above_s:
        timing = time_repetitions(run, device, LOSER_CHECK)
        if timing.median_s > single_shot_above_s:  # still a loser once warm
            return replace(timing, stopped="early")
    return time_repetitions(run, device, settings, should_stop=should_stop)


def measure(kernel: Kernel, problem: Problem, device: torch.device | str, *, settings: TimerSettings = DEFAULT,
            memory_budget: int | None = None, check_numerics: bool = True, measure_peak: bool = True,
            device_key: str = "", seed: int = 0, cache: InputCache | None = None,
            should_stop: Callable[[list[float]], bool] | None = None, single_shot_above_s: float | None = None,
            extra: dict | None = None) -> Measurement:
    """Time `kernel` on random inputs for `problem`; see module docstring.

    `memory_budget`: bytes the point may use (inputs + workspace; over it: infeasible without
    running). `cache` reuses input sets and references across the kernels of one problem.
    `should_stop` goes to `time_repetitions`. A kernel whose first call takes longer than
    `single_shot_above_s` gets one warm-up and one batched sample (``stopped == "early"``) unless
    that shows it is no loser. `extra` is copied into ``Measurement.extra``.
    """
    device = torch.device(device)
    base = {"problem": problem, "kernel": kernel.name, "device_key": device_key, "timestamp": time.time()}
    info = dict(extra or {})
    try:
        reasons = kernel.reasons(problem)
        workspace = None if reasons else kernel.workspace_bytes(problem)
    except Exception as failure:  # noqa: BLE001 - a broken kernel is a data point, not a crash
        return Measurement(**base, status="failed", reason=f"{type(failure).__name__}: {_first_line(failure)}", extra=info)
    if reasons:
        return Measurement(**base, status="unsupported", reason="; ".join(reasons), extra=info)
    info["workspace_bytes"] = workspace
    inputs_bytes = problem.input_bytes
    if memory_budget is not None and workspace + inputs_bytes > memory_budget:
        return Measurement(
            **base, status="infeasible", extra=info,
            reason=f"inputs ({inputs_bytes} B) + workspace ({workspace} B) exceed the memory budget ({memory_budget} B)",
        )
    own_cache = cache is None
    cache = InputCache() if cache is None else cache
    try:
        cap = None if memory_budget is None else max(memory_budget - workspace, inputs_bytes)
        count = rotation_count(problem, device, cap)
        input_sets = cache.input_sets(problem, device, seed, count)
        with torch.inference_mode():
            references = cache.references(problem, device, seed) if check_numerics else None
            # The first call's time decides the shortcuts: it gives the peak too only on a GPU (the
            # allocator's counters cost nothing there; the CPU tracker is slow).
            peak_on_first_call = measure_peak and device.type == "cuda"
            began = time.perf_counter()
            if peak_on_first_call:
                peak, out = measure_peak_bytes(lambda: _run(kernel, input_sets[0], problem), device)
            else:
                peak, out = None, _run(kernel, input_sets[0], problem)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            first_call_s = time.perf_counter() - began
            errors = gate_errors(out, references) if references is not None else None
            del out
            timing = _timing(kernel, problem, input_sets, device, settings, first_call_s, should_stop, single_shot_above_s)
            if measure_peak and not peak_on_first_call:
                peak, _ = measure_peak_bytes(lambda: _run(kernel, input_sets[0], problem), device)
    except Exception as failure:  # noqa: BLE001 - a failing kernel is a data point, not a crash
        cache.clear()
        empty_cache(device)
        if is_out_of_memory(failure):
            return Measurement(**base, status="infeasible", reason=f"out of memory: {_first_line(failure)}", extra=info)
        return Measurement(**base, status="failed", reason=f"{type(failure).__name__}: {_first_line(failure)}", extra=info)
    finally:
        if own_cache:
            cache.clear()
    info.update(input_sets=count, stopped=timing.stopped)
    status, reason, rel_error = "ok", "", None
    if errors is not None:
        rel_error, info["rel_max_error"] = errors
        tolerance = kernel.tolerance(problem)
        if not tolerance.accepts(*errors):
            status = "inaccurate"
            reason = (
                f"error {errors[0]:.2e} (relative L2) / {errors[1]:.2e} (relative max) exceeds the "
                f"{problem.dtype} tolerance {tolerance.relative_l2:.0e} / {tolerance.relative_max:.0e}"
            )
    return Measurement(
        **base, median_s=timing.median_s, iqr_s=timing.iqr_s, reps=timing.reps, peak_bytes=peak,
        rel_error=rel_error, status=status, reason=reason, extra=info,
    )
