"""The CPU probe (`models.cpu_probe`) kept in the home per machine (`models.probe_store`), and never run
inside a dispatcher's call (`models.probe_store.probe_cpu_spec` with ``now=False``)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from attn_dispatch.models import cpu_probe, probe_store
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.probe_store import (
    FALLBACK_CPU_SPEC,
    PROBE_AT_EXIT,
    load_cpu_rates,
    probe_cpu_spec,
    probe_path,
    save_cpu_rates,
)

MEASURED = replace(FALLBACK_CPU_SPEC, bandwidth=12.5e9, estimated=False, source="measured by this machine's probe")


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    monkeypatch.setattr(probe_store, "_measured", {})
    monkeypatch.setattr(probe_store, "_waiting", set())


def test_kept_rates_serve_the_same_machine_only(tmp_path):
    cpu = DeviceIdentity.cpu()
    save_cpu_rates(cpu, 2, MEASURED, tmp_path)
    kept = load_cpu_rates(cpu, 2, FALLBACK_CPU_SPEC, tmp_path)
    assert kept.bandwidth == 12.5e9 and not kept.estimated and kept.compute_units == 2
    assert load_cpu_rates(cpu, 1, FALLBACK_CPU_SPEC, tmp_path) is None  # another thread count
    resized = replace(cpu, memory_bytes=cpu.memory_bytes + 2**30)
    assert load_cpu_rates(resized, 2, FALLBACK_CPU_SPEC, tmp_path) is None  # another machine
    upgraded = replace(cpu, torch_version="9.9.9")
    assert load_cpu_rates(upgraded, 2, FALLBACK_CPU_SPEC, tmp_path) is None  # another torch


@pytest.mark.parametrize("text", ["not json", "{}", '{"format": 1, "machine": "other"}', "[]"])
def test_a_damaged_or_foreign_file_is_ignored(tmp_path, text):
    cpu = DeviceIdentity.cpu()
    save_cpu_rates(cpu, 2, MEASURED, tmp_path)
    probe_path(cpu, 2, tmp_path).write_text(text)
    assert load_cpu_rates(cpu, 2, FALLBACK_CPU_SPEC, tmp_path) is None
    document = {"format": 1, "machine": probe_path(cpu, 2, tmp_path).stem,
                "spec": {"matrix_flops": {"float32": -1}, "vector_flops": 1, "bandwidth": 1, "launch_overhead_s": 1,
                         "source": "x"}}
    probe_path(cpu, 2, tmp_path).write_text(json.dumps(document))
    assert load_cpu_rates(cpu, 2, FALLBACK_CPU_SPEC, tmp_path) is None  # a rate that is no rate


def test_the_dispatchers_probe_waits_for_the_exit(tmp_path, monkeypatch):
    registered = []
    monkeypatch.setattr(probe_store.atexit, "register", lambda *args: registered.append(args))
    monkeypatch.setattr(cpu_probe, "measure_cpu_spec", lambda: pytest.fail("probed inside a call"))
    spec = probe_cpu_spec(root=tmp_path, now=False)
    assert spec.estimated and spec.source.endswith(PROBE_AT_EXIT)
    probe_cpu_spec(root=tmp_path, now=False)
    assert len(registered) == 1  # one probe at exit per home and thread count
    monkeypatch.setattr(cpu_probe, "measure_cpu_spec", lambda: MEASURED)
    function, *args = registered[0]
    function(*args)  # the exit
    assert probe_path(DeviceIdentity.cpu(), torch.get_num_threads(), tmp_path).is_file()
    monkeypatch.setattr(probe_store, "_measured", {})  # the next process
    assert probe_cpu_spec(root=tmp_path, now=False).bandwidth == MEASURED.bandwidth


def test_calibration_probes_now_and_keeps_it(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_probe, "measure_cpu_spec", lambda: MEASURED)
    assert probe_cpu_spec(root=tmp_path).bandwidth == MEASURED.bandwidth
    monkeypatch.setattr(cpu_probe, "measure_cpu_spec", lambda: pytest.fail("probed twice"))
    assert probe_cpu_spec(root=tmp_path).bandwidth == MEASURED.bandwidth


def test_a_failed_probe_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_probe, "measure_cpu_spec", lambda: FALLBACK_CPU_SPEC)
    probe_cpu_spec(root=tmp_path)
    assert not probe_path(DeviceIdentity.cpu(), torch.get_num_threads(), tmp_path).exists()
