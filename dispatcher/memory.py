"""How much memory one attention call may use: free device memory and the configured budget.

Free memory on a GPU (CUDA or ROCm) is what the driver reports free plus what PyTorch's caching
allocator holds but does not use (a kernel's allocations are served from that cache first). On
the CPU it is the kernel's estimate of available RAM (``MemAvailable`` in ``/proc/meminfo``).

The budget (``ATTN_DISPATCH_MEMORY_BUDGET=16GiB`` or ``Dispatcher(memory_budget=...)``) caps the
workspace of one call, so a card with less memory (a 16 GB MI50) can be emulated on a bigger one.
"""

from __future__ import annotations

import os
import re

import torch

BUDGET_ENV = "ATTN_DISPATCH_MEMORY_BUDGET"
MEMINFO_PATH = "/proc/meminfo"

# Binary (IEC) and decimal (SI) units, as nvidia-smi / rocm-smi (GiB) and spec sheets (GB) write them.
UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
# The largest budget accepted: 1 PiB. The biggest single machines hold tens of TiB of RAM and the
# biggest accelerators a few hundred GiB, so a budget above this is a typo (e.g. "99999999999TiB").
MAX_MEMORY_BUDGET = 2**50
_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-z]*)\s*$")


def parse_memory_size(value: int | float | str, *, name: str = "memory_budget") -> int:
    """``"16GiB"``, ``"512MiB"``, ``"16GB"``, ``"1.5G"``, ``"1048576"`` or an int -> bytes.

    ``K``/``M``/``G``/``T`` alone are binary (GiB); ``KB``/``MB``/``GB``/``TB`` are decimal.

    Raises
    ------
    ValueError
        Naming `name` and the accepted forms, for anything else (negative sizes, unknown units,
        sizes over `MAX_MEMORY_BUDGET`).
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a size such as '16GiB' or a number of bytes, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    elif isinstance(value, str):
        match = _SIZE.match(value.lower())
        if match is None or match["unit"] not in UNITS:
            raise ValueError(
                f"{name}={value!r} is not a memory size: write a number with an optional unit, "
                f"e.g. '16GiB', '512MiB', '16GB' or '17179869184' (units: KiB MiB GiB TiB, KB MB GB TB)"
            )
        number, unit = float(match["number"]), match["unit"]
    else:
        raise ValueError(f"{name} must be a size such as '16GiB' or a number of bytes, got {type(value).__name__}")
    if not number >= 0 or number == float("inf"):
        raise ValueError(f"{name} must be a finite size >= 0 bytes, got {value!r}")
    size = number * UNITS[unit]
    if size > MAX_MEMORY_BUDGET:
        raise ValueError(f"{name}={value!r} is more memory than any machine has (the limit is "
                         f"{format_bytes(MAX_MEMORY_BUDGET)}, MAX_MEMORY_BUDGET); write e.g. '16GiB'")
    return int(size)


def budget_from_env() -> int | None:
    """The budget set by ``ATTN_DISPATCH_MEMORY_BUDGET`` (None when unset or empty).

    Raises
    ------
    ValueError
        One line naming the variable, its value and the fix.
    """
    text = os.environ.get(BUDGET_ENV, "").strip()
    if not text:
        return None
    try:
        return parse_memory_size(text, name=BUDGET_ENV)
    except ValueError as error:
        raise ValueError(f"{error}. Fix the environment variable {BUDGET_ENV} (e.g. {BUDGET_ENV}=16GiB) or "
                         f"unset it") from None


def check_budget_env() -> None:
    """Validate ``ATTN_DISPATCH_MEMORY_BUDGET`` now (when a dispatcher is built or installed), so a
    bad value fails at start-up rather than at a model's first attention call (ValueError, as
    `budget_from_env`)."""
    budget_from_env()


def format_bytes(count: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; None -> ``"unknown"``."""
    if count is None:
        return "unknown"
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


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
