"""What a device is: `DeviceIdentity` (card or CPU and software stack; its keys name tables) and
`CardSpec` (a card's spec sheet, each number with its source; `spec_for` finds a device's, a CPU's
from its probed rates). gfx906 model names follow AMD's published specs.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType

import torch

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
    """The normalised model of a gfx906 board (an ambiguous 60-CU 16 GB board gets a generic label)."""
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


DEVICE_TYPES = ("cpu", "cuda")
MAX_TEXT = 200  # longest string field accepted from a (possibly hostile) table
GFX906 = "gfx906"
_NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")
_AMDGPU_DRIVER_FILE = Path("/sys/module/amdgpu/version")


@dataclass(frozen=True)
class DeviceIdentity:
    """A device and its software stack (JSON: `to_dict` / `from_dict`). `device_type`: "cuda" (CUDA
    and ROCm) or "cpu"; `arch`: ``gcnArchName``, ``sm_90`` or the CPU machine; `compute_units`: CUs,
    SMs or logical CPUs; `memory_bytes`: device memory (RAM for a CPU); versions "" when absent."""

    device_type: str
    name: str
    vendor: str
    arch: str
    compute_units: int
    memory_bytes: int
    torch_version: str = ""
    hip_version: str = ""
    cuda_version: str = ""
    driver: str = ""

    def __post_init__(self) -> None:
        if self.device_type not in DEVICE_TYPES:
            raise ValueError(f"DeviceIdentity.device_type must be one of {DEVICE_TYPES}, got {self.device_type!r}")
        for item in fields(self):
            value = getattr(self, item.name)
            if item.type == "str" and (not isinstance(value, str) or len(value) > MAX_TEXT):
                raise ValueError(f"DeviceIdentity.{item.name} must be a string of at most {MAX_TEXT} characters, got {value!r}")
            if item.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"DeviceIdentity.{item.name} must be a non-negative integer, got {value!r}")

    # ------------------------------------------------------------------ keys
    @property
    def arch_base(self) -> str:
        """The architecture without feature flags: ``gfx906:sramecc+:xnack-`` -> ``gfx906``."""
        return self.arch.split(":", 1)[0].strip()

    @property
    def is_gfx906(self) -> bool:
        return self.device_type == "cuda" and self.arch_base == GFX906

    @property
    def model_key(self) -> str:
        """The card model, normalised (owners of the same model share tables)."""
        if self.device_type == "cpu":
            return f"{' '.join(self.name.split()) or 'CPU'} ({self.compute_units} threads)"
        if self.is_gfx906:
            return gfx906_model(self.name, self.compute_units, self.memory_bytes)
        return generic_model(self.name, self.memory_bytes)

    @property
    def family_key(self) -> str:
        """Cards whose tables can stand in for each other, scaled (e.g. all gfx906 boards)."""
        if self.device_type == "cpu":
            return f"cpu-{self.arch or 'unknown'}"
        return self.arch_base or "unknown-gpu"

    @property
    def software_key(self) -> str:
        stack = (("hip", self.hip_version), ("cuda", self.cuda_version), ("driver", self.driver))
        return "_".join([f"torch-{self.torch_version or 'unknown'}", *(f"{name}-{value}" for name, value in stack if value)])

    @property
    def key(self) -> str:
        """Exact card model + software stack, filesystem-safe."""
        return f"{slug(self.model_key, max_length=80)}__{slug(self.software_key, max_length=78)}"

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> DeviceIdentity:
        """Inverse of `to_dict`; raises ValueError naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"a device identity must be a JSON object, got {type(data).__name__}")
        known = {item.name for item in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown device identity fields {sorted(unknown)}; known: {sorted(known)}")
        missing = {"device_type", "name", "vendor", "arch", "compute_units", "memory_bytes"} - set(data)
        if missing:
            raise ValueError(f"device identity is missing fields {sorted(missing)}")
        return cls(**data)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_properties(
        cls,
        props: object,
        *,
        torch_version: str | None = None,
        hip_version: str | None = None,
        cuda_version: str | None = None,
        driver: str = "",
    ) -> DeviceIdentity:
        """From ``torch.cuda.get_device_properties`` (or a fake with its attributes); versions
        default to this process's torch build."""
        if hip_version is None and cuda_version is None:
            hip_version, cuda_version = torch.version.hip or "", torch.version.cuda or ""
        gcn = str(getattr(props, "gcnArchName", "") or "")
        is_amd = gcn.startswith("gfx") or bool(hip_version)
        arch = gcn if gcn.startswith("gfx") else f"sm_{getattr(props, 'major', 0)}{getattr(props, 'minor', 0)}"
        return cls(
            device_type="cuda",
            name=str(getattr(props, "name", ""))[:MAX_TEXT],
            vendor="AMD" if is_amd else "NVIDIA",
            arch=arch[:MAX_TEXT],
            compute_units=int(getattr(props, "multi_processor_count", 0)),
            memory_bytes=int(getattr(props, "total_memory", 0)),
            torch_version=torch_version if torch_version is not None else torch.__version__,
            hip_version=hip_version or "",
            cuda_version=cuda_version or "",
            driver=driver,
        )

    @classmethod
    def cpu(cls) -> DeviceIdentity:
        """This machine's CPU."""
        name, vendor = _cpu_name_and_vendor()
        return cls(
            device_type="cpu",
            name=name[:MAX_TEXT],
            vendor=vendor[:MAX_TEXT],
            arch=platform.machine() or "unknown",
            compute_units=os.cpu_count() or 1,
            memory_bytes=_system_memory_bytes(),
            torch_version=torch.__version__,
        )

    @classmethod
    def detect(cls, device: torch.device | str = "cpu") -> DeviceIdentity:
        """The identity of `device` in this process ("cpu", "cuda", "cuda:1", ...)."""
        device = torch.device(device)
        if device.type == "cpu":
            return cls.cpu()
        if device.type != "cuda":
            raise ValueError(f"device must be a cpu or cuda device, got {device}; other device types are not supported yet")
        props = torch.cuda.get_device_properties(device)
        return cls.from_properties(props, driver=_read_driver())


def torch_threads(count: int) -> str:
    """``1`` -> ``"1 torch thread"``, ``2`` -> ``"2 torch threads"``: the intra-op threads torch
    timed with, as distinct from the logical CPUs a CPU's `DeviceIdentity.model_key` counts."""
    return f"{count} torch thread" + ("" if count == 1 else "s")


def _cpu_name_and_vendor() -> tuple[str, str]:
    name, vendor = platform.processor() or "", platform.system() or ""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return name or "CPU", vendor
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            name = value.strip()
        elif key.strip() == "vendor_id" and value.strip():
            vendor = value.strip()
        if name and vendor and key.strip() == "model name":
            break
    return name or "CPU", vendor


def _system_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def _read_driver() -> str:
    """The GPU kernel driver version where the OS exposes it, else ""."""
    for path in (_NVIDIA_DRIVER_FILE, _AMDGPU_DRIVER_FILE):
        try:
            text = path.read_text(errors="replace").strip()
        except OSError:
            continue
        for word in text.split():
            if word[:1].isdigit() and "." in word:
                return word[:MAX_TEXT]
    return ""


TERA = 1e12
GB = 10**9

# Per-launch cost of one eager PyTorch op on a GPU (H200; docs/RESULTS.md#where-the-priors-constants-come-from).
CUDA_LAUNCH_OVERHEAD_S = 8e-6
# HIP launches are commonly reported slower than CUDA's; unmeasured here (no gfx906 card): +25%.
HIP_LAUNCH_OVERHEAD_S = 10e-6


@dataclass(frozen=True, eq=False)
class CardSpec:
    """Peak rates of one card model: `matrix_flops` per dtype name, `vector_flops` (fp32
    elementwise), `bandwidth` (B/s), `compute_units` (CUs / SMs / CPU threads), `launch_overhead_s`
    (one eager op), `fused_attention` (PyTorch ships fused SDPA here; not gfx906), `source`, and
    `estimated` (a guess, not a datasheet or probe)."""

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
# HBM3e, 141 GB, 132 SMs (the ceilings measured on one: `models.rates.MATMUL_EFFICIENCY`).
H200 = CardSpec(
    name="NVIDIA H200", matrix_flops=_rates(989 * TERA, 989 * TERA, 67 * TERA, 67 * TERA),
    vector_flops=67 * TERA, bandwidth=4800 * GB, memory_bytes=141 * GB, compute_units=132,
    launch_overhead_s=CUDA_LAUNCH_OVERHEAD_S, source="NVIDIA H200 SXM datasheet; 788 TFLOP/s bf16 and "
    "4.3 TB/s measured on this workplace's H200",
)

# NVIDIA H100 datasheet: SXM 989 TFLOPS dense fp16/bf16 tensor, 67 fp32, 67 fp64 tensor, 3.35 TB/s HBM3,
# 80 GB, 132 SMs; PCIe 756 / 51 / 51 TFLOPS, 2.0 TB/s HBM2e, 80 GB, 114 SMs.
H100_SXM = CardSpec(
    name="NVIDIA H100 SXM", matrix_flops=_rates(989 * TERA, 989 * TERA, 67 * TERA, 67 * TERA),
    vector_flops=67 * TERA, bandwidth=3350 * GB, memory_bytes=80 * GB, compute_units=132,
    launch_overhead_s=CUDA_LAUNCH_OVERHEAD_S, source="NVIDIA H100 SXM datasheet",
)
H100_PCIE = CardSpec(
    name="NVIDIA H100 PCIe", matrix_flops=_rates(756 * TERA, 756 * TERA, 51 * TERA, 51 * TERA),
    vector_flops=51 * TERA, bandwidth=2000 * GB, memory_bytes=80 * GB, compute_units=114,
    launch_overhead_s=CUDA_LAUNCH_OVERHEAD_S, source="NVIDIA H100 PCIe datasheet",
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
    """The spec sheet of `identity`'s card. A CPU's: its probed rates (`probe_store.probe_cpu_spec`,
    kept in `home`; `probe=False`: the probe-free constants); `probe_now=False` defers an unkept
    probe to the process's exit (the dispatcher)."""
    if identity.device_type == "cpu":
        from attn_dispatch.models.probe_store import FALLBACK_CPU_SPEC, probe_cpu_spec

        spec = probe_cpu_spec(identity, home, now=probe_now) if probe else FALLBACK_CPU_SPEC
        return replace(spec, name=identity.model_key, memory_bytes=identity.memory_bytes or spec.memory_bytes)
    model = identity.model_key
    if model in KNOWN_CARDS:
        return KNOWN_CARDS[model]
    if "H200" in identity.name.upper() and identity.arch_base == "sm_90":
        return replace(H200, name=model, memory_bytes=identity.memory_bytes or H200.memory_bytes)
    if "H100" in identity.name.upper() and identity.arch_base == "sm_90":
        spec = H100_PCIE if identity.compute_units == H100_PCIE.compute_units else H100_SXM
        return replace(spec, name=model, memory_bytes=identity.memory_bytes or spec.memory_bytes)
    return generic_gpu_spec(identity)
