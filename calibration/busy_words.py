"""What a calibration says, and stores in its table's guard, when a probe found the machine too
busy to time kernels (`calibration.noise`). Two different stories:

- the probe before measuring said "too busy" and the user passed ``--allow-busy`` (without the
  flag `noise.check_quiet` stops before anything is measured): "measured anyway: --allow-busy";
- the machine was fine before measuring and too busy after: the machine *became* too busy while
  measuring, with the number that changed ("CPU share 96% before, 69% after"), never a flag the
  user did not pass.
"""

from __future__ import annotations

from attn_dispatch.calibration.noise import STOP_CPU_SHARE, STOP_SPREAD, Noise, spread_words

ALLOWED_CAUSE = "the machine was too busy to time kernels (measured anyway: --allow-busy)"
ALLOWED_REASON = "measured on a machine too busy to time kernels (calibrate --allow-busy)"
"""The table guard's reason of a calibration measured under ``--allow-busy`` (`finish.TOO_BUSY_REASON`)."""


def _starved_to_stop(noise: Noise) -> bool:
    """`noise` is too busy on its CPU share (rather than on its timing spread)."""
    return noise.cpu_share is not None and not noise.host_only and noise.cpu_share < STOP_CPU_SHARE


def change_words(start: Noise, end: Noise) -> str:
    """The numbers that made the probe after measuring "too busy" (or busy), before and after:
    ``"CPU share 96% before, 69% after"``, ``"spread 12% before, 3.2x the median time after"``,
    or both joined by "; "."""
    parts = []
    if end.spread > STOP_SPREAD or not _starved_to_stop(end):
        parts.append(f"spread {spread_words(start.spread)} before, {spread_words(end.spread)} after")
    if end.starved and start.cpu_share is not None:
        parts.append(f"CPU share {start.cpu_share:.0%} before, {end.cpu_share:.0%} after")
    return "; ".join(parts)


def too_busy_cause(start: Noise | None, end: Noise | None) -> str | None:
    """Why the timings cannot be trusted, as a clause (``"the machine ..."``), or None when
    neither probe said "too busy". `start` too busy means ``--allow-busy`` was passed."""
    if start is not None and start.too_busy:
        return ALLOWED_CAUSE
    if end is None or not end.too_busy:
        return None
    return "the machine " + _became(start, end)


def too_busy_reason(start: Noise | None, end: Noise | None) -> str | None:
    """The reason a too-busy calibration's table guard stores (`devices` and `explain` repeat it),
    or None when neither probe said "too busy"."""
    if start is not None and start.too_busy:
        return ALLOWED_REASON
    if end is None or not end.too_busy:
        return None
    return "measured on a machine that " + _became(start, end)


def _became(start: Noise | None, end: Noise) -> str:
    """``"became too busy to time kernels while measuring (CPU share 96% before, 69% after)"``."""
    if start is None:
        return "was too busy to time kernels after measuring"
    return f"became too busy to time kernels while measuring ({change_words(start, end)})"
