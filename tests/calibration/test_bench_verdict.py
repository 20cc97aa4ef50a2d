"""`attn-dispatch bench` ends with a verdict: gain or no gain over PyTorch's default on this
machine, and why (kept PyTorch's call everywhere, within the noise, slower choices, a busy
machine). From written-out samples: no timing."""

from __future__ import annotations

from attn_dispatch.calibration.scenario_bench import VERDICT_MARGIN, BenchReport, verdict
from attn_dispatch.calibration.noise import MachineState
from attn_dispatch.calibration.noise import BUSY_CPU_SHARE, Noise
from attn_dispatch.calibration.scenario_bench import PathResult, ShapeResult
from attn_dispatch.calibration.scenario_bench import Shape
from attn_dispatch.kernels import Problem

SHAPE = Shape("decode", Problem(1, 8, 1, 1, 3000, 64, 64, "float32"))
QUIET = MachineState(Noise(2e-3, 0.05, cpu_share=0.98, cores=2), Noise(2e-3, 0.04, cpu_share=0.97, cores=2))
STARVED = Noise(2e-3, 0.05, cpu_share=BUSY_CPU_SHARE / 2, cores=2)
BUSY = MachineState(QUIET.before, STARVED)


def shape(dispatcher_s: float, pytorch_s: float, chosen: str) -> ShapeResult:
    return ShapeResult(SHAPE, [PathResult("dispatcher", "dispatcher", "ok", samples=[dispatcher_s] * 3),
                               PathResult("pytorch_default", "pytorch", "ok", samples=[pytorch_s] * 3),
                               PathResult("math", "kernel", "ok", samples=[9.0] * 3)], chosen=chosen)


def test_a_faster_dispatcher_is_a_gain():
    said = verdict([shape(0.5, 1.0, "small_q[splits=8]"), shape(1.0, 1.0, "sdpa_default")], QUIET)
    assert said.startswith("gain on this machine: the dispatcher took 0.71x PyTorch's default time (geo-mean over "
                           "2 shapes); it ran another kernel than PyTorch's on 1 of them")


def test_keeping_pytorchs_call_everywhere_is_no_gain_whatever_the_ratio():
    said = verdict([shape(1.14, 1.0, "sdpa_default")] * 13, QUIET, "analytic prior (Intel Xeon)")
    assert said.startswith("no gain on this machine: it kept PyTorch's own call on all 13 shapes, so it runs what "
                           "PyTorch runs and the 1.14x is its call overhead and timing noise")
    assert "`attn-dispatch calibrate`" in said  # no table measured here
    said = verdict([shape(0.67, 1.0, "sdpa_default")] * 4, BUSY)  # a busy machine's noise is no gain either
    assert said.startswith("no gain on this machine: it kept PyTorch's own call on all 4 shapes") and "busy" in said


def test_within_the_margin_is_no_gain_and_slower_choices_say_what_to_run():
    near = 1 + VERDICT_MARGIN / 2
    said = verdict([shape(near, 1.0, "small_q[splits=8]")], QUIET)
    assert said.startswith("no gain on this machine: the dispatcher took 1.01x") and "within 3%" in said
    said = verdict([shape(1.3, 1.0, "small_q[splits=8]")], QUIET)
    assert "its other kernels (on 1 shapes) ran slower here" in said and "`attn-dispatch check`" in said


def test_a_busy_machine_is_named_in_the_verdict():
    said = verdict([shape(1.3, 1.0, "small_q[splits=8]")], BUSY)
    assert said.endswith("the machine was busy after timing, so these ratios carry its noise: run it again when it "
                         "is quieter")
    assert "`attn-dispatch check`" not in said  # noise first: re-measuring on a busy machine repeats it


def test_no_comparable_shape_gives_no_verdict():
    failed = ShapeResult(SHAPE, [PathResult("dispatcher", "dispatcher", "failed", samples=[])], chosen=None)
    assert verdict([failed], QUIET).startswith("no verdict: no shape timed both")


def test_the_report_ends_with_its_verdict_and_keeps_it_in_json():
    report = BenchReport({"table used": "analytic prior (cpu)"}, [shape(1.0, 1.0, "sdpa_default")], QUIET)
    assert report.markdown().rstrip().splitlines()[-1] == f"**Verdict:** {report.verdict()}"
    data = report.to_dict()
    assert data["verdict"] == report.verdict() and data["machine"]["busy"] is False


def test_machine_words():
    assert QUIET.words() == "quiet before and after timing" and QUIET.note() is None
    assert BUSY.words().startswith("busy after timing (reference point")
    assert "CPU share 42% of 2 cores" in BUSY.words()
    assert BUSY.note().startswith("note: the machine was busy after timing (")
