"""What a device is: the card (or CPU) and the software stack that runs it.

`DeviceIdentity` is what tables are keyed by: `model_key` (the card model, e.g. "AMD Instinct
MI50 32GB"), `family_key` (e.g. "gfx906", "sm_90", "cpu-x86_64"), `software_key` (torch, HIP,
CUDA, driver) and `key` (model + software, filesystem-safe). It lives in `models` because the
dispatcher needs it at inference time and must not import `calibration`.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from attn_dispatch.models._card_names import generic_model, gfx906_model, slug

DEVICE_TYPES = ("cpu", "cuda")
MAX_TEXT = 200  # longest string field accepted from a (possibly hostile) table
GFX906 = "gfx906"
_NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")
_AMDGPU_DRIVER_FILE = Path("/sys/module/amdgpu/version")


@dataclass(frozen=True)
class DeviceIdentity:
    """A device and its software stack (JSON: `to_dict` / `from_dict`).

    Attributes
    ----------
    device_type: "cuda" (CUDA and ROCm builds alike) or "cpu".
    name: the name the driver reports, e.g. "AMD Instinct MI60 / MI50", "NVIDIA H200".
    vendor: "AMD", "NVIDIA", or the CPU vendor.
    arch: ROCm ``gcnArchName`` (``gfx906:sramecc+:xnack-``), CUDA ``sm_90``, CPU machine name.
    compute_units: CUs (AMD), SMs (NVIDIA) or logical CPUs (``os.cpu_count()``).
    memory_bytes: total device memory (system RAM for a CPU).
    torch_version, hip_version, cuda_version, driver: the software stack ("" when absent).
    """

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
        parts = [f"torch-{self.torch_version or 'unknown'}"]
        if self.hip_version:
            parts.append(f"hip-{self.hip_version}")
        if self.cuda_version:
            parts.append(f"cuda-{self.cuda_version}")
        if self.driver:
            parts.append(f"driver-{self.driver}")
        return "_".join(parts)

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
        """From ``torch.cuda.get_device_properties`` output or a fake with the same attributes
        (name, gcnArchName, multi_processor_count, total_memory, major, minor).

        Versions default to this process's torch build.
        """
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
