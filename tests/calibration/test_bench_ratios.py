"""`attn-dispatch bench`'s ratios from fixed samples: of the medians, and paired round by round
(`ShapeResult.paired_ratio`). No timing: the samples are written out."""

from __future__ import annotations

import pytest

from attn_dispatch.calibration.scenario_bench import summarise
from attn_dispatch.calibration.scenario_bench import PathResult, ShapeResult
from attn_dispatch.calibration.scenario_bench import Shape
from attn_dispatch.kernels import Problem

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
