"""The busy-machine probe (`calibration.noise`): the reference point's spread and this process's CPU
share (clocks faked), their words, widened samples when busy, and a clear stop (no measurement, no
table) when too busy unless the user allows it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import attn_dispatch.calibration.noise as noise_module
import attn_dispatch.calibration.session as session
from attn_dispatch.calibration.noise import (
    BUSY_CPU_SHARE,
    BUSY_SPREAD,
    SPREAD_AS_MULTIPLE,
    STOP_CPU_SHARE,
    STOP_SPREAD,
    MachineBusy,
    Noise,
    ShareMeter,
    check_quiet,
    cores_in_use,
    host_share,
    load_per_cpu,
    probe_noise,
    spread_words,
    widened,
)
from attn_dispatch.calibration.session import calibrate
from attn_dispatch.calibration.timer import QUICK
from attn_dispatch.dispatcher.cli import main
from attn_dispatch.kernels.math_kernel import MathKernel
from tests.calibration.helpers import small_config

QUIET = Noise(median_s=2e-3, spread=BUSY_SPREAD / 4)
BUSY = Noise(median_s=2e-3, spread=(BUSY_SPREAD + STOP_SPREAD) / 2)
TOO_BUSY = Noise(median_s=2e-3, spread=STOP_SPREAD * 2)
# Issue 15's machine: every sample alike (no spread) but this process gets a fraction of its cores.
STARVED = Noise(median_s=0.2, spread=0.0, cpu_share=STOP_CPU_SHARE / 2, cores=2, load_per_cpu=2.0)


def test_spread_is_the_relative_interquartile_range_of_the_samples():
    steady = probe_noise("cpu", samples=[1.0] * 14 + [9.0])  # one context switch moves no quartile
    assert steady.spread == 0.0 and not steady.busy
    jittery = probe_noise("cpu", samples=[1.0, 2.0] * 7 + [1.5])
    assert jittery.median_s == 1.5 and jittery.spread == pytest.approx(1.0 / 1.5) and jittery.too_busy


def test_the_real_probe_gives_a_time_and_a_spread():
    noise = probe_noise("cpu")
    assert noise.median_s > 0 and math.isfinite(noise.spread) and noise.spread >= 0
    assert noise.cpu_share is not None and noise.cpu_share >= 0 and not noise.host_only and noise.cores >= 1
    assert noise.describe().split(":")[0] in ("quiet", "busy", "too busy to calibrate")


def test_too_busy_stops_with_what_to_do_unless_allowed():
    with pytest.raises(MachineBusy, match="--allow-busy"):
        check_quiet(TOO_BUSY, allow_busy=False)
    check_quiet(TOO_BUSY, allow_busy=True)
    check_quiet(BUSY, allow_busy=False)


def test_a_starved_probe_suggests_fewer_threads_only_where_a_core_is_left_free():
    one_of_two = Noise(median_s=0.2, spread=STOP_SPREAD * 2, cpu_share=2 / 3, cores=2)  # one other busy thread
    with pytest.raises(MachineBusy, match="try --threads 1 to measure on the core other work leaves free") as raised:
        check_quiet(one_of_two, allow_busy=False)
    assert "of the 2 cores its threads used" in str(raised.value) and len(str(raised.value).splitlines()) == 1
    assert "--allow-busy always measures" in str(raised.value) and "PyTorch's default keeps serving" in str(raised.value)
    half_of_eight = Noise(median_s=0.2, spread=0.0, cpu_share=0.8 * STOP_CPU_SHARE, cores=8)  # ~11 others on 8 cores
    with pytest.raises(MachineBusy) as raised:
        check_quiet(half_of_eight, allow_busy=False)
    assert "--threads" not in str(raised.value)  # every core is taken: fewer threads would be starved as well
    with pytest.raises(MachineBusy) as raised:
        check_quiet(STARVED, allow_busy=False)
    assert "--threads" not in str(raised.value) and "--allow-busy" in str(raised.value)
    most_of_sixteen = Noise(median_s=0.2, spread=0.0, cpu_share=0.5, cores=16)  # 16 others: a few cores' share left
    with pytest.raises(MachineBusy, match="try --threads 2 to measure on the 2 cores"):
        check_quiet(most_of_sixteen, allow_busy=False)
    jittery_but_fed = Noise(median_s=0.2, spread=STOP_SPREAD * 2, cpu_share=1.0, cores=2)
    with pytest.raises(MachineBusy, match="try --threads 1 "):  # fewer than it used, whatever its share
        check_quiet(jittery_but_fed, allow_busy=False)
    one_core = Noise(median_s=0.2, spread=0.0, cpu_share=STOP_CPU_SHARE / 2, cores=1)
    with pytest.raises(MachineBusy) as raised:
        check_quiet(one_core, allow_busy=False)
    assert "--threads" not in str(raised.value)  # one thread already: fewer cannot help


def test_widened_settings_take_more_samples():
    wide = widened(QUICK)
    assert wide.min_reps > QUICK.min_reps and wide.max_reps >= wide.min_reps and wide.budget_s > QUICK.budget_s


def test_a_too_busy_machine_measures_nothing_and_writes_no_table(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "probe_noise", lambda device: TOO_BUSY)
    config = small_config(tmp_path, problems=2, allow_busy=False)
    with pytest.raises(MachineBusy, match="too busy"):
        calibrate(config, show_progress=False, kernels=[MathKernel()], out=tmp_path / "table.json")
    assert not (tmp_path / "table.json").exists() and not (tmp_path / "results.jsonl").exists()


def test_a_refusal_leaves_no_empty_journal_in_the_home(tmp_path, monkeypatch):
    """The default journal (in the cache directory) that the worker opened before the probe
    refused is removed when it holds nothing, and so is the folder it made (new users' trials
    found an empty journal, then an empty ``journals/`` left)."""
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(session, "probe_noise", lambda device: TOO_BUSY)
    config = small_config(tmp_path, problems=2, allow_busy=False, storage=None)
    with pytest.raises(MachineBusy):
        calibrate(config, show_progress=False, kernels=[MathKernel()], out=tmp_path / "table.json")
    assert not [path for path in (tmp_path / "home").rglob("*.journal") if path.stat().st_size == 0]
    assert not (tmp_path / "home" / "journals").exists()


def test_a_journal_folder_with_other_files_stays(tmp_path):
    from attn_dispatch.calibration.session import discard_if_empty

    folder = tmp_path / "journals"
    folder.mkdir()
    (folder / "earlier.jsonl").write_text("{}\n")
    (folder / "new.journal").touch()
    discard_if_empty(folder / "new.journal")
    assert sorted(p.name for p in folder.iterdir()) == ["earlier.jsonl"]


def test_a_busy_machine_widens_the_timer_and_the_summary_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "probe_noise", lambda device: BUSY)
    summary = calibrate(small_config(tmp_path, problems=2), show_progress=False, kernels=[MathKernel()], fit=False)
    assert summary.reports[0].widened and summary.reports[0].noise_spread == BUSY.spread
    text = "\n".join(summary.lines())
    assert "machine before measuring: busy" in text and "timer widened" in text and "warning:" in text
    timed = [m for m in summary.measurements if m.ok]
    assert timed and all(m.reps >= widened(QUICK).min_reps or m.extra.get("stopped") == "budget" for m in timed)


def test_a_quiet_machine_keeps_the_timer(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "probe_noise", lambda device: QUIET)
    summary = calibrate(small_config(tmp_path, problems=1), show_progress=False, kernels=[MathKernel()], fit=False)
    assert not summary.reports[0].widened
    assert not any(line.startswith("warning:") for line in summary.lines())


def test_cli_stops_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(session, "probe_noise", lambda device: TOO_BUSY)
    assert main(["calibrate", "--device", "cpu", "--quick", "--quiet", "--problems", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attn-dispatch calibrate: error: this machine is too busy") and len(err.splitlines()) == 1


def test_a_steady_but_starved_machine_stops_with_its_cpu_share(monkeypatch, capsys):
    monkeypatch.setattr(session, "probe_noise", lambda device: STARVED)
    assert main(["calibrate", "--device", "cpu", "--quick", "--quiet", "--problems", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "too busy" in err and f"CPU share {STOP_CPU_SHARE / 2:.0%}" in err
    assert "load average 2.00 per CPU (reported only)" in err


def test_a_starved_machine_allowed_widens_the_timer_and_the_summary_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "probe_noise", lambda device: STARVED)
    summary = calibrate(small_config(tmp_path, problems=1), show_progress=False, kernels=[MathKernel()], fit=False)
    report = summary.reports[0]
    assert report.widened and report.noise_spread == 0.0 and report.noise_cpu_share == STARVED.cpu_share
    text = "\n".join(summary.lines())
    assert "machine before measuring: too busy to calibrate" in text and "CPU share" in text and "warning:" in text


def test_a_refusal_says_how_to_build_the_fast_path_where_it_is_not_built(monkeypatch):
    """calibrate builds the fast path at its end: refused as too busy, it says the build needs no quiet machine."""
    from attn_dispatch.dispatcher import fast_path
    from attn_dispatch.dispatcher.commands import calibrate as command

    monkeypatch.setattr(fast_path, "fast_path_enabled", lambda: True)
    monkeypatch.setattr(fast_path, "load", lambda home=None: None)
    busy = MachineBusy("this machine is too busy to calibrate")
    assert "attn-dispatch build-fast-path" in command._fast_path_hint(busy)
    assert command._fast_path_hint(ValueError("--problems must be positive")) == ""
    monkeypatch.setattr(fast_path, "load", lambda home=None: object())  # built: nothing to add
    assert command._fast_path_hint(busy) == ""


def fake_clock(*readings: float):
    """A clock returning `readings` in order (each call takes the next)."""
    values = iter(readings)
    return lambda: next(values)


def test_share_is_cpu_time_over_wall_time_times_cores(monkeypatch):
    monkeypatch.setattr(noise_module, "process_time", fake_clock(10.0, 10.5))  # 0.5 s of CPU
    monkeypatch.setattr(noise_module, "perf_counter", fake_clock(100.0, 101.0))  # over 1 s of wall
    with ShareMeter(2) as meter:
        pass
    assert meter.share == pytest.approx(0.25)


def test_a_clock_that_did_not_move_gives_a_finite_share(monkeypatch):
    monkeypatch.setattr(noise_module, "process_time", fake_clock(1.0, 1.0))
    monkeypatch.setattr(noise_module, "perf_counter", fake_clock(5.0, 5.0))
    with ShareMeter(1) as meter:
        pass
    assert meter.share == 0.0


def test_host_share_is_the_threads_cpu_time_over_wall_time(monkeypatch):
    monkeypatch.setattr(noise_module, "thread_time", fake_clock(0.0, 0.03))
    monkeypatch.setattr(noise_module, "perf_counter", fake_clock(0.0, 0.1))
    assert host_share(iterations=10) == pytest.approx(0.3)


def test_cores_in_use_are_torchs_threads_capped_by_the_cpus(monkeypatch):
    monkeypatch.setattr(noise_module.torch, "get_num_threads", lambda: 64)
    monkeypatch.setattr(noise_module.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert cores_in_use() == 2
    monkeypatch.setattr(noise_module.torch, "get_num_threads", lambda: 1)
    assert cores_in_use() == 1


def test_load_per_cpu_and_its_absence(monkeypatch):
    monkeypatch.setattr(noise_module.os, "getloadavg", lambda: (3.0, 2.0, 1.0), raising=False)
    monkeypatch.setattr(noise_module.os, "cpu_count", lambda: 2)
    assert load_per_cpu() == 1.5

    def unavailable():
        raise OSError("no load average here")

    monkeypatch.setattr(noise_module.os, "getloadavg", unavailable, raising=False)
    assert load_per_cpu() is None


def starved_probe(monkeypatch, share: float, device: str = "cpu"):
    """The real reference probe on the CPU, its clocks faked to give `share` of 2 cores."""
    monkeypatch.setattr(noise_module, "cores_in_use", lambda: 2)
    monkeypatch.setattr(noise_module, "process_time", fake_clock(0.0, 2 * share))
    monkeypatch.setattr(noise_module, "perf_counter", fake_clock(0.0, 1.0))
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


@pytest.mark.parametrize(("spread", "words"), [
    (0.0, "0%"), (0.04, "4%"), (0.68, "68%"), (0.99, "99%"),
    (SPREAD_AS_MULTIPLE, "1.0x the median time"), (8.32, "8.3x the median time"),
    (math.inf, "not measurable (a zero median time)"),
])
def test_spread_words(spread, words):
    assert spread_words(spread) == words


def test_the_thresholds_stay_percentages_below_the_multiple_wording():
    assert BUSY_SPREAD < STOP_SPREAD < SPREAD_AS_MULTIPLE


def test_a_very_busy_probe_reads_as_a_multiple_and_still_stops():
    # quartiles 1.2 and 42.8 ms around a 5 ms median: an interquartile range 8.32x the median
    samples = [1e-3] * 3 + [1.2e-3] * 4 + [5e-3] + [40e-3] * 2 + [42.8e-3] * 2 + [50e-3] * 3
    noise = probe_noise("cpu", samples=samples, cpu_share=1.0)
    assert noise.spread == pytest.approx(8.32)
    assert noise.too_busy and noise.busy
    text = noise.describe()
    assert "spread 8.3x the median time (busy over 0.3x, stop over 0.5x)" in text
    assert "832%" not in text
    with pytest.raises(MachineBusy, match=r"spread 8\.3x the median time"):
        check_quiet(noise, allow_busy=False)


def test_an_ordinary_spread_keeps_its_percentage():
    assert "spread 68% (busy over 30%" in Noise(median_s=6.29e-3, spread=0.68).describe()


REFUSED_IN_A_FRESH_PROCESS = """
import json, sys
import attn_dispatch.calibration.session as session
from attn_dispatch.calibration.noise import Noise, STOP_SPREAD
from attn_dispatch.dispatcher.cli import main

session.probe_noise = lambda device: Noise(median_s=2e-3, spread=STOP_SPREAD * 2)
code = main(["calibrate", "--quick", "--device", "cpu", "--quiet"])
print(json.dumps({"code": code, "scipy.stats": "scipy.stats" in sys.modules}))
"""


def test_a_refused_calibration_does_not_import_the_sweeps_sampler_first(tmp_path):
    """The busy refusal comes before the sweep's problem sampler (`scipy.stats.qmc`) is imported: that import
    is left to the sweep, so a refused run does not wait for it."""
    env = {**os.environ, "ATTN_DISPATCH_HOME": str(tmp_path / "home"), "ATTN_DISPATCH_FAST_PATH": "0"}
    done = subprocess.run([sys.executable, "-c", REFUSED_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                          env=env, timeout=300, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"code": 2, "scipy.stats": False}
    assert "too busy to calibrate" in done.stderr
