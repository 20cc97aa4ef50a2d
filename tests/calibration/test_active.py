"""Uncertainty scores for choosing the next problems to measure (`calibration.plan`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attn_dispatch.calibration.plan import (
    bagged_regret,
    diverse_batch,
    most_uncertain,
    problem_descriptors,
    top_margins,
)
from attn_dispatch.models.features import FEATURE_NAMES, PROBLEM_COLUMNS

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


def test_linear_regret_is_the_bags_mean_slowdown():
    split = np.stack([PREDICTED, PREDICTED])
    split[1, 3], split[1, 4] = math.log(5.0), math.log(1.0)  # bag 1: the consensus pick is 5x its best
    consensus = int(np.argmin(split[:, 3:5].mean(axis=0)))
    slowdowns = [math.exp(split[b, 3 + consensus] - split[b, 3:5].min()) - 1.0 for b in range(2)]
    assert bagged_regret(GROUPS, split, linear=True)[1] == pytest.approx(np.mean(slowdowns))
    assert bagged_regret(GROUPS, split, linear=True)[0] == pytest.approx(0.0)


def test_problem_descriptors_are_the_problem_columns_of_a_problem_row():
    X = np.arange(len(GROUPS) * len(FEATURE_NAMES), dtype=np.float64).reshape(len(GROUPS), -1)
    descriptors = problem_descriptors(GROUPS, X)
    assert sorted(descriptors) == [0, 1, 2]
    assert np.array_equal(descriptors[1], X[3, list(PROBLEM_COLUMNS)])


def test_a_diverse_batch_takes_one_problem_per_cluster_of_the_best_scored():
    # Problems 0-2 are near-copies with the highest scores, 3 and 4 lie elsewhere, scored lower.
    descriptors = {0: np.array([0.0, 0.0]), 1: np.array([0.01, 0.0]), 2: np.array([0.0, 0.01]),
                   3: np.array([5.0, 5.0]), 4: np.array([-5.0, 5.0]), 5: np.array([9.0, 9.0])}
    scores = {0: 0.9, 1: 0.8, 2: 0.7, 3: 0.3, 4: 0.2, 5: 0.0}
    assert most_uncertain(scores, 3, higher_is_less_sure=True) == [0, 1, 2]
    assert diverse_batch(scores, descriptors, 3, pool_factor=2) == [0, 3, 4]
    assert diverse_batch(scores, descriptors, 2, pool_factor=1) == [0, 1]  # no wider pool: the best as they are
    assert diverse_batch(scores, descriptors, 10, pool_factor=3) == [0, 1, 2, 3, 4, 5]


def test_regret_of_a_given_pick_counts_against_each_bags_best():
    bags = np.stack([PREDICTED, PREDICTED])  # both bags: kernel 0 of problem 0 is 4x faster than kernel 1
    pick = PREDICTED.copy()
    pick[1] = math.log(0.5)  # the model in use would pick kernel 1 of problem 0
    regrets = bagged_regret(GROUPS, bags, pick_log=pick)
    assert regrets[0] == pytest.approx(math.log(4.0)) and regrets[1] == pytest.approx(0.0)
    assert bagged_regret(GROUPS, bags)[0] == pytest.approx(0.0)  # the bags' own consensus: no regret
