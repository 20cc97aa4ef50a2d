"""Memory sizes in text: ``"16GiB"`` -> bytes (`parse_memory_size`) and bytes -> ``"16.0 GiB"``
(`format_bytes`). No torch: the environment's reader (`models.environment`) validates
``ATTN_DISPATCH_MEMORY_BUDGET`` with it."""

from __future__ import annotations

import re

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
