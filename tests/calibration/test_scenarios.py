"""The held-out bench scenario really is held out: none of its shapes is in the calibration sweep,
nor among the problems the committed H200 calibrations (runs 4 and 6, the bundled table) measured."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from attn_dispatch.calibration.scenario_bench import EXTRA_SCENARIOS, SCENARIOS, scenario_shapes
from attn_dispatch.calibration.space import FULL_GPU, sample_problems
from attn_dispatch.kernels.problem import Problem

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
