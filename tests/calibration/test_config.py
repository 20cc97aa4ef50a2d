"""Device identity (from faked properties) as calibration uses it: the key stamped on every
measurement and the calibration id."""

from __future__ import annotations

from types import SimpleNamespace

from attn_dispatch.calibration.config import CalibrationConfig
from attn_dispatch.models.identity import DeviceIdentity

MI50_PROPS = SimpleNamespace(
    name="AMD Instinct MI60 / MI50", gcnArchName="gfx906:sramecc+:xnack-", multi_processor_count=60,
    total_memory=32 * 2**30, major=9, minor=0,
)


def test_faked_gfx906_properties():
    card = DeviceIdentity.from_properties(MI50_PROPS, torch_version="2.4.1", hip_version="6.2.4", cuda_version="")
    assert card.vendor == "AMD" and card.arch_base == "gfx906" and card.is_gfx906
    assert card.family_key == "gfx906"
    assert "hip-6.2.4" in card.software_key and "torch-2.4.1" in card.software_key
    assert DeviceIdentity.from_dict(card.to_dict()) == card


def test_calibration_id_holds_the_device_key_and_changes_with_the_stack():
    config = CalibrationConfig(devices=("cuda:0",))
    old = DeviceIdentity.from_properties(MI50_PROPS, torch_version="2.4.1", hip_version="6.2.4", cuda_version="")
    new = DeviceIdentity.from_properties(MI50_PROPS, torch_version="2.5.0", hip_version="6.2.4", cuda_version="")
    assert old.key in config.calibration_id(old)
    assert config.calibration_id(old) != config.calibration_id(new)
    # options that change timings or the sample change the id; the device list does not
    assert config.calibration_id(old) != CalibrationConfig(devices=("cuda:0",), kernels="portable").calibration_id(old)
    assert config.calibration_id(old) == CalibrationConfig(devices=("cuda:0", "cuda:1")).calibration_id(old)
