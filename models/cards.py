"""Card spec sheets: peak rates, bandwidth and memory, each number with its source.

A `CardSpec` feeds the analytic prior (`models.priors`) and the cost model's roofline features.
gfx906 numbers are AMD's published peaks (unmeasured here: we have no gfx906 card). H200 numbers
are NVIDIA's datasheet, with this workplace's measured ceilings noted beside them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from attn_dispatch.models._card_names import (
    GFX906_MI50_16,
    GFX906_MI50_32,
    GFX906_MI60,
    GFX906_RADEON_PRO_VII,
    GFX906_RADEON_VII,
)
from attn_dispatch.models.identity import DeviceIdentity

TERA = 1e12
GB = 10**9
GIB = 2**30

# Per-launch cost of one eager PyTorch op on a GPU: the H200 probe (shared/reference/h200-probe.md)
# ran chunked256 decode at Lk=4096 (about 12 ops, microseconds of work) in 0.096 ms: ~8 us per op.
CUDA_LAUNCH_OVERHEAD_S = 8e-6
# HIP launches are commonly reported slower than CUDA's; unmeasured here (no gfx906 card): +25%.
HIP_LAUNCH_OVERHEAD_S = 10e-6


@dataclass(frozen=True, eq=False)
class CardSpec:
    """Peak rates of one card model.

    Attributes
    ----------
    name: the card model (`DeviceIdentity.model_key` form).
    matrix_flops: dtype name -> peak FLOP/s of matrix products in that dtype.
    vector_flops: peak fp32 FLOP/s of elementwise work (softmax, exp).
    bandwidth: peak memory bandwidth, bytes/s.
    memory_bytes: device memory.
    compute_units: CUs / SMs / CPU threads (parallel work units, for occupancy).
    launch_overhead_s: cost of one eager op launch.
    fused_attention: PyTorch ships fused SDPA kernels for this card (False on gfx906).
    source: where the numbers come from.
    estimated: True when the numbers are guesses (generic card), not a datasheet or a probe.
    """

    name: str
    matrix_flops: MappingProxyType
    vector_flops: float
    bandwidth: float
    memory_bytes: int
    compute_units: int
    launch_overhead_s: float
    fused_attention: bool = True
    source: str = ""
    estimated: bool = False
    notes: tuple[str, ...] = field(default=())

    def flops(self, dtype: str) -> float:
        """Peak matrix FLOP/s for `dtype` (fp32's rate for a dtype the sheet does not list)."""
        return self.matrix_flops.get(dtype, self.matrix_flops["float32"])

    def with_memory(self, memory_bytes: int) -> CardSpec:
        return replace(self, memory_bytes=memory_bytes)


def _rates(fp16: float, bf16: float, fp32: float, fp64: float) -> MappingProxyType:
    return MappingProxyType({"float16": fp16, "bfloat16": bf16, "float32": fp32, "float64": fp64})


_GFX906_BF16_NOTE = (
    "gfx906 has no native bf16 matrix path: the bf16 rate is an estimate (fp32's rate, as "
    "rocBLAS computes bf16 products in fp32 there)"
)


def _gfx906(name: str, fp16: float, fp32: float, fp64: float, units: int, gib: int, source: str) -> CardSpec:
    """A gfx906 board: 1024 GB/s HBM2, HIP launches, no fused attention in PyTorch, and no bf16
    matrix path (fp32's rate stands in for bf16: an estimate). Rates in TFLOP/s."""
    return CardSpec(
        name=name, matrix_flops=_rates(fp16 * TERA, fp32 * TERA, fp32 * TERA, fp64 * TERA),
        vector_flops=fp32 * TERA, bandwidth=GFX906_BANDWIDTH, memory_bytes=gib * GIB, compute_units=units,
        launch_overhead_s=HIP_LAUNCH_OVERHEAD_S, fused_attention=False, source=f"{source} (unmeasured here)",
        notes=(_GFX906_BF16_NOTE,),
    )


# Every gfx906 board has 4 stacks of HBM2 at 1024 GB/s (AMD product pages).
GFX906_BANDWIDTH = 1024 * GB
# AMD Radeon Instinct MI50 datasheet: 26.5 TFLOPS fp16, 13.3 fp32, 6.6 fp64, 60 CUs, 16 or 32 GB.
MI50_16GB = _gfx906(GFX906_MI50_16, 26.5, 13.3, 6.6, 60, 16, "AMD Radeon Instinct MI50 datasheet")
MI50_32GB = _gfx906(GFX906_MI50_32, 26.5, 13.3, 6.6, 60, 32, "AMD Radeon Instinct MI50 datasheet")
# AMD Radeon Instinct MI60 datasheet: 29.5 TFLOPS fp16, 14.7 fp32, 7.4 fp64, 64 CUs, 32 GB.
MI60 = _gfx906(GFX906_MI60, 29.5, 14.7, 7.4, 64, 32, "AMD Radeon Instinct MI60 datasheet")
# AMD Radeon VII product page: 27.7 TFLOPS fp16, 13.8 fp32, 3.5 fp64 (1/4 rate), 60 CUs, 16 GB.
RADEON_VII = _gfx906(GFX906_RADEON_VII, 27.7, 13.8, 3.5, 60, 16, "AMD Radeon VII product page")
# AMD Radeon Pro VII product page: 26.1 TFLOPS fp16, 13.1 fp32, 6.5 fp64, 60 CUs, 16 GB.
RADEON_PRO_VII = _gfx906(GFX906_RADEON_PRO_VII, 26.1, 13.1, 6.5, 60, 16, "AMD Radeon Pro VII product page")

# NVIDIA H200 SXM datasheet: 989 TFLOPS dense fp16/bf16 tensor, 67 fp32, 67 fp64 tensor, 4.8 TB/s
# HBM3e, 141 GB, 132 SMs. Measured here (.library/device/KINDS.md): 788 TFLOP/s bf16 product,
# 4.3 TB/s device copy, i.e. 80% and 90% of the datasheet (see models.rates.MATMUL_EFFICIENCY).
H200 = CardSpec(
    name="NVIDIA H200", matrix_flops=_rates(989 * TERA, 989 * TERA, 67 * TERA, 67 * TERA),
    vector_flops=67 * TERA, bandwidth=4800 * GB, memory_bytes=141 * GB, compute_units=132,
    launch_overhead_s=CUDA_LAUNCH_OVERHEAD_S, source="NVIDIA H200 SXM datasheet; 788 TFLOP/s bf16 and "
    "4.3 TB/s measured on this workplace's H200",
)

KNOWN_CARDS: dict[str, CardSpec] = {
    spec.name: spec for spec in (MI50_16GB, MI50_32GB, MI60, RADEON_VII, RADEON_PRO_VII)
}

# A GPU nobody described: per-CU rates of the MI50 (AMD) or per-SM rates of the H200 halved (an
# unknown NVIDIA generation is likely older than Hopper), and a 1 TB/s memory. Guesses, marked so.
GENERIC_GPU_BANDWIDTH = 1000 * GB
GENERIC_NVIDIA_DERATE = 0.5


def generic_gpu_spec(identity: DeviceIdentity) -> CardSpec:
    """A clearly-marked guess from the CU/SM count and memory size."""
    units = max(identity.compute_units, 1)
    if identity.vendor == "AMD":
        base, scale = MI50_32GB, units / MI50_32GB.compute_units
    else:
        base, scale = H200, GENERIC_NVIDIA_DERATE * units / H200.compute_units
    rates = MappingProxyType({dtype: rate * scale for dtype, rate in base.matrix_flops.items()})
    return replace(
        base, name=identity.model_key, matrix_flops=rates, vector_flops=base.vector_flops * scale,
        bandwidth=GENERIC_GPU_BANDWIDTH, memory_bytes=identity.memory_bytes, compute_units=units,
        fused_attention=not identity.is_gfx906, estimated=True,
        source=f"generic GPU estimate scaled from {base.name} by {units} compute units (not a datasheet)",
    )


def spec_for(identity: DeviceIdentity, *, probe: bool = True, home: str | os.PathLike | None = None,
             probe_now: bool = True) -> CardSpec:
    """The spec sheet of `identity`'s card.

    Parameters
    ----------
    probe: for a CPU, its probed rates (`_cpu_probe.probe_cpu_spec`: matrix products, copy and
        softmax, kept per machine in the home `home`); False gives the probe-free constants (tests).
    probe_now: where this machine's rates are not kept yet, probe now (a fraction of a second);
        False: the probe-free constants, the probe running at the process's exit (the dispatcher).
    """
    if identity.device_type == "cpu":
        from attn_dispatch.models._cpu_probe import FALLBACK_CPU_SPEC, probe_cpu_spec

        spec = probe_cpu_spec(identity, home, now=probe_now) if probe else FALLBACK_CPU_SPEC
        return replace(spec, name=identity.model_key, memory_bytes=identity.memory_bytes or spec.memory_bytes)
    model = identity.model_key
    if model in KNOWN_CARDS:
        return KNOWN_CARDS[model]
    if "H200" in identity.name.upper() and identity.arch_base == "sm_90":
        return replace(H200, name=model, memory_bytes=identity.memory_bytes or H200.memory_bytes)
    return generic_gpu_spec(identity)
