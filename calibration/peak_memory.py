"""Extra peak memory of one call: the caching allocator's statistics on GPU, and on CPU a
dispatch-mode tracker that counts every tensor storage the call allocates while it is alive.

The CPU tracker sees every ATen operator's outputs (so every intermediate of our portable kernels)
but not scratch memory inside a single fused operator; it is slow, so it is never used while
timing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attn_dispatch.models.gc_pause import cyclic_collection_paused


class StoragePeakTracker(TorchDispatchMode):
    """Tracks the bytes of storages created inside the mode that are still alive."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _release(self, pointer: int) -> None:
        size = self._live.pop(pointer, None)
        if size is not None:
            self.current -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Outputs sharing an input's storage are views or in-place results, not allocations.
        inputs = {
            item.untyped_storage().data_ptr()
            for item in tree_flatten((args, kwargs))[0]
            if isinstance(item, torch.Tensor)
        }
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                storage = item.untyped_storage()
                pointer, size = storage.data_ptr(), storage.nbytes()
                if size and pointer not in self._live and pointer not in inputs:
                    self._live[pointer] = size
                    self.current += size
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._release, pointer)
        return out


def measure_peak_bytes(call: Callable[[], object], device: torch.device) -> tuple[int, object]:
    """Run `call` once; return (extra peak bytes, its result). The result's own storage counts."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        # garbage from earlier work (a cycle holding GPU tensors) freed mid-call would lower the
        # allocator's count below the start and hide the call's own allocations (a peak of 0 bytes);
        # pausing the collector costs nothing, where collecting first costs tens of ms per call
        with cyclic_collection_paused():
            result = call()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, result
    with StoragePeakTracker() as tracker:
        result = call()
    return tracker.peak, result
