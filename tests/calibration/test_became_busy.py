"""A calibration whose machine was quiet before measuring and too busy after says that: the
machine *became* too busy while measuring, with the number that changed, in its summary and in
its table guard's reason (which `devices` and `explain` repeat). It names ``--allow-busy`` only
when the flag was passed: a new user's trial read "measured anyway: --allow-busy" for a flag they
never passed (CPU share 96% before measuring, 69% after)."""

from __future__ import annotations

import pytest

import attn_dispatch.calibration.session as session
from attn_dispatch.calibration.noise import (
    ALLOWED_CAUSE,
    ALLOWED_REASON,
    BUSY_SPREAD,
    STOP_CPU_SHARE,
    STOP_SPREAD,
    Noise,
    spread_words,
    too_busy_cause,
    too_busy_reason,
)
from attn_dispatch.calibration.session import calibrate
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.models.table_io import load_table
from tests.calibration.helpers import small_config

QUIET_SHARE = 0.96  # the trial's probe before measuring
QUIET = Noise(median_s=2e-3, spread=BUSY_SPREAD / 4, cpu_share=QUIET_SHARE, cores=1)
STARVED = Noise(median_s=2e-3, spread=BUSY_SPREAD / 4, cpu_share=STOP_CPU_SHARE / 2, cores=1)
JITTERY = Noise(median_s=2e-3, spread=STOP_SPREAD * 2, cpu_share=QUIET_SHARE, cores=1)


def probes(*noises: Noise):
    """A `probe_noise` stand-in answering `noises` in turn (before measuring, then after)."""
    answers = iter(noises)
    return lambda device: next(answers)


def test_a_machine_that_became_too_busy_says_so_with_its_cpu_share(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(session, "probe_noise", probes(QUIET, STARVED))
    summary = calibrate(small_config(tmp_path, problems=3, allow_busy=False), show_progress=False,
                        kernels=[MathKernel()], out=tmp_path / "table.json")
    text = "\n".join(summary.lines())
    became = (f"the machine became too busy to time kernels while measuring "
              f"(CPU share {QUIET_SHARE:.0%} before, {STOP_CPU_SHARE / 2:.0%} after)")
    assert "--allow-busy" not in text
    assert summary.fit.table_paths, summary.fit.note
    assert f"warning: {became}, so the table stored does not use its model or its per-bucket winners" in text
    table = load_table(summary.fit.table_paths[0])
    assert table.guard.verdict == "default"
    assert table.guard.reason == "measured on a machine that " + became.removeprefix("the machine ")
    assert "--allow-busy" not in table.guard.describe()


def test_a_spread_that_grew_names_the_spread_and_no_table_is_fitted(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "probe_noise", probes(QUIET, JITTERY))
    summary = calibrate(small_config(tmp_path, problems=1, allow_busy=False), show_progress=False,
                        kernels=[MathKernel()], fit=False)
    (warning,) = [line for line in summary.lines() if "too busy" in line and line.startswith("warning:")]
    assert warning.startswith(f"warning: the machine became too busy to time kernels while measuring (spread "
                              f"{spread_words(QUIET.spread, True)} before, {spread_words(JITTERY.spread, True)} after); these timings may")
    assert "--allow-busy" not in warning and "CPU share" not in warning  # the share did not move


def test_too_busy_before_measuring_names_the_flag_it_needed():
    assert too_busy_cause(STARVED, QUIET) == ALLOWED_CAUSE and "--allow-busy" in ALLOWED_CAUSE
    assert too_busy_reason(STARVED, STARVED) == ALLOWED_REASON


@pytest.mark.parametrize("start, end", [(QUIET, QUIET), (QUIET, None), (None, None)])
def test_no_too_busy_probe_gives_no_cause(start, end):
    assert too_busy_cause(start, end) is None and too_busy_reason(start, end) is None
