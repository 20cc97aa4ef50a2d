"""A table's held-out quality in words: what `attn-dispatch calibrate`, `check --fix` and `show`
print, from one flat ``quality`` mapping (`models.quality.Quality.to_dict`).

Each way of choosing a kernel (the stored table, PyTorch's default, the analytic prior, and the
table's parts) gets one line saying the same two things: on how many of the held-out problems its
pick was the fastest kernel, and how much slower than the fastest its picks ran on average. The
quality guard's verdict (`models.guard.Guard.describe`) weighs the second, not the first, so a
reference that is more often the fastest can still lose it.
"""

from __future__ import annotations

from collections.abc import Mapping

# (key prefix in the quality mapping, who chose), in the order printed: the table as the
# dispatcher uses it, the two references the quality guard weighs it against, then its parts.
CHOOSERS = (
    ("guarded_", "the table as stored, after its quality guard"),
    ("default_", "always PyTorch's default"),
    ("prior_", "the analytic prior alone"),
    ("table_", "the table before its quality guard"),
    ("", "its cost model alone"),
)


def _percent(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"


def chooser_line(q: Mapping[str, object], prefix: str, who: str) -> str | None:
    """``"  who: fastest on 62.5%, 11.9% slower on average, 56.2% at worst"``; None when `q` has no
    score for `prefix` (an older table, or no problem with a timed PyTorch default)."""
    if q.get(f"{prefix}mean_slowdown") is None or not q.get(f"{prefix}n_problems", 1):
        return None
    fastest = f"fastest on {_percent(q.get(f'{prefix}top1_accuracy'))}"
    if prefix == "" and q.get("top1_within_noise") is not None:
        fastest += f" ({_percent(q['top1_within_noise'])} within measurement noise)"
    line = f"  {who}: {fastest}, {_percent(q[f'{prefix}mean_slowdown'])} slower on average"
    if prefix in ("guarded_", "") and q.get(f"{prefix}worst_slowdown") is not None:
        line += f", {_percent(q[f'{prefix}worst_slowdown'])} at worst"
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
