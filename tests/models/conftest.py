"""Shared fixtures: faked device identities and small tables built once per test session."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from attn_dispatch.models.fit import fit_and_build
from attn_dispatch.models.identity import MI50_32GB, DeviceIdentity
from tests.models.synthetic import SYNTHETIC_KERNELS, synthetic_measurements

GIB = 2**30
# What ROCm reports for the boards (total_memory of a 16 GB / 32 GB HBM2 board is slightly
# under 16 / 32 GiB); names as libdrm's amdgpu.ids spells them.
FAKE_PROPS = {
    "mi50_16": dict(name="AMD Instinct MI60 / MI50", gcnArchName="gfx906:sramecc+:xnack-",
                    multi_processor_count=60, total_memory=17163091968),
    "mi50_32": dict(name="AMD Instinct MI60 / MI50", gcnArchName="gfx906:sramecc+:xnack-",
                    multi_processor_count=60, total_memory=34342961152),
    "mi60": dict(name="AMD Instinct MI60 / MI50", gcnArchName="gfx906:sramecc+:xnack-",
                 multi_processor_count=64, total_memory=34342961152),
    "radeon_vii": dict(name="AMD Radeon VII", gcnArchName="gfx906:sramecc-:xnack-",
                       multi_processor_count=60, total_memory=17163091968),
    "h200": dict(name="NVIDIA H200", multi_processor_count=132, total_memory=150_754_820_096, major=9, minor=0),
}
ROCM_STACK = dict(torch_version="2.5.1+rocm6.2", hip_version="6.2.41133", cuda_version=None)
OTHER_ROCM_STACK = dict(torch_version="2.6.0+rocm6.3", hip_version="6.3.42131", cuda_version=None)


def fake_identity(card: str, **stack) -> DeviceIdentity:
    """A faked device identity (`FAKE_PROPS` key) on a faked software stack."""
    props = SimpleNamespace(**{"major": 9, "minor": 0, **FAKE_PROPS[card]})
    if not stack:
        stack = ROCM_STACK if card != "h200" else dict(torch_version="2.11.0+cu130", cuda_version="13.0")
    return DeviceIdentity.from_properties(props, **stack)


@pytest.fixture(scope="session")
def mi50_table():
    """A table for a faked MI50 32GB, fitted on synthetic measurements of portable kernels."""
    identity = fake_identity("mi50_32")
    points = synthetic_measurements(40, seed=3, device_type="cuda")
    table, model, quality = fit_and_build(points, identity, kernel_names=SYNTHETIC_KERNELS, spec=MI50_32GB)
    return table


@pytest.fixture(scope="session")
def cpu_fit():
    """(table, model, quality, measurements) fitted on a synthetic CPU data set."""
    from attn_dispatch.models.probe_store import FALLBACK_CPU_SPEC

    points = synthetic_measurements(60, seed=5)
    table, model, quality = fit_and_build(points, DeviceIdentity.cpu(), kernel_names=SYNTHETIC_KERNELS,
                                          spec=FALLBACK_CPU_SPEC)
    return table, model, quality, points
