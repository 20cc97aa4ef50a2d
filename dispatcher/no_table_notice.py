"""The one line a process says about a device with no table measured on its card model.

Such a device (a card outside every shipped table's family, a family stand-in, a CPU before its
owner calibrates) is ranked by its analytic prior or another card's scaled table, and its buckets
are measured on their own calls (`measuring`). The first decision on it logs one line saying so,
once per process and device, as a WARNING of the ``attn_dispatch`` logger (the level Python shows
without any logging set up): what is happening, where the measurements are kept, and what
`attn-dispatch calibrate` would add and how long it takes. `explain` and `attn-dispatch devices`
say the same (`no_table_line`).
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("attn_dispatch")

MEASURED_LEVELS = ("exact", "model")
"""Table lookup levels measured on this card model: nothing to say."""

CALIBRATE_TIME = ("`attn-dispatch calibrate --quick` takes 2-3 minutes on a 2-core CPU, a full "
                  "`attn-dispatch calibrate` about 10 minutes on a GPU")
"""How long calibrating takes: calibration's default measuring budgets (100 s with --quick, 8 min
otherwise: `calibration.config.QUICK_BUDGET_S`, `FULL_BUDGET_S`) plus start-up and the fit (the
dispatcher does not import calibration to read them)."""

_said: set[str] = set()
_lock = threading.Lock()


def no_table_line(level: str, device: str, *, measure: bool) -> str | None:
    """The line for a device whose ranking comes from lookup `level` (``"prior"``, ``"family"``,
    ``"none"``...); None where a table measured on this card model serves (`MEASURED_LEVELS`)."""
    if level in MEASURED_LEVELS:
        return None
    ranked = "another card's table of its family, times scaled" if level == "family" else "its analytic prior"
    if measure:
        doing = ("each new size bucket's first calls run the candidate kernels in turn, PyTorch's default first, "
                 "and the bucket keeps the fastest (a few calls' worth, remembered in the home for later processes)")
    else:
        doing = "PyTorch's default runs where nothing measured another kernel faster (ATTN_DISPATCH_MEASURE=0)"
    return (f"no table measured on this card for {device} (ranked by {ranked}): {doing}; calibrating measures every "
            f"kernel over a sweep of shapes ahead of time instead: {CALIBRATE_TIME}")


def say_once(key: str, level: str, device: str, *, measure: bool) -> None:
    """Log `no_table_line` once per process for the device identity `key`."""
    line = no_table_line(level, device, measure=measure)
    if line is None:
        return
    with _lock:
        if key in _said:
            return
        _said.add(key)
    logger.warning("attn_dispatch: %s", line)
