"""DeviceIdentity: model / family / software keys from faked ROCm and CUDA properties (no gfx906
card is available: these are the names and sizes ROCm documents, unmeasured)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from attn_dispatch.models.identity import DeviceIdentity
from tests.models.conftest import OTHER_ROCM_STACK, fake_identity


@pytest.mark.parametrize(
    ("card", "model"),
    [
        ("mi50_16", "AMD Instinct MI50 16GB"),
        ("mi50_32", "AMD Instinct MI50 32GB"),
        ("mi60", "AMD Instinct MI60 32GB"),
        ("radeon_vii", "AMD Radeon VII 16GB"),
        ("h200", "NVIDIA H200 140GB"),
    ],
)
def test_model_key_from_name_cus_and_memory(card, model):
    assert fake_identity(card).model_key == model


def test_gfx906_family_and_keys():
    mi50, mi60, vii = fake_identity("mi50_32"), fake_identity("mi60"), fake_identity("radeon_vii")
    assert mi50.family_key == mi60.family_key == vii.family_key == "gfx906"
    assert mi50.vendor == "AMD" and mi50.arch == "gfx906:sramecc+:xnack-"
    assert mi50.software_key == "torch-2.5.1+rocm6.2_hip-6.2.41133"
    assert mi50.key != fake_identity("mi50_32", **OTHER_ROCM_STACK).key
    assert mi50.model_key == fake_identity("mi50_32", **OTHER_ROCM_STACK).model_key


def test_ambiguous_vega20_gets_an_honest_label():
    props = SimpleNamespace(name="Vega 20", gcnArchName="gfx906", multi_processor_count=60, total_memory=17163091968)
    identity = DeviceIdentity.from_properties(props, torch_version="2.5", hip_version="6.2")
    assert identity.model_key == "AMD gfx906 60CU 16GB"
    assert identity.family_key == "gfx906"


def test_radeon_pro_vii_and_cuda_arch():
    props = SimpleNamespace(name="AMD Radeon Pro VII", gcnArchName="gfx906:sramecc+:xnack-",
                            multi_processor_count=60, total_memory=17163091968)
    assert DeviceIdentity.from_properties(props, torch_version="2.5", hip_version="6.2").model_key == "AMD Radeon Pro VII 16GB"
    h200 = fake_identity("h200")
    assert (h200.vendor, h200.arch, h200.family_key) == ("NVIDIA", "sm_90", "sm_90")
    a100 = DeviceIdentity.from_properties(SimpleNamespace(name="NVIDIA A100-SXM4-80GB", multi_processor_count=108,
                                                          total_memory=85e9, major=8, minor=0), cuda_version="12.4")
    assert a100.model_key == "NVIDIA A100-SXM4-80GB"


def test_key_is_filesystem_safe():
    for card in ("mi50_16", "mi60", "radeon_vii", "h200"):
        key = fake_identity(card).key
        assert re.fullmatch(r"[a-z0-9._-]+__[a-z0-9._-]+", key), key
        assert not key.startswith(".") and len(key) <= 160


def test_cpu_detect_and_round_trip():
    cpu = DeviceIdentity.detect("cpu")
    assert cpu.device_type == "cpu" and cpu.compute_units >= 1
    assert cpu.family_key.startswith("cpu-")
    assert DeviceIdentity.from_dict(cpu.to_dict()) == cpu
    mi60 = fake_identity("mi60")
    assert DeviceIdentity.from_dict(mi60.to_dict()) == mi60


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"device_type": "tpu"}, "device_type"),
        ({"compute_units": -1}, "compute_units"),
        ({"compute_units": True}, "compute_units"),
        ({"name": 5}, "name"),
        ({"name": "x" * 1000}, "name"),
        ({"extra": 1}, "unknown"),
    ],
)
def test_from_dict_rejects_bad_fields(change, message):
    data = {**fake_identity("mi50_16").to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        DeviceIdentity.from_dict(data)


def test_detect_rejects_other_device_types():
    with pytest.raises(ValueError, match="cpu or cuda"):
        DeviceIdentity.detect("meta")
