"""A CPU table's timing threads against this process's, in words: the line `explain` (through the
ranking source's notes) and `devices` print.

A CPU calibration times its kernels with some number of torch intra-op threads (``calibrate
--threads N``, recorded as the table's ``provenance.timing_threads``). Those times, and the
kernel orderings they give, hold for a process running that many threads. The table is keyed by
the card model (its logical CPUs), not by the threads, so a process with another count is served
the same table, quietly: on a busy machine a ``--threads 1`` table may be the only one a
calibration can take, and a warning in every process that suggested recalibrating with more
threads sent users round a loop the busy machine refuses. The words state the count, never
change a decision, and suggest only what always works (``torch.set_num_threads``). GPU tables
and tables without the field (older ones) get no words: there the count is informational or
unknown.
"""

from __future__ import annotations

from attn_dispatch.models.identity import torch_threads
from attn_dispatch.models.table import ThresholdTable


def timing_threads(table: ThresholdTable) -> int | None:
    """The threads `table`'s CPU timings were taken with; None for a GPU table or where unrecorded."""
    if table.identity.device_type != "cpu":
        return None
    return table.provenance.timing_threads


def threads_line(table: ThresholdTable, threads: int) -> str | None:
    """What `table`'s timings hold for, against `threads` (this process's
    ``torch.get_num_threads()``): ``"timing threads: 2 torch threads, as this process runs"``, or
    the two counts and what matches them; None for a GPU table or one that records no count."""
    timed = timing_threads(table)
    if timed is None:
        return None
    if timed == threads:
        return f"timing threads: {torch_threads(timed)}, as this process runs"
    return (f"timing threads: {torch_threads(timed)}, its timings hold for that count; this process runs "
            f"{torch_threads(threads)} and is served the table all the same (torch.set_num_threads({timed}) "
            "matches it)")
