"""Normalised card model names from what the driver reports.

ROCm reports gfx906 boards under several marketing names from libdrm's ``amdgpu.ids`` ("AMD
Radeon VII", "AMD Radeon Pro VII", "AMD Instinct MI60 / MI50", "Vega 20", ...): the name alone
does not tell an MI50 from an MI60, nor the 16 GB MI50 from the 32 GB one. The model is derived
from the name, the compute-unit count and the memory size (unmeasured here: we have no gfx906
card; the rules follow AMD's published specifications).
"""

from __future__ import annotations

import re

GIB = 2**30
# Compute units per gfx906 model (AMD product pages): MI60 64; MI50, Radeon VII, Radeon Pro VII 60.
MI60_COMPUTE_UNITS = 64
MI50_COMPUTE_UNITS = 60
# Memory sizes (GB of HBM2) the gfx906 boards ship with; a 16 GB board reports ~15.98 GiB.
SMALL_HBM_GIB = 16
LARGE_HBM_GIB = 32

GFX906_MI50_16 = "AMD Instinct MI50 16GB"
GFX906_MI50_32 = "AMD Instinct MI50 32GB"
GFX906_MI60 = "AMD Instinct MI60 32GB"
GFX906_RADEON_VII = "AMD Radeon VII 16GB"
GFX906_RADEON_PRO_VII = "AMD Radeon Pro VII 16GB"


def memory_gib(memory_bytes: int) -> int:
    """Total memory rounded to whole GiB (what boards are sold as)."""
    return max(0, round(memory_bytes / GIB))


def gfx906_model(name: str, compute_units: int, memory_bytes: int) -> str:
    """The normalised model of a gfx906 board.

    An ambiguous 60-CU 16 GB board (e.g. reported as "Vega 20") gets an honest generic label
    instead of a guess.
    """
    lowered = name.lower()
    gib = memory_gib(memory_bytes)
    if compute_units == MI60_COMPUTE_UNITS and gib == LARGE_HBM_GIB:
        return GFX906_MI60
    if compute_units == MI50_COMPUTE_UNITS and gib == LARGE_HBM_GIB:
        return GFX906_MI50_32
    if compute_units == MI50_COMPUTE_UNITS and gib == SMALL_HBM_GIB:
        if "pro vii" in lowered:
            return GFX906_RADEON_PRO_VII
        if "radeon vii" in lowered:
            return GFX906_RADEON_VII
        if re.search(r"\bmi\s?[56]0\b", lowered) or "instinct" in lowered:
            return GFX906_MI50_16
    return f"AMD gfx906 {compute_units}CU {gib}GB"


def generic_model(name: str, memory_bytes: int) -> str:
    """Any other GPU: its reported name, with the memory size unless the name already has one."""
    clean = " ".join(name.split()) or "unknown GPU"
    if re.search(r"\d+\s?GB", clean, flags=re.IGNORECASE):
        return clean
    return f"{clean} {memory_gib(memory_bytes)}GB"


def slug(text: str, *, max_length: int = 120) -> str:
    """A filesystem-safe, lower-case form of `text` (``[a-z0-9._-]``, no leading dot)."""
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")
    cleaned = re.sub(r"-{2,}", "-", cleaned) or "unnamed"
    if len(cleaned) <= max_length:
        return cleaned
    import hashlib

    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return cleaned[: max_length - 11].rstrip("-.") + "-" + digest
