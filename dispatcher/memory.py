"""How much memory one attention call may use: free device memory and the configured budget.

Free memory on a GPU (CUDA or ROCm) is what the driver reports free plus what PyTorch's caching
allocator holds but does not use (a kernel's allocations are served from that cache first). On
the CPU it is the kernel's estimate of available RAM (``MemAvailable`` in ``/proc/meminfo``).

The budget (``ATTN_DISPATCH_MEMORY_BUDGET=16GiB`` or ``Dispatcher(memory_budget=...)``) caps the
workspace of one call, so a card with less memory (a 16 GB MI50) can be emulated on a bigger one.
"""

from __future__ import annotations

import os

import torch

from attn_dispatch.models.environment import (  # noqa: F401 (public here too: `ad.parse_memory_size`, `format_bytes`)
    MAX_MEMORY_BUDGET,
    format_bytes,
    parse_memory_size,
)

MEMINFO_PATH = "/proc/meminfo"

def free_bytes(device: torch.device) -> int | None:
    """Bytes a new allocation on `device` can get now; None when the device cannot tell.

    CUDA/ROCm: driver free memory plus the caching allocator's reserved-but-unused bytes.
    CPU: ``MemAvailable`` from ``/proc/meminfo``, else free physical pages (``os.sysconf``).
    """
    if device.type == "cuda":
        return _cuda_free_bytes(device)
    if device.type == "cpu":
        return _cpu_available_bytes()
    backend = getattr(torch, device.type, None)
    mem_get_info = getattr(backend, "mem_get_info", None)
    if mem_get_info is None:
        return None
    try:
        return int(mem_get_info(device)[0])
    except (RuntimeError, TypeError, ValueError):
        return None


def _cuda_free_bytes(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    free, _total = torch.cuda.mem_get_info(index)
    stats = torch.cuda.memory_stats(index)  # one call for both counters (each getter builds this dict)
    cached_unused = stats.get("reserved_bytes.all.current", 0) - stats.get("allocated_bytes.all.current", 0)
    return int(free + max(cached_unused, 0))


def _cpu_available_bytes() -> int | None:
    try:
        with open(MEMINFO_PATH) as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts kB (KiB)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def release_cached_memory(device: torch.device) -> None:
    """Give the caching allocator's unused blocks back (after an out-of-memory error)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
        return
    backend = getattr(torch, device.type, None)
    empty_cache = getattr(backend, "empty_cache", None)
    if empty_cache is not None:
        try:
            empty_cache()
        except RuntimeError:
            pass
