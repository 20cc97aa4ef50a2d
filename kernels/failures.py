"""Telling an out-of-memory failure from any other kernel failure (calibration records it as
infeasible; the dispatcher empties the allocator and forgets it once memory may be free)."""

from __future__ import annotations

import torch

# How CPU allocators (and some HIP builds) word an out-of-memory error that is not a
# torch.OutOfMemoryError.
OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_out_of_memory(error: BaseException) -> bool:
    """torch.OutOfMemoryError, MemoryError, or a RuntimeError an allocator raised for lack of memory."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error).lower() for m in OOM_MESSAGES)
