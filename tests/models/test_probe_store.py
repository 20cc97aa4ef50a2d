"""Backend probes kept across processes (`models.probe_store`, its `ProbeCache`): only
passes are kept, per device identity and cuDNN version; a damaged or foreign file is ignored."""

from __future__ import annotations

import json

import pytest
import torch

from attn_dispatch.kernels import sdpa_default
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.priors import kernel_named
from attn_dispatch.models.probe_store import ProbeCache, load_passed, probe_file, save_passed

CARD = DeviceIdentity("cuda", "NVIDIA H200", "NVIDIA", "sm_90", 132, 140 * 2**30, torch_version="2.11.0")
OTHER_STACK = DeviceIdentity("cuda", "NVIDIA H200", "NVIDIA", "sm_90", 132, 140 * 2**30, torch_version="2.12.0")
PASSED = {("sdpa_flash", "cuda", "bfloat16", "plain"), ("sdpa_cudnn", "cuda", "float16", "causal")}


def test_passed_probes_round_trip_per_identity_and_cudnn_version(tmp_path):
    save_passed(CARD, "91002", PASSED, tmp_path)
    assert load_passed(CARD, "91002", tmp_path) == PASSED
    assert load_passed(CARD, "90100", tmp_path) == set()
    assert load_passed(OTHER_STACK, "91002", tmp_path) == set()


@pytest.mark.parametrize("content", [
    "not json", "[]", '{"format": 2}',
    json.dumps({"format": 1, "identity_key": "another card", "cudnn": "91002", "passed": []}),
    json.dumps({"format": 1, "identity_key": CARD.key, "cudnn": "91002", "passed": [["sdpa_flash", "cuda", 3, "plain"]]}),
    json.dumps({"format": 1, "identity_key": CARD.key, "cudnn": "91002", "passed": [["too", "short"]]}),
])
def test_a_damaged_or_foreign_file_keeps_nothing(tmp_path, content):
    path = probe_file(CARD, "91002", tmp_path, create=True)
    path.write_text(content)
    assert load_passed(CARD, "91002", tmp_path) == set()


@pytest.fixture
def clean_probes():
    sdpa_default.clear_probe_cache()
    yield
    sdpa_default.clear_probe_cache()


def test_seeded_probes_are_not_run_again(clean_probes, monkeypatch):
    ran = []
    monkeypatch.setattr(sdpa_default, "_run_probe", lambda kernel, *key: ran.append(key))
    sdpa_default.seed_passed_probes([("sdpa_flash", "cpu", "float32", "plain")])
    flash = kernel_named("sdpa_flash")
    assert sdpa_default.probe_backend(flash, "cpu", "float32", "plain") is None
    assert sdpa_default.probe_backend(flash, "cpu", "float32", "causal") is None  # ran: the stub returns None
    assert ran == [("cpu", "float32", "causal")]
    assert sdpa_default.passed_probes("cpu") == {("sdpa_flash", "cpu", "float32", "plain"),
                                               ("sdpa_flash", "cpu", "float32", "causal")}


def test_the_dispatchers_cache_seeds_and_writes_only_new_passes(clean_probes, monkeypatch, tmp_path):
    monkeypatch.setattr(DeviceIdentity, "detect", classmethod(lambda cls, device: CARD))
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    save_passed(CARD, "91002", PASSED, tmp_path)
    cache = ProbeCache.for_device(torch.device("cuda"), str(tmp_path))
    assert sdpa_default.passed_probes("cuda") == PASSED  # seeded
    stamp = probe_file(CARD, "91002", tmp_path).stat().st_mtime_ns
    cache.save_new()  # nothing new: no write
    assert probe_file(CARD, "91002", tmp_path).stat().st_mtime_ns == stamp
    failed_key = ("sdpa_efficient", "cuda", "float16", "plain")
    new_key = ("sdpa_math", "cuda", "float16", "plain")
    sdpa_default._results[failed_key] = "sdpa_efficient failed its plain probe"
    sdpa_default._results[new_key] = None
    cache.save_new()
    assert load_passed(CARD, "91002", tmp_path) == PASSED | {new_key}  # the failure is not kept


def test_a_cpus_passes_are_kept_too(clean_probes, tmp_path):
    cache = ProbeCache.for_device(torch.device("cpu"), str(tmp_path))
    key = ("sdpa_flash", "cpu", "float32", "plain")
    sdpa_default._results[key] = None
    cache.save_new()
    assert key in load_passed(DeviceIdentity.cpu(), "", tmp_path)
    sdpa_default.clear_probe_cache()
    ProbeCache.for_device(torch.device("cpu"), str(tmp_path))  # the next process
    assert key in sdpa_default.passed_probes("cpu")


def test_no_cache_on_other_devices_or_when_the_device_cannot_be_identified(monkeypatch, tmp_path):
    assert ProbeCache.for_device(torch.device("meta"), str(tmp_path)) is None

    def fails(cls, device):
        raise RuntimeError("no driver")

    monkeypatch.setattr(DeviceIdentity, "detect", classmethod(fails))
    assert ProbeCache.for_device(torch.device("cuda"), str(tmp_path)) is None



def test_a_file_written_by_another_release_is_not_read(tmp_path, monkeypatch):
    from attn_dispatch.models import probe_store

    monkeypatch.setattr(probe_store, "package_version", lambda: "0.0.1")
    old = save_passed(CARD, "91002", PASSED, tmp_path)
    monkeypatch.setattr(probe_store, "package_version", lambda: "0.0.2")
    assert load_passed(CARD, "91002", tmp_path) == set()
    other = probe_file(CARD, "91002", tmp_path, create=True)
    other.write_text(old.read_text())  # the old content under the new release's name
    assert load_passed(CARD, "91002", tmp_path) == set()
    assert not list(tmp_path.glob("probes/*.tmp"))  # no temporary file left behind
