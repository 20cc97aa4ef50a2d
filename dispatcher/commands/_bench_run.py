"""The run behind `attn-dispatch bench`: for each shape, the paths (a fresh dispatcher, PyTorch's
default, math and every single kernel) timed by calibration's interleaved harness, and the
conditions of the run. Imported by the bench command only (it pulls in calibration)."""

from __future__ import annotations

import contextlib
import platform
import subprocess
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from attn_dispatch.calibration.bench_report import BenchReport
from attn_dispatch.calibration.noise import MachineWatch
from attn_dispatch.calibration.scenario_bench import (
    BenchPath,
    BenchSettings,
    PytorchDefault,
    Shape,
    ShapeResult,
    bench_shape,
)
from attn_dispatch.calibration.timer import TARGET_SAMPLE_S
from attn_dispatch.dispatcher.as_kernel import DISPATCHER_PATH, DispatchedKernel
from attn_dispatch.dispatcher.core import Dispatcher
from attn_dispatch.dispatcher.decision import NoKernelError, format_bytes, free_bytes
from attn_dispatch.dispatcher.selection import memory_limit
from attn_dispatch.kernels import AccuracyPolicy, MathKernel, Problem, kernel_from_name
from attn_dispatch.kernels.sdpa_backends import SdpaMathKernel
from attn_dispatch.models.environment import COMMIT
from attn_dispatch.models.identity import DeviceIdentity

PYTORCH_PATH = "pytorch_default"
PYTORCH_MATH_PATH = "pytorch_math"
"""The baseline of a portable-mode bench: PyTorch's SDPA as gfx906 runs it, its math backend."""
GIT_TIMEOUT_S = 5  # reading the commit must never hold up a benchmark
MAX_SETTLING_CALLS = 64
"""Calls the bench's first dispatcher call may repeat until its bucket's measuring decided (at most 38 with every
candidate in), so timed rounds see the bucket as it serves."""
# The fill scenario's masking, stated in every report (see calibration.scenarios).
FILL_NOTE = ("fill uses an explicit [1, 1, Lq, Lk] bool mask as transformers does for Lq < Lk (SDPA's is_causal is "
             "top-left); its content is random, which costs the same for every kernel measured")


def _git_commit() -> str:
    """The checkout's short commit, else ``ATTN_DISPATCH_COMMIT``, else ``"unknown"``."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=False, timeout=GIT_TIMEOUT_S)
        commit = out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return commit or COMMIT.read() or "unknown"


def baseline_path(kernels: str) -> BenchPath:
    """PyTorch's SDPA as the user's card runs it: its default; in portable mode its math backend (gfx906's default)."""
    if kernels == "portable":
        return BenchPath(PYTORCH_MATH_PATH, SdpaMathKernel(), "pytorch")
    return BenchPath(PYTORCH_PATH, PytorchDefault(), "pytorch")


def shape_paths(problem: Problem, device: torch.device, dispatcher: Dispatcher, subject: DispatchedKernel,
                policy: AccuracyPolicy, baseline: BenchPath | None = None) -> list[BenchPath]:
    """The dispatcher, the baseline (`baseline_path`), then every single kernel (the set but its last resort, the
    table's variants, math), fastest predicted first."""
    predicted: dict[str, float | None] = {}
    with contextlib.suppress(NoKernelError):
        for candidate in dispatcher.decide(problem, device=device).candidates:
            predicted[candidate.name] = candidate.predicted_s
    last_resort = {k.name for k in dispatcher.kernels if getattr(k, "last_resort", False)}
    names = [n for n in dict.fromkeys([*predicted, *(k.name for k in dispatcher.kernels), MathKernel().name])
             if n not in last_resort]
    kernels = {k.name: k for k in dispatcher.kernels}
    singles = [BenchPath(n, kernels.get(n) or kernel_from_name(n, policy=policy), "kernel", predicted.get(n)) for n in names]
    singles.sort(key=lambda p: (p.predicted_s is None, p.predicted_s or 0.0))
    return [BenchPath(DISPATCHER_PATH, subject, "dispatcher"), baseline or baseline_path("all"), *singles]


def conditions(device: torch.device, dispatcher: Dispatcher, shapes: list[Shape], settings: BenchSettings,
               size: str, baseline: BenchPath | None = None) -> dict:
    """Every condition the numbers depend on (the report's header)."""
    identity = DeviceIdentity.detect(device)
    source = None
    if shapes:
        try:
            source = dispatcher.decide(shapes[0].problem, device=device).source
        except NoKernelError:
            source = None
    dtypes = {}
    for shape in shapes:
        dtypes.setdefault(shape.suite, set()).add(shape.problem.dtype)
    timer = "CUDA events" if device.type == "cuda" else "time.perf_counter"
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": f"{device} ({identity.name})",
        "fingerprint": identity.key, "card model": identity.model_key, "family": identity.family_key,
        "torch": torch.__version__, "python": platform.python_version(), "attn-dispatch commit": _git_commit(),
        "cpu threads": torch.get_num_threads(),
        "dtypes": "; ".join(f"{name}: {', '.join(sorted(d))}" for name, d in dtypes.items()),
        "size": size,
        "table used": "none" if source is None else f"{source.description}{' ' + source.path if source.path else ''}",
        "memory budget": format_bytes(dispatcher.memory_budget) if dispatcher.memory_budget else "none",
        "free memory at start": format_bytes(free_bytes(device)),
        "kernel set": f"{len(dispatcher.kernels)} kernels; accuracy policy: {dispatcher.policy.describe()}",
        "PyTorch baseline": ("its math backend (portable mode emulates a card without fused backends, whose "
                             "default runs the math backend); the dispatcher's last resort, PyTorch's default, is not benched")
        if baseline is not None and baseline.label == PYTORCH_MATH_PATH else "F.scaled_dot_product_attention as called by a user",
        "measuring on calls": ("on: the dispatcher measures each bucket's candidates on its calls; the gated first call "
                               f"repeats the call until the bucket has decided (at most {MAX_SETTLING_CALLS} calls, outside "
                               "the timed rounds)") if dispatcher.measure else "off (ATTN_DISPATCH_MEASURE=0)",
        "timing": (f"{timer}; each path: 1 gated first call + {settings.warmup} warm-up + 1 timed sample; then up to "
                   f"{settings.rounds} interleaved rounds of one sample per path (back-to-back calls lasting ~{TARGET_SAMPLE_S * 1e3:g} ms, "
                   f"divided by their count; at least {settings.min_rounds} rounds, no new round after "
                   f"{settings.shape_budget_s:g} s per shape), order rotated each round; median of the rounds; "
                   f"spread = IQR / median"),
        "losers": (f"a kernel {settings.loser_factor:g}x slower than the best so far is timed once; a kernel predicted "
                   f"{settings.hopeless_factor:g}x slower than the best prediction (and > {settings.hopeless_min_s:g} s) is "
                   f"skipped; paths whose inputs + workspace exceed free memory or the budget are skipped; after "
                   f"{settings.first_pass_budget_s:g} s on a shape's first pass, its remaining (predicted slowest) kernels are skipped"),
        "fill masking": FILL_NOTE,
        "host": platform.node() or "unknown",
    }


def run_bench(shapes: list[Shape], device: torch.device, *, kernels: str, policy: AccuracyPolicy,
              memory_budget: int | None, settings: BenchSettings, size: str,
              progress: Callable[[ShapeResult], None] | None = None, measure: bool = True) -> BenchReport:
    """Time every shape on `device` with a fresh dispatcher (with `measure`, each bucket settled before the timed
    rounds)."""
    # remember_tunings=False: every bench run measures afresh, whatever earlier runs left in the home
    dispatcher = Dispatcher(kernels=kernels, policy=policy, memory_budget=memory_budget, measure=measure,
                            remember_tunings=False)
    subject = DispatchedKernel(dispatcher, device, settle_calls=MAX_SETTLING_CALLS)
    baseline = baseline_path(kernels)
    report = BenchReport(conditions(device, dispatcher, shapes, settings, size, baseline))
    if shapes:  # process warm-up: thread pools, allocator, library handles; the numbers are discarded
        warm = replace(settings, rounds=1, min_rounds=1, warmup=0)
        bench_shape(shapes[0], device, shape_paths(shapes[0].problem, device, dispatcher, subject, policy, baseline),
                    settings=warm, memory_budget=dispatcher.memory_budget,
                    workspace_limit=memory_limit(free_bytes(device), dispatcher.memory_budget))
    with MachineWatch(device) as watch:  # the reference probe before and after: was the machine busy?
        for shape in shapes:
            paths = shape_paths(shape.problem, device, dispatcher, subject, policy, baseline)
            limit = memory_limit(free_bytes(device), dispatcher.memory_budget)
            result = bench_shape(shape, device, paths, settings=settings, memory_budget=dispatcher.memory_budget,
                                 workspace_limit=limit)
            result.chosen = subject.chosen(shape.problem)
            result.notes = subject.notes(shape.problem)
            report.shapes.append(result)
            if progress is not None:
                progress(result)
    report.machine = watch.state
    report.conditions["machine"] = watch.state.words()
    return report
