"""A threshold table in words (what `attn-dispatch show` prints): card, provenance, held-out
quality (`held_out_lines`: per way of choosing, how often its pick was fastest and how much slower
on average), and where each kernel wins. `threads_line` (`explain`, `devices`): a CPU table's
timing threads against this process's, said, never changing a decision."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from attn_dispatch.kernels.accuracy import is_lossless
from attn_dispatch.kernels.convert import ConvertKernel
from attn_dispatch.models.identity import torch_threads
from attn_dispatch.models.priors import kernel_named

if TYPE_CHECKING:  # `threads_line` runs on the cold call: the table modules load with a table
    from attn_dispatch.models.table import ThresholdTable

GIB = 2**30
GIGA = 1e9
# Thresholds listed per class before "... and N more" (the rest win a bucket or two each).
MAX_THRESHOLDS_PER_CLASS = 8
LOSSY_NOTE = ("  lossy conversions (convert[fp32->bf16]+... and the like) run only where the caller allows them "
              "(AccuracyPolicy.allowing(...), --allow-lossy); by default the best lossless kernel serves those buckets")


def is_lossy_conversion(name: str) -> bool:
    """Whether kernel `name` converts inputs to a dtype that loses precision (e.g. fp32 -> bf16)."""
    try:
        kernel = kernel_named(name)
    except ValueError:  # a kernel this version does not know (a foreign table)
        return False
    return isinstance(kernel, ConvertKernel) and kernel.source is not None and not is_lossless(kernel.source,
                                                                                               kernel.target)


def _rate(value: float, unit: str) -> str:
    """``9.89e14, "FLOP/s"`` -> ``"989 TFLOP/s"``; below a tera-unit, in giga-units."""
    if value >= GIGA * 1e3:
        return f"{value / (GIGA * 1e3):.3g} T{unit}"
    return f"{value / GIGA:.3g} G{unit}"


def card_lines(table: ThresholdTable) -> list[str]:
    """The card and its software stack, and any other cards merged in."""
    i = table.identity
    return [
        f"card: {i.model_key} ({i.vendor or 'unknown vendor'}, {i.arch or 'unknown arch'}, {i.compute_units} compute units, "
        f"{i.memory_bytes / GIB:.1f} GiB) - family {i.family_key}",
        f"software: {i.software_key}",
        *(f"merged with: {other.model_key} ({other.software_key})" for other in table.provenance.merged_from),
    ]


def provenance_lines(table: ThresholdTable) -> list[str]:
    p = table.provenance
    wall = f" (the calibration measured for {p.calibration_wall_s:.0f} s)" if p.calibration_wall_s is not None else ""
    lines = [f"provenance: created {p.created}, fitted on {p.points_measured} measured points{wall}"]
    versions = ", ".join(f"{k} {v}" for k, v in sorted(p.software.items()))
    if versions:
        lines.append(f"built with: {versions}")
    lines += [f"note: {note}" for note in p.notes]
    spec = table.spec
    estimated = " (estimated)" if spec.estimated else ""
    lines.append(
        f"spec sheet{estimated}: {spec.name}, fp16 {_rate(spec.flops('float16'), 'FLOP/s')}, fp32 "
        f"{_rate(spec.flops('float32'), 'FLOP/s')}, {_rate(spec.bandwidth, 'B/s')}; source: {spec.source}"
    )
    return lines


def quality_lines(table: ThresholdTable) -> list[str]:
    """The table's held-out quality against PyTorch's default and the prior (`models.table_summary`)."""
    q = table.quality
    if not q or "top1_accuracy" not in q:
        return ["held-out quality: not evaluated (too few problems measured, or an older table)"]
    header, *rows = held_out_lines(q)
    lines = [f"held-out quality: {header}", *rows]
    if q.get("description"):
        lines.append(f"cost model: {q['description']}")
    return lines


def guard_lines(table: ThresholdTable) -> list[str]:
    """The quality guard's verdict and the measured entries."""
    guard = table.guard.describe() if table.guard is not None else "outside measured buckets: the table's model chooses (not compared with simpler rules: an older table, or too few problems)"
    sources = sorted({e.source for e in table.entries.values()})
    return [
        guard,
        f"measured entries (consulted before the model): {len(table.entries)}" + (f" from {', '.join(sources)}" if sources else ""),
    ]


def threshold_lines(table: ThresholdTable) -> list[str]:
    """Per class, where each kernel wins (most buckets first)."""
    from attn_dispatch.models.thresholds import thresholds_for

    unused = len(table.models) - len(table.usable_models)
    lines = [f"winning kernels: {len(table.classes)} kinds of problem (dtype, causality, mask) over "
             f"{sum(len(c.cells) for c in table.classes.values())} buckets of (Lq, Lk); {len(table.models)} embedded cost model(s)"
             + (f" ({unused} not used: fitted on features this version does not compute, such as an older"
                " prior; refit with `attn-dispatch check --fix` where its measurements are kept, or recalibrate)"
                if unused else "")]
    lossy_shown = False
    for key in sorted(table.classes):
        table_class = table.classes[key]
        t = table_class.template
        lines.append(f"  {key.describe()} (predicted for B{t.batch} H{t.q_heads}/{t.kv_heads} D{t.head_dim}, "
                     f"{len(table_class.cells)} buckets):")
        thresholds = thresholds_for(table_class.cells)  # worded now: tables store older wordings
        shown = thresholds[:MAX_THRESHOLDS_PER_CLASS]
        lines += [f"    - {threshold.text}" for threshold in shown]
        lossy_shown = lossy_shown or any(is_lossy_conversion(threshold.kernel) for threshold in shown)
        hidden = len(thresholds) - len(shown)
        if hidden > 0:
            lines.append(f"    - ... and {hidden} more kernels winning a few buckets each")
    return [*lines, LOSSY_NOTE] if lossy_shown else lines


def summary_lines(table: ThresholdTable) -> list[str]:
    """Everything above, in order."""
    return [*card_lines(table), *provenance_lines(table), *quality_lines(table), *guard_lines(table), *threshold_lines(table)]


# (key prefix in the quality mapping, who chose), in the order printed: the table as the
# dispatcher uses it, the two references the quality guard weighs it against, then its parts.
CHOOSERS = (
    ("guarded_", "the table as stored (what the dispatcher uses)"),
    ("default_", "always PyTorch's default"),
    ("prior_", "the analytic prior alone (a spec-sheet estimate)"),
    ("table_", "the table with its model everywhere"),
    ("", "its cost model alone"),
)


SLOWDOWN_AS_RATIO = 1.0
"""A slowdown from this on (twice the fastest's time) reads as a ratio, ``"7.49x the fastest's time"``."""


def _percent(value: object) -> str:
    return f"{value:.1%}" if _is_number(value) else "?"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _slowdown(value: object, words: str = " slower") -> str:
    """``"11.9%"`` + `words`, or from `SLOWDOWN_AS_RATIO` on ``"7.49x the fastest's time"``."""
    if _is_number(value) and value >= SLOWDOWN_AS_RATIO:
        return f"{1.0 + value:.3g}x the fastest's time"
    return f"{_percent(value)}{words}"


def chooser_line(q: Mapping[str, object], prefix: str, who: str) -> str | None:
    """``"  who: fastest on 62.5%, 11.9% slower on average, 56.2% at worst"`` (a slowdown of 100% or more as a
    ratio to the fastest's time); None when `q` has no score for `prefix` (an older table, or no problem with a
    timed PyTorch default)."""
    if q.get(f"{prefix}mean_slowdown") is None or not q.get(f"{prefix}n_problems", 1):
        return None
    fastest = f"fastest on {_percent(q.get(f'{prefix}top1_accuracy'))}"
    if prefix == "" and q.get("top1_within_noise") is not None:
        fastest += f" ({_percent(q['top1_within_noise'])} within measurement noise)"
    line = f"  {who}: {fastest}, {_slowdown(q[f'{prefix}mean_slowdown'])} on average"
    if prefix in ("guarded_", "") and q.get(f"{prefix}worst_slowdown") is not None:
        line += f", {_slowdown(q[f'{prefix}worst_slowdown'], words='')} at worst"
    spearman = q.get("spearman")
    if prefix == "" and isinstance(spearman, (int, float)):
        line += f"; rank correlation {spearman:.2f}"
    return line


def held_out_lines(q: Mapping[str, object]) -> list[str]:
    """The header (to follow ``"held-out quality: "``) and one line per way of choosing."""
    fit = ""
    if "n_points_fit" in q:
        fit = f" (fit on {q['n_points_fit']} points of {q.get('n_problems_fit', '?')} problems)"
    header = (f"on {q.get('n_problems', '?')} problems the fit never saw{fit}: how often each way of choosing picked "
              "the fastest kernel, and how much slower than the fastest its picks ran")
    rows = (chooser_line(q, prefix, who) for prefix, who in CHOOSERS)
    return [header, *(row for row in rows if row is not None)]


def threads_line(table: ThresholdTable, threads: int) -> str | None:
    """What `table`'s timings hold for, against `threads` (this process's
    ``torch.get_num_threads()``): ``"timing threads: 2 torch threads, as this process runs"``, or
    the two counts and what matches them; None for a GPU table or one that records no count."""
    timed = table.provenance.timing_threads if table.identity.device_type == "cpu" else None
    if timed is None:
        return None
    if timed == threads:
        return f"timing threads: {torch_threads(timed)}, as this process runs"
    return (f"timing threads: {torch_threads(timed)}, its timings hold for that count; this process runs "
            f"{torch_threads(threads)} and is served the table all the same (torch.set_num_threads({timed}) "
            "matches it)")
