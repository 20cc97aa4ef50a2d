"""Kept backend probes on a host with two different GPUs: probes run on the current CUDA device
and are keyed by device type (`kernels.sdpa_default`), so a file must neither vouch for another
card (its passes seeded as this process's "cuda" passes) nor record passes made on the current
card under another card's identity, where a later process on that card alone would trust them
unprobed. A file's entries for another device type are not seeded either."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.kernels import sdpa_default
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.probe_store import ProbeCache, load_passed, save_passed

FIRST = DeviceIdentity("cuda", "NVIDIA H200", "NVIDIA", "sm_90", 132, 140 * 2**30, torch_version="2.11.0")
SECOND = DeviceIdentity("cuda", "Tesla V100-SXM2-32GB", "NVIDIA", "sm_70", 80, 32 * 2**30, torch_version="2.11.0")
FLASH = ("sdpa_flash", "cuda", "bfloat16", "plain")


@pytest.fixture
def two_cards(monkeypatch, tmp_path):
    """cuda:0 is `FIRST` (the current device), cuda:1 is `SECOND`; the probes' home is `tmp_path`."""
    sdpa_default.clear_probe_cache()
    monkeypatch.setattr(DeviceIdentity, "detect", classmethod(lambda cls, device: SECOND if device.index == 1 else FIRST))
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    yield str(tmp_path)
    sdpa_default.clear_probe_cache()


def test_passes_made_on_the_current_card_are_not_kept_as_another_cards(two_cards):
    ProbeCache.for_device(torch.device("cuda", 0), two_cards)
    second = ProbeCache.for_device(torch.device("cuda", 1), two_cards)
    sdpa_default._results[FLASH] = None  # flash passed its probe, which ran on cuda:0
    if second is not None:
        second.save_new()
    assert load_passed(SECOND, "91002", two_cards) == set()


def test_another_cards_file_does_not_vouch_for_the_current_card(two_cards):
    save_passed(SECOND, "91002", {FLASH}, two_cards)
    ProbeCache.for_device(torch.device("cuda", 1), two_cards)
    assert sdpa_default.passed_probes("cuda") == set()


def test_a_files_entries_for_another_device_type_are_not_seeded(two_cards):
    save_passed(FIRST, "91002", {FLASH, ("sdpa_flash", "cpu", "float32", "plain")}, two_cards)
    ProbeCache.for_device(torch.device("cuda", 0), two_cards)
    assert sdpa_default.passed_probes("cuda") == {FLASH}
    assert sdpa_default.passed_probes("cpu") == set()
