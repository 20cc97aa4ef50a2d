"""Measured per-shape set-up costs: stored per device, found for the same card model, shipped ones
last, damaged files skipped; the probe measures non-negative costs."""

from __future__ import annotations

import json

import pytest
import torch

from attn_dispatch.calibration.cold_shape import measure
from attn_dispatch.kernels import Problem, kernel_from_name
from attn_dispatch.models import probe_store
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.probe_store import load_cold_costs, save_cold_costs

CARD = DeviceIdentity("cuda", "NVIDIA H200", "NVIDIA", "sm_90", 132, 140 * 2**30, torch_version="2.11.0")
OTHER_STACK = DeviceIdentity("cuda", "NVIDIA H200", "NVIDIA", "sm_90", 132, 140 * 2**30, torch_version="2.12.0")


def test_stored_costs_are_found_for_the_device_and_its_card_model(tmp_path, monkeypatch):
    monkeypatch.setattr(probe_store, "BUNDLED_DIR", tmp_path / "none")
    save_cold_costs(CARD, {"sdpa_default": {"decode": 0.008, "prefill": 0.06}}, measured="2026-12-01", conditions={},
                    home=tmp_path)
    assert load_cold_costs(CARD, home=tmp_path) == {"sdpa_default": {"decode": 0.008, "prefill": 0.06}}
    assert load_cold_costs(OTHER_STACK, home=tmp_path)["sdpa_default"]["decode"] == 0.008  # same card model


def test_shipped_costs_serve_last_and_damaged_files_are_skipped(tmp_path, monkeypatch):
    bundled = tmp_path / "bundled"
    bundled.mkdir()
    monkeypatch.setattr(probe_store, "BUNDLED_DIR", bundled)
    from attn_dispatch.models.identity import slug

    (bundled / f"{slug(CARD.model_key)}.json").write_text(json.dumps(
        {"format": 1, "model_key": CARD.model_key, "seconds": {"sdpa_cudnn": {"decode": 0.01}}}))
    home = tmp_path / "home"
    own = home / "cold_shape" / slug(CARD.model_key)
    own.mkdir(parents=True)
    (own / f"{CARD.key}.json").write_text("{not json")
    assert load_cold_costs(CARD, home=home) == {"sdpa_cudnn": {"decode": 0.01}}


@pytest.mark.parametrize("bad", [{"k": {"decode": -1.0}}, {"k": {"other": 1.0}}, {"k": {"decode": float("nan")}},
                                 {"k": 1.0}])
def test_invalid_costs_are_refused_when_saving(tmp_path, bad):
    with pytest.raises(ValueError, match="cold-shape"):
        save_cold_costs(CARD, bad, measured="now", conditions={}, home=tmp_path)


def test_the_probe_measures_non_negative_costs_on_the_cpu():
    problems = {"decode": Problem(1, 2, 1, 1, 64, 16, 16, "float32"),
                "prefill": Problem(1, 2, 2, 16, 16, 16, 16, "float32", causal=True)}
    result = measure(torch.device("cpu"), [kernel_from_name("math"), kernel_from_name("small_q[splits=4]")], problems)
    assert set(result["seconds"]["math"]) == {"decode", "prefill"}
    assert all(s >= 0 for by_kind in result["seconds"].values() for s in by_kind.values())
    assert "small_q[splits=4] prefill" in result["skipped"] or "prefill" in result["seconds"]["small_q[splits=4]"]
