"""A CPU table's timing threads against this process's, in words: the run-time warning
(`dispatcher.thread_warning`) and the lines `explain` and `devices` print.

A CPU calibration times its kernels with some number of torch intra-op threads (``calibrate
--threads N``, recorded as the table's ``provenance.timing_threads``). Those times, and the
kernel orderings they give, hold for a process running that many threads; with another count
every kernel's time changes, not necessarily alike. The table is keyed by the card model (its
logical CPUs), not by the threads, so a process with another count is served the same table;
these words say so. They never change a decision. GPU tables and tables without the field
(older ones) get no words: there the count is informational or unknown.
"""

from __future__ import annotations

from attn_dispatch.models.identity import torch_threads
from attn_dispatch.models.table import ThresholdTable


def timing_threads(table: ThresholdTable) -> int | None:
    """The threads `table`'s CPU timings were taken with; None for a GPU table or where unrecorded."""
    if table.identity.device_type != "cpu":
        return None
    return table.provenance.timing_threads


def mismatch_note(table: ThresholdTable, threads: int, where: str = "") -> str | None:
    """One line when `table` is a CPU table timed with another thread count than `threads` (this
    process's ``torch.get_num_threads()``), naming both and the fix; None otherwise. `where`: the
    table's file, named in the line when given."""
    timed = timing_threads(table)
    if timed is None or timed == threads:
        return None
    name = f"threshold table {where}" if where else "the threshold table"
    return (f"{name} was timed with {torch_threads(timed)}, but this process runs {torch_threads(threads)}: "
            f"its timings and kernel choices may not hold here (it still serves). Recalibrate with "
            f"`attn-dispatch calibrate --threads {threads}`, or call torch.set_num_threads({timed}) before attention runs")


def threads_line(table: ThresholdTable, threads: int) -> str | None:
    """``"timing threads: 2 torch threads, as this process runs"`` for a CPU table that records
    them, ``"warning: " + mismatch_note`` when they differ; None otherwise."""
    timed = timing_threads(table)
    if timed is None:
        return None
    if timed == threads:
        return f"timing threads: {torch_threads(timed)}, as this process runs"
    return f"warning: {mismatch_note(table, threads)}"
