"""Measure one kernel on one problem: support check, memory check, numerics gate, peak memory
and a trusted timing. Never raises for a kernel's failure: OOM is recorded as infeasible, any
other error as failed, and the allocator is emptied afterwards."""

from __future__ import annotations

import platform
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attn_dispatch.calibration.inputs import AttentionInputs, InputCache, gate_errors, rotation_count
from attn_dispatch.calibration.timer import DEFAULT, TimerSettings, synchronize, time_repetitions
from attn_dispatch.kernels.accuracy import AccuracyPolicy
from attn_dispatch.kernels.base import Kernel, is_out_of_memory
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import all_kernels
from attn_dispatch.models.gc_pause import cyclic_collection_paused
from attn_dispatch.models.measurement import Measurement


class StoragePeakTracker(TorchDispatchMode):
    """Tracks the bytes of storages created inside the mode that are still alive."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _release(self, pointer: int) -> None:
        size = self._live.pop(pointer, None)
        if size is not None:
            self.current -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Outputs sharing an input's storage are views or in-place results, not allocations.
        inputs = {
            item.untyped_storage().data_ptr()
            for item in tree_flatten((args, kwargs))[0]
            if isinstance(item, torch.Tensor)
        }
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                storage = item.untyped_storage()
                pointer, size = storage.data_ptr(), storage.nbytes()
                if size and pointer not in self._live and pointer not in inputs:
                    self._live[pointer] = size
                    self.current += size
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._release, pointer)
        return out


def measure_peak_bytes(call: Callable[[], object], device: torch.device) -> tuple[int, object]:
    """Run `call` once; return (extra peak bytes, its result). The result's own storage counts."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        # garbage from earlier work (a cycle holding GPU tensors) freed mid-call would lower the
        # allocator's count below the start and hide the call's own allocations (a peak of 0 bytes);
        # pausing the collector costs nothing, where collecting first costs tens of ms per call
        with cyclic_collection_paused():
            result = call()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, result
    with StoragePeakTracker() as tracker:
        result = call()
    return tracker.peak, result


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
            memory_budget: int | None = None, measure_peak: bool = True,
            device_key: str = "", seed: int = 0, cache: InputCache | None = None,
            should_stop: Callable[[list[float]], bool] | None = None, single_shot_above_s: float | None = None,
            extra: dict | None = None) -> Measurement:
    """Time `kernel` on random inputs for `problem`; see module docstring.

    `memory_budget`: bytes the point may use (inputs + workspace; over it: infeasible without
    running). `cache` reuses input sets and references across the kernels of one problem.
    `should_stop` goes to `time_repetitions`; `single_shot_above_s`: see `_timing`. `extra` is
    copied into ``Measurement.extra``."""
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
            references = cache.references(problem, device, seed)
            # The first call's time decides the shortcuts: it gives the peak too only on a GPU (the
            # allocator's counters cost nothing there; the CPU tracker is slow).
            peak_on_first_call = measure_peak and device.type == "cuda"
            began = time.perf_counter()
            if peak_on_first_call:
                peak, out = measure_peak_bytes(lambda: _run(kernel, input_sets[0], problem), device)
            else:
                peak, out = None, _run(kernel, input_sets[0], problem)
            synchronize(device)
            first_call_s = time.perf_counter() - began
            errors = gate_errors(out, references)
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
    status, reason = "ok", ""
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


@dataclass(frozen=True)
class NamedShape:
    suite: str
    problem: Problem

    @property
    def label(self) -> str:
        p = self.problem
        return f"{self.suite} B{p.batch} H{p.q_heads}/{p.kv_heads} L{p.q_len} S{p.kv_len} D{p.head_dim} {p.dtype}{' causal' if p.causal else ''}{' mask=' + p.mask_kind if p.mask_kind != 'none' else ''}"


def named_shape(suite, batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype, causal=False, mask=None, device_type="cpu", strided=False):
    mask_kind, mask_shape = "none", ()
    if mask:
        mask_kind, mask_shape = mask, (1, 1, q_len, kv_len)
    problem = Problem(batch, q_heads, kv_heads, q_len, kv_len, head_dim, head_dim, dtype, causal, mask_kind, mask_shape, device_type, strided)
    return NamedShape(suite, problem)


# CPU-sized shapes for the self-check: one of each scenario, small enough for a 2-core machine.
SELF_CHECK_SHAPES = (
    named_shape("decode", 1, 8, 2, 1, 2048, 64, "float32"),
    named_shape("small-q", 1, 8, 2, 16, 2048, 64, "float32"),
    named_shape("prefill", 1, 8, 2, 256, 256, 64, "float32", causal=True),
    named_shape("masked", 2, 4, 4, 128, 192, 64, "bfloat16", mask="bool", strided=True),
)


def on_device(shape: NamedShape, device: torch.device) -> NamedShape:
    return NamedShape(shape.suite, replace(shape.problem, device_type=device.type))


def run_kernel_table(device: torch.device, shapes: Iterable[NamedShape], kernels: Sequence[Kernel] | None = None, *,
                     settings: TimerSettings = DEFAULT, memory_budget: int | None = None,
                     progress=None) -> tuple[str, list[dict]]:
    """Measure every kernel on every shape; return (markdown table, JSON-ready records)."""
    kernels = list(kernels) if kernels is not None else all_kernels(policy=AccuracyPolicy.allowing("any"))
    records: list[dict] = []
    for shape in shapes:
        shape = on_device(shape, device)
        for kernel in kernels:
            point = measure(kernel, shape.problem, device, settings=settings, memory_budget=memory_budget)
            if point.status == "unsupported":
                continue
            records.append({"suite": shape.suite, "shape": shape.label, **point.to_dict()})
            if progress is not None:
                progress(records[-1])
    return format_table(records, device), records


def conditions(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return f"device {device} ({name}), torch {torch.__version__}, python {platform.python_version()}"


def format_table(records: list[dict], device: torch.device) -> str:
    """Markdown: one row per (shape, kernel) with median, spread, peak memory, error and ratio to
    the shape's fastest kernel."""
    lines = [
        f"Conditions: {conditions(device)}; median of repetitions after warm-up; spread = IQR/median.",
        "",
        "| shape | kernel | status | median ms | spread | x best | peak MiB | rel err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    best: dict[str, float] = {}
    for r in records:
        if r["status"] == "ok":
            best[r["shape"]] = min(best.get(r["shape"], float("inf")), r["median_s"])
    for r in records:
        if r["status"] in ("ok", "inaccurate"):
            ms = f"{r['median_s'] * 1e3:.3f}"
            spread = f"{r['iqr_s'] / r['median_s']:.1%}" if r["median_s"] else "-"
            ratio = f"{r['median_s'] / best[r['shape']]:.2f}" if r["shape"] in best else "-"
        else:
            ms, spread, ratio = r["reason"][:60], "", ""
        peak = f"{r['peak_bytes'] / 2**20:.1f}" if r.get("peak_bytes") is not None else ""
        err = f"{r['rel_error']:.1e}" if r.get("rel_error") is not None else ""
        lines.append(f"| {r['shape']} | {r['kernel']} | {r['status']} | {ms} | {spread} | {ratio} | {peak} | {err} |")
    return "\n".join(lines)
