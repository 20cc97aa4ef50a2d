"""Held-out quality on a synthetic data set with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from models._cpu_probe import FALLBACK_CPU_SPEC
from models.cost_model import CostModel
from models.dataset import training_set
from models.quality import choice_quality, holdout_quality, split_by_problem
from tests.models.synthetic import synthetic_measurements, true_seconds


def test_choice_quality_by_hand():
    groups = np.array([0, 0, 0, 1, 1, 2])
    measured = np.array([1.0, 2.0, 3.0, 1.0, 1.005, 5.0])
    predicted = np.array([1.0, 2.0, 3.0, 2.0, 1.0, 1.0])  # right on 0; a 0.5% tie missed on 1
    quality = choice_quality(groups, measured, predicted)
    assert quality.n_problems == 2  # problem 2 has one kernel: no choice
    assert quality.top1_accuracy == 0.5 and quality.top1_within_noise == 1.0
    assert quality.mean_slowdown == pytest.approx(0.0025) and quality.worst_slowdown == pytest.approx(0.005)
    assert quality.spearman == pytest.approx(1.0)


def test_split_keeps_problems_whole():
    data = training_set(synthetic_measurements(30, seed=1), FALLBACK_CPU_SPEC)
    train, test = split_by_problem(data, holdout_fraction=0.25, seed=0)
    assert not set(data.groups[train]) & set(data.groups[test])
    with pytest.raises(ValueError, match="holdout_fraction"):
        split_by_problem(data, holdout_fraction=1.5, seed=0)


def test_repeated_points_are_merged_by_their_median():
    import math
    from dataclasses import replace

    point = synthetic_measurements(1, seed=2)[0]
    repeats = [replace(point, median_s=s) for s in (1e-3, 2e-3, 4e-3, 9e-3)]  # even count: mean of 2e-3, 4e-3
    data = training_set(repeats, FALLBACK_CPU_SPEC)
    assert len(data) == 1 and math.exp(data.y[0]) == pytest.approx(3e-3)


@pytest.fixture(scope="module")
def synthetic():
    points = synthetic_measurements(160, seed=0)
    return training_set(points, FALLBACK_CPU_SPEC)


def test_synthetic_quality_beats_the_prior_and_nears_the_truth(synthetic, record_property):
    """The model learns the distortions the prior misses (slower memory, dearer launches, cache
    and block effects); against measured times its mistakes are ties inside the noise."""
    quality = holdout_quality(synthetic, CostModel(), holdout_fraction=0.25, seed=0)
    print("synthetic:", quality.summary())
    record_property("synthetic_quality", quality.to_dict())
    assert quality.n_points_fit > 800 and quality.n_problems_test == 40
    assert quality.model.mean_slowdown <= 0.02 and quality.model.top1_within_noise >= 0.85
    assert quality.prior.mean_slowdown > 5 * quality.model.mean_slowdown
    # Against the noise-free truth the choices are nearly perfect.
    train, test = split_by_problem(synthetic, holdout_fraction=0.25, seed=0)
    model = CostModel().fit(synthetic.X[train], synthetic.y[train])
    truth = np.array([true_seconds(synthetic.problems[i], synthetic.kernels[i]) for i in test])
    versus_truth = choice_quality(synthetic.groups[test], truth, model.predict(synthetic.X[test]))
    print("synthetic vs truth:", versus_truth)
    assert versus_truth.mean_slowdown <= 0.01 and versus_truth.top1_within_noise >= 0.9


def test_residual_target_beats_the_direct_one(synthetic):
    """Why CostModel learns log(measured / prior) by default: on held-out problems the
    residual model's worst choice is far better (the prior carries the scaling with size)."""
    residual = holdout_quality(synthetic, CostModel(), holdout_fraction=0.25, seed=0)
    direct = holdout_quality(synthetic, CostModel(residual=False), holdout_fraction=0.25, seed=0)
    print("residual:", residual.summary(), "\ndirect:", direct.summary())
    assert residual.model.mean_slowdown <= direct.model.mean_slowdown
