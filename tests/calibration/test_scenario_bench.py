"""`attn-dispatch bench` (`calibration.scenario_bench`, `calibration.bench_report`): the held-out
scenario really is held out, the ratios from fixed samples (of the medians, and paired round by
round), and the closing verdict. No timing: the samples are written out.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from attn_dispatch.calibration.bench_report import VERDICT_MARGIN, BenchReport, summarise, verdict
from attn_dispatch.calibration.noise import BUSY_CPU_SHARE, MachineState, Noise
from attn_dispatch.calibration.plan import FULL_GPU, sample_problems
from attn_dispatch.calibration.scenario_bench import (
    EXTRA_SCENARIOS,
    SCENARIOS,
    PathResult,
    Shape,
    ShapeResult,
    scenario_shapes,
)
from attn_dispatch.kernels import Problem

H200_MEMORY_BYTES = 150_109_880_320  # torch.cuda.get_device_properties(0).total_memory on our H200
CALIBRATIONS = Path(__file__).parents[2] / "bench/results/h200_calibrations"
H200_RUNS = ["run4_fixed_timer", "run6_more_problems"]


def _heldout(size: str) -> list[Problem]:
    return [shape.problem for shape in scenario_shapes("heldout", size=size, device_type="cuda")]


def _shape_key(problem: Problem) -> tuple:
    """Everything that makes two problems the same measurement, layout flags aside."""
    return replace(problem, strided=False, broadcast_inputs=False, device_type="cuda")


def test_heldout_is_not_part_of_all():
    suites = {shape.suite for shape in scenario_shapes("all", size="small", device_type="cpu")}
    assert suites == set(SCENARIOS)
    assert "heldout" in EXTRA_SCENARIOS


@pytest.mark.parametrize("size", ["small", "full"])
def test_heldout_shapes_are_valid_and_varied(size):
    problems = _heldout(size)
    assert len(problems) >= 6
    assert len({p.gqa_ratio for p in problems}) >= 3
    assert len({p.batch for p in problems}) >= 3
    assert {p.mask_kind for p in problems} >= {"none", "bool"}
    assert any(p.causal for p in problems) and any(p.q_len <= 8 for p in problems)


def test_heldout_shapes_are_not_in_the_calibration_sweep():
    sweep = sample_problems(FULL_GPU, device_type="cuda", memory_bytes=H200_MEMORY_BYTES, fastest_s=lambda p: 0.0)
    swept = {_shape_key(p) for p in sweep}
    assert not swept & {_shape_key(p) for p in _heldout("full")}


@pytest.mark.parametrize("run", H200_RUNS)
def test_heldout_shapes_were_never_measured_by_the_h200_calibration(run):
    measured = set()
    with gzip.open(CALIBRATIONS / f"{run}_measurements.jsonl.gz", "rt") as handle:
        for line in handle:
            measured.add(_shape_key(Problem.from_dict(json.loads(line)["problem"])))
    assert len(measured) > 100
    assert not measured & {_shape_key(p) for p in _heldout("full")}


SHAPE = Shape("decode", Problem(1, 8, 1, 1, 3000, 64, 64, "float32"))


def _result(dispatcher, pytorch, math_samples):
    return ShapeResult(SHAPE, [PathResult("dispatcher", "dispatcher", "ok", samples=dispatcher),
                               PathResult("pytorch_default", "pytorch", "ok", samples=pytorch),
                               PathResult("math", "kernel", "ok", samples=math_samples)], chosen="math")


def test_a_paired_ratio_cancels_load_that_moves_between_rounds():
    """Round 3 ran everything twice as slow: the medians' ratio moves, the per-round ratios do not."""
    shape = _result(dispatcher=[1.0, 1.0, 2.0], pytorch=[1.1, 1.1, 2.2], math_samples=[2.0, 2.0, 4.0])
    assert shape.oracle.label == "pytorch_default"  # the fastest single path by its median
    assert shape.ratio("pytorch") == pytest.approx(1.0 / 1.1)
    assert shape.paired_ratio("pytorch") == pytest.approx(1.0 / 1.1)
    drifting = _result(dispatcher=[1.0, 2.0, 2.0], pytorch=[1.1, 2.2, 1.1], math_samples=[3.0, 3.0, 3.0])
    assert drifting.ratio("pytorch") == pytest.approx(2.0 / 1.1)
    assert drifting.paired_ratio("pytorch") == pytest.approx(1.0 / 1.1)


def test_paths_not_timed_in_the_same_rounds_fall_back_to_the_medians():
    shape = _result(dispatcher=[1.0, 1.2, 1.1], pytorch=[2.0], math_samples=[3.0, 3.0, 3.0])
    assert shape.paired_ratio("pytorch") == shape.ratio("pytorch") == pytest.approx(1.1 / 2.0)


def test_the_summary_reports_both():
    shapes = [_result(dispatcher=[1.0, 2.0, 2.0], pytorch=[1.1, 2.2, 1.1], math_samples=[3.0, 3.0, 3.0])]
    summary = summarise(shapes)
    assert summary["pytorch_geomean"] == pytest.approx(2.0 / 1.1)
    assert summary["pytorch_paired_geomean"] == pytest.approx(1.0 / 1.1)
    assert summary["oracle_paired_worst"] == pytest.approx(1.0 / 1.1)


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
    said = verdict([shape(0.5, 1.0, "small_q[splits=8]"), shape(1.0, 1.0, "sdpa_default")], BUSY)
    assert said.startswith("no verdict while this machine is busy: the dispatcher took 0.71x") and "quieter" in said


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
    assert "its other kernels ran 1.30x PyTorch's time on the 1 shape where it chose them" in said
    assert "`attn-dispatch check`" in said


def test_a_slow_reading_on_pytorchs_own_kernel_is_not_blamed_on_the_others():
    said = verdict([shape(0.94, 1.0, "sdpa_gqa_fold")] + [shape(1.2, 1.0, "sdpa_default")] * 3, QUIET)
    assert said.startswith("no gain on this machine: the dispatcher took 1.13x PyTorch's default time")
    assert ("its other kernels ran 0.94x PyTorch's time on the 1 shape where it chose them, and the rest is its call "
            "overhead and timing noise on the 3 shapes where it kept PyTorch's call") in said


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


def test_a_ratio_of_pytorchs_own_kernel_is_never_shown_as_the_best_gain():
    """A shape where the dispatcher ran PyTorch's own kernel times the same kernel twice (0.25x is noise): the best
    ratio is over the other shapes, "same kernel" where there are none, and its row says so."""
    noisy_same, other = shape(0.25, 1.0, "sdpa_default"), shape(0.9, 1.0, "small_q[splits=8]")
    summary = summarise([noisy_same, other])
    assert summary["pytorch_best"] == pytest.approx(0.9) and summary["pytorch_same_kernel"] == 1
    report = BenchReport({}, [noisy_same, noisy_same], BUSY)
    assert report.summaries()["all"]["pytorch_best"] is None
    lines = report.markdown().splitlines()
    (row,) = [line for line in lines if line.startswith("| all |")]
    assert row.split(" | ")[5] == "same kernel" and "0.25x" not in row.split(" | ")[5]
    rows = [line for line in lines if line.startswith(f"| {SHAPE.label} |")]
    assert len(rows) == 2 and all("| same kernel (0.25x) | same kernel (0.25x) |" in line for line in rows)


def test_machine_words():
    assert QUIET.words() == "quiet before and after timing" and QUIET.note() is None
    assert BUSY.words().startswith("busy after timing (reference point")
    assert "CPU share 42% of 2 cores" in BUSY.words()
    assert BUSY.note().startswith("note: the machine was busy after timing (")
