"""One warning per process and table when a CPU table serves a process whose torch thread count
differs from the one the table was timed with (`models.thread_words`). Said, never acted on: the
table's decisions stay as they are.

Checked when the device's ranking is resolved and again whenever the table ranks a new bucket
(`ranking.DeviceRanking.rank`, not the per-call paths), so a ``torch.set_num_threads`` after the
first attention call is caught at the next new shape.
"""

from __future__ import annotations

import threading
import warnings

import torch

from attn_dispatch.models.sharing import TableWarning
from attn_dispatch.models.thread_words import mismatch_note

_warned: set[tuple] = set()  # (table file, created, timing threads) of every table warned about
_lock = threading.Lock()


class ThreadsWarning(TableWarning):
    """A CPU table was timed with another torch thread count than this process runs."""


def thread_note(table: object, where: str | None) -> str | None:
    """The mismatch line for `table` at this moment's ``torch.get_num_threads()``; None when they
    agree, for a GPU table, a table without the count, or a ranker that is not a table."""
    provenance = getattr(table, "provenance", None)
    if getattr(provenance, "timing_threads", None) is None:
        return None
    return mismatch_note(table, torch.get_num_threads(), where or "")


def warn_once(table: object, where: str | None, *, stacklevel: int = 4) -> str | None:
    """Issue `thread_note` as a `ThreadsWarning` the first time this process sees it for this
    table; returns the note (None when there is nothing to say)."""
    note = thread_note(table, where)
    if note is None:
        return None
    key = (where, table.provenance.created, table.provenance.timing_threads)
    with _lock:
        first = key not in _warned
        _warned.add(key)
    if first:
        warnings.warn(note, ThreadsWarning, stacklevel=stacklevel)
    return note
