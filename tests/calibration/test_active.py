"""Uncertainty scores for choosing the next problems to measure (`calibration.active`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attn_dispatch.calibration.active import bagged_regret, most_uncertain, top_margins

# Three problems: 0 has a clear winner, 1 a near-tie, 2 a single candidate kernel.
GROUPS = np.array([0, 0, 0, 1, 1, 2])
PREDICTED = np.log(np.array([1.0, 4.0, 8.0, 2.0, 2.1, 3.0]))


def test_margin_is_the_log_gap_between_the_two_fastest_kernels():
    margins = top_margins(GROUPS, PREDICTED)
    assert margins[0] == pytest.approx(math.log(4.0))
    assert margins[1] == pytest.approx(math.log(2.1 / 2.0))
    assert margins[2] == math.inf  # nothing to choose
    assert most_uncertain(margins, 2, higher_is_less_sure=False) == [1, 0]


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
