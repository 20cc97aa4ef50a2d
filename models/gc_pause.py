"""Python's cyclic garbage collector paused around a block, then restored as it was."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def cyclic_collection_paused() -> Iterator[None]:
    """Inside: no cyclic collection (reference counting still frees everything acyclic); after:
    the collector on again if it was on before, also when the block raises. The switch is the
    process's, so a `gc.disable()` another thread makes meanwhile is undone at the end. Used where
    a collection in the middle does harm: a measured call (`calibration.measure`) and a table's
    parse (`models.table_io`)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
