"""What a calibration measures after its sweep (`calibration.plan`): crossover refinement, the
class-level numerics gate, uncertainty scores and active rounds."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

import attn_dispatch.calibration.plan as plan_module
from attn_dispatch.calibration.finish import apply_numerics_gate, problem_class
from attn_dispatch.calibration.plan import bagged_regret, crossover_problems, family_of, most_uncertain
from attn_dispatch.calibration.session import calibrate
from attn_dispatch.kernels.chunked import ChunkedKernel
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.kernels.small_q import SmallQKernel
from attn_dispatch.models.measurement import Measurement
from tests.calibration.helpers import problem, small_config


def _m(p, kernel, seconds, status="ok", error=None):
    return Measurement(problem=p, kernel=kernel, median_s=seconds if status in ("ok", "inaccurate") else math.inf,
                       status=status, rel_error=error, reason="" if status == "ok" else "bad")


def test_family_of():
    assert family_of("chunked[q=256,kv=1024]") == "chunked"
    assert family_of("convert[fp16->fp32]+sdpa_flash") == "convert+sdpa_flash"
    assert family_of("math") == "math"


def test_midpoints_between_different_winners_only():
    points = []
    for q in (1, 4, 64, 256):
        p = problem(q_len=q, kv_len=4096)
        small_q_wins = q <= 4
        points += [_m(p, "small_q[splits=8]", 1.0 if small_q_wins else 2.0), _m(p, "chunked[q=128,kv=1024]", 2.0 if small_q_wins else 1.0)]
    new = crossover_problems(points, count=5)
    assert len(new) == 1
    assert new[0].q_len == 16 and new[0].kv_len == 4096  # geometric midpoint of 4 and 64
    assert crossover_problems(points, count=5) == new  # deterministic
    assert crossover_problems(points[:4], count=5) == []  # same winner everywhere


def test_gate_excludes_the_kernel_for_the_whole_class():
    a, b, other = problem(q_len=8), problem(q_len=512), problem(q_len=8, dtype="float16")
    assert problem_class(a) == problem_class(b) != problem_class(other)
    points = [
        _m(a, "wrong", 1.0, status="inaccurate", error=0.01), _m(b, "wrong", 1.0), _m(other, "wrong", 1.0),
        _m(a, "math", 2.0), _m(b, "math", 2.0),
    ]
    gated, excluded = apply_numerics_gate(points)
    by = {(m.problem, m.kernel): m for m in gated}
    assert by[b, "wrong"].status == "inaccurate" and "unusable for float32" in by[b, "wrong"].reason
    assert by[other, "wrong"].ok  # another class: not excluded
    assert by[a, "math"].ok and by[b, "math"].ok
    assert list(excluded[problem_class(a)]) == ["wrong"]


# Three problems: 0 has a clear winner, 1 a near-tie, 2 a single candidate kernel.
GROUPS = np.array([0, 0, 0, 1, 1, 2])
PREDICTED = np.log(np.array([1.0, 4.0, 8.0, 2.0, 2.1, 3.0]))


def test_bagged_regret_is_zero_when_every_bag_agrees_and_grows_with_disagreement():
    agree = np.stack([PREDICTED, PREDICTED + 0.5])  # every bag ranks the same way
    assert all(value == pytest.approx(0.0) for value in bagged_regret(GROUPS, agree).values())
    split = agree.copy()
    split[1, 3], split[1, 4] = math.log(5.0), math.log(1.0)  # bag 1 flips problem 1's order, by a lot
    regrets = bagged_regret(GROUPS, split)
    assert regrets[1] > 0 and regrets[0] == pytest.approx(0.0) and regrets[2] == 0.0
    assert most_uncertain(regrets, 1, higher_is_less_sure=True) == [1]


def test_ties_in_scores_go_to_the_smaller_problem_id():
    assert most_uncertain({3: 0.5, 1: 0.5, 2: 0.1}, 3, higher_is_less_sure=True) == [1, 3, 2]
    assert most_uncertain({3: 0.5}, 0, higher_is_less_sure=True) == []


def test_linear_regret_is_the_bags_mean_slowdown():
    split = np.stack([PREDICTED, PREDICTED])
    split[1, 3], split[1, 4] = math.log(5.0), math.log(1.0)  # bag 1: the consensus pick is 5x its best
    consensus = int(np.argmin(split[:, 3:5].mean(axis=0)))
    slowdowns = [math.exp(split[b, 3 + consensus] - split[b, 3:5].min()) - 1.0 for b in range(2)]
    assert bagged_regret(GROUPS, split, linear=True)[1] == pytest.approx(np.mean(slowdowns))
    assert bagged_regret(GROUPS, split, linear=True)[0] == pytest.approx(0.0)


KERNELS = [MathKernel(), ChunkedKernel(q=128, kv=1024), SmallQKernel(splits=8)]


def test_an_active_round_measures_new_sample_points(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_module, "MIN_PROBLEMS", 3)  # a CI-sized sweep
    config = small_config(tmp_path, problems=4, active_rounds=1)
    summary = calibrate(config, show_progress=False, kernels=KERNELS, fit=False)
    phases = {m.problem: m.extra.get("phase") for m in summary.measurements}
    sweep = {p for p, phase in phases.items() if phase == "sweep"}
    active = {p for p, phase in phases.items() if phase == "active1"}
    assert len(sweep) == 4 and len(active) == 1 and not active & sweep
    assert Counter(phases.values())["active1"] == 1


def test_too_few_measured_problems_choose_nothing():
    assert plan_module.uncertain_problems([], [], KERNELS, spec=None, count=3, seed=0) == []
