"""Kernel benchmark: every kernel on a list of named shapes, timed side by side in one process.

Used by `attn-dispatch kernels` (a CPU-sized self-check) and by `python -m bench.kernels` (the
GPU suites).
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from attn_dispatch.calibration.measure import measure
from attn_dispatch.calibration.timer import DEFAULT, TimerSettings
from attn_dispatch.kernels.accuracy import AccuracyPolicy
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import all_kernels


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
    from dataclasses import replace

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
