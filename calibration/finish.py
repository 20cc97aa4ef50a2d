"""The end of a calibration: gather every measurement, apply the class-level numerics gate (a kernel
that failed its tolerance on any point of a table class is unusable for the whole class), fit the
cost model, build the threshold table and write it where the dispatcher looks (and to ``--out``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from attn_dispatch.calibration.noise import ALLOWED_REASON
from attn_dispatch.calibration.results import unit_key
from attn_dispatch.kernels.accuracy import AccuracyPolicy
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import kernel_from_name
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measurement import Measurement


def problem_class(problem: Problem) -> tuple:
    """The threshold table's class of a problem."""
    return (problem.dtype, problem.head_dim, problem.causal, problem.gqa_ratio, problem.mask_kind)


def describe_class(key: tuple) -> str:
    dtype, head_dim, causal, gqa, mask = key
    return f"{dtype} D={head_dim}{' causal' if causal else ''} GQA={gqa} mask={mask}"


def unusable(measurements: list[Measurement]) -> dict[tuple, dict[str, Measurement]]:
    """class -> kernel -> its worst inaccurate measurement in that class."""
    worst: dict[tuple, dict[str, Measurement]] = {}
    for m in measurements:
        if m.status != "inaccurate":
            continue
        per_class = worst.setdefault(problem_class(m.problem), {})
        previous = per_class.get(m.kernel)
        if previous is None or (m.rel_error or 0.0) > (previous.rel_error or 0.0):
            per_class[m.kernel] = m
    return worst


def apply_numerics_gate(measurements: list[Measurement]) -> tuple[list[Measurement], dict[tuple, dict[str, Measurement]]]:
    """Mark every point of an unusable (class, kernel) inaccurate; returns (the gated
    measurements, the `unusable` map used)."""
    excluded = unusable(measurements)
    gated = []
    for m in measurements:
        offender = excluded.get(problem_class(m.problem), {}).get(m.kernel)
        if offender is not None and m.status == "ok":
            m = replace(m, status="inaccurate", extra={**m.extra, "gated_by_class": True},
                        reason=f"unusable for {describe_class(problem_class(m.problem))}: {offender.reason} "
                        f"on {offender.problem.q_len}x{offender.problem.kv_len}")
        gated.append(m)
    return gated, excluded


HOLDOUT_FRACTION = 0.2
ANY_LOSSY = AccuracyPolicy.allowing("any")


@dataclass
class FitOutcome:
    """What the fit produced; `table_paths` is empty when no table was written."""

    table_paths: list[Path] = field(default_factory=list)
    quality: str = ""
    excluded: list[str] = field(default_factory=list)
    note: str = ""


def known_kernel(name: str) -> bool:
    try:
        kernel_from_name(name, policy=ANY_LOSSY)
    except ValueError:
        return False
    return True


TOO_BUSY_REASON = ALLOWED_REASON
# Heads a too-busy calibration's held-out scores (its table's verdict is PyTorch's default).
TOO_BUSY_SCORES = ("for reference only, timed on the same too-busy machine (these scores did not choose what "
                   "serves: the 'outside measured buckets' line says what does): ")


def fit_and_write(measurements: list[Measurement], identity: DeviceIdentity, *, out: str | os.PathLike | None,
                  seed: int, wall_s: float, too_busy: bool = False, busy_reason: str = TOO_BUSY_REASON,
                  timing_threads: str = "", timing_thread_count: int | None = None) -> FitOutcome:
    """Gate, fit, build and write the table (module docstring). `too_busy`: the verdict is PyTorch's
    default, with `busy_reason` in its guard. `timing_threads` (words) and `timing_thread_count`:
    the CPU threads the points were timed with (the table's provenance)."""
    from attn_dispatch.models.fit import fit_and_build
    from attn_dispatch.models.quality import Guard
    from attn_dispatch.models.sharing import store_table
    from attn_dispatch.models.table_io import save_table

    # One order whatever the hosts' and workers' interleaving: the same points give the same table.
    measurements = sorted(measurements, key=lambda m: unit_key(m.problem, m.kernel))
    gated, excluded = apply_numerics_gate(measurements)
    outcome = FitOutcome(excluded=[
        f"{kernel} unusable for {describe_class(key)}: {m.reason}"
        for key, kernels in sorted(excluded.items()) for kernel, m in sorted(kernels.items())
    ])
    foreign = sorted({m.kernel for m in gated if not known_kernel(m.kernel)})
    if foreign:  # a table may only name kernels the registry can build (a test's own kernels)
        gated = [m for m in gated if known_kernel(m.kernel)]
        outcome.note = f"left out of the fit (not registry kernels): {', '.join(foreign)}. "
    kernel_names = sorted({m.kernel for m in gated if m.ok})
    if not kernel_names:
        outcome.note += "no kernel gave a usable timing: no table was built"
        return outcome
    # unsupported pairs were never run: they carry nothing to learn and are not "points measured"
    measured = [m for m in gated if m.status != "unsupported"]
    table, _, quality = fit_and_build(measured, identity, kernel_names=kernel_names, seed=seed,
                                          holdout_fraction=HOLDOUT_FRACTION, calibration_wall_s=wall_s)
    if timing_threads:
        table = replace(table, provenance=replace(
            table.provenance, notes=(*table.provenance.notes, f"timed with {timing_threads}")))
    if timing_thread_count is not None:
        table = replace(table, provenance=replace(table.provenance, timing_threads=timing_thread_count))
    if too_busy:
        # what is stored and said: PyTorch's default, not the scores' verdict nor the table it guarded
        unguarded = {key: value for key, value in (table.quality or {}).items() if not key.startswith("guarded_")}
        table = replace(table, guard=Guard("default", busy_reason), quality=unguarded or table.quality)
        if quality is not None:
            quality = replace(quality, verdict=table.guard.describe(), guarded=None)
        outcome.note += f"{busy_reason}: PyTorch's default serves outside measured buckets. "
    outcome.quality = quality.summary() if quality is not None else "not evaluated (too few problems)"
    if too_busy and quality is not None:
        outcome.quality = TOO_BUSY_SCORES + outcome.quality
    outcome.table_paths = [Path(store_table(table))]
    if out is not None and Path(out).resolve() != outcome.table_paths[0].resolve():
        outcome.table_paths.append(save_table(table, out))
    return outcome
