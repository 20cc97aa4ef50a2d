"""The absolute busy signal: this process's CPU share during the reference probe, with the clocks
faked (deterministic: no timing assertions, no real load)."""

from __future__ import annotations

import pytest

import attn_dispatch.calibration.noise as cpu_share
import attn_dispatch.calibration.noise as noise_module
from attn_dispatch.calibration.noise import ShareMeter, cores_in_use, host_share, load_per_cpu
from attn_dispatch.calibration.noise import BUSY_CPU_SHARE, STOP_CPU_SHARE, probe_noise


def fake_clock(*readings: float):
    """A clock returning `readings` in order (each call takes the next)."""
    values = iter(readings)
    return lambda: next(values)


def test_share_is_cpu_time_over_wall_time_times_cores(monkeypatch):
    monkeypatch.setattr(cpu_share, "process_time", fake_clock(10.0, 10.5))  # 0.5 s of CPU
    monkeypatch.setattr(cpu_share, "perf_counter", fake_clock(100.0, 101.0))  # over 1 s of wall
    with ShareMeter(2) as meter:
        pass
    assert meter.share == pytest.approx(0.25)


def test_a_clock_that_did_not_move_gives_a_finite_share(monkeypatch):
    monkeypatch.setattr(cpu_share, "process_time", fake_clock(1.0, 1.0))
    monkeypatch.setattr(cpu_share, "perf_counter", fake_clock(5.0, 5.0))
    with ShareMeter(1) as meter:
        pass
    assert meter.share == 0.0


def test_host_share_is_the_threads_cpu_time_over_wall_time(monkeypatch):
    monkeypatch.setattr(cpu_share, "thread_time", fake_clock(0.0, 0.03))
    monkeypatch.setattr(cpu_share, "perf_counter", fake_clock(0.0, 0.1))
    assert host_share(iterations=10) == pytest.approx(0.3)


def test_cores_in_use_are_torchs_threads_capped_by_the_cpus(monkeypatch):
    monkeypatch.setattr(cpu_share.torch, "get_num_threads", lambda: 64)
    monkeypatch.setattr(cpu_share.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert cores_in_use() == 2
    monkeypatch.setattr(cpu_share.torch, "get_num_threads", lambda: 1)
    assert cores_in_use() == 1


def test_load_per_cpu_and_its_absence(monkeypatch):
    monkeypatch.setattr(cpu_share.os, "getloadavg", lambda: (3.0, 2.0, 1.0), raising=False)
    monkeypatch.setattr(cpu_share.os, "cpu_count", lambda: 2)
    assert load_per_cpu() == 1.5

    def unavailable():
        raise OSError("no load average here")

    monkeypatch.setattr(cpu_share.os, "getloadavg", unavailable, raising=False)
    assert load_per_cpu() is None


def starved_probe(monkeypatch, share: float, device: str = "cpu"):
    """The real reference probe on the CPU, its clocks faked to give `share` of 2 cores."""
    monkeypatch.setattr(noise_module, "cores_in_use", lambda: 2)
    monkeypatch.setattr(cpu_share, "process_time", fake_clock(0.0, 2 * share))
    monkeypatch.setattr(cpu_share, "perf_counter", fake_clock(0.0, 1.0))
    return probe_noise(device)


def test_a_steady_but_starved_probe_is_too_busy(monkeypatch):
    """Issue 15: every sample uniformly slow (spread small), the process getting a fifth of its cores."""
    noise = starved_probe(monkeypatch, STOP_CPU_SHARE / 2)
    assert noise.cpu_share == pytest.approx(STOP_CPU_SHARE / 2) and noise.cores == 2 and not noise.host_only
    assert noise.busy and noise.too_busy
    assert noise.describe().startswith("too busy to calibrate:") and "CPU share" in noise.describe()


def test_a_share_between_the_thresholds_is_busy_not_too_busy():
    noise = probe_noise("cpu", samples=[1.0] * 15, cpu_share=(BUSY_CPU_SHARE + STOP_CPU_SHARE) / 2)
    assert noise.spread == 0.0 and noise.starved and noise.busy and not noise.too_busy
    assert noise.describe().startswith("busy:")


def test_a_full_share_leaves_the_verdict_to_the_spread():
    steady = probe_noise("cpu", samples=[1.0] * 15, cpu_share=1.0)
    assert not steady.starved and not steady.busy and steady.describe().startswith("quiet:")


def test_on_a_gpu_the_host_threads_share_widens_but_never_stops_alone():
    """The GPU's kernel times do not depend on the host's share; its launches do."""
    noise = probe_noise("cuda", samples=[1e-3] * 15, cpu_share=STOP_CPU_SHARE / 4)
    assert noise.host_only and noise.busy and not noise.too_busy
    assert "never stops alone" in noise.describe()
