"""An active refinement round: after the sweep, fit bootstrap cost models on what was measured and
pick, among the next points of the seeded sample, the problems whose pick the fits disagree on
most (`calibration.active.bagged_regret`, scored as the bags' mean slowdown of their consensus pick).

The score and the settings below are the best of those simulated on a recorded H200 calibration
(docs/RESULTS.md#calibration): bagged disagreement beat random sampling, smallest-margin sampling
did not, and the slowdown score was ahead of the log regret.
"""

from __future__ import annotations

import numpy as np

from attn_dispatch.calibration.active import bagged_regret, most_uncertain
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.cards import CardSpec
from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.dataset import training_set
from attn_dispatch.models.features import feature_matrix
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.ranking import kernel_named

# Bootstrap fits per round and their boosting iterations: the simulation's settings (4 fits of a
# third of the default 300 iterations: a few CPU seconds for a few hundred problems); 8 bags
# simulated worse (docs/RESULTS.md#calibration).
BAGS = 4
BAG_ITERATIONS = 100
# Score the bags' mean slowdown of their consensus pick (exp of the log regret, minus 1: the
# quantity mean slowdown averages) rather than their mean log regret: it scores what the target
# measures and simulated at least as well (docs/RESULTS.md#calibration).
LINEAR_REGRET = True
# At least this many measured problems before a round is worth fitting (the simulation started at 16).
MIN_PROBLEMS = 16


def _registry_names(kernels: list[Kernel]) -> list[str]:
    """Names of `kernels` the cost model can featurise (a test's own kernels are left out)."""
    names = []
    for kernel in kernels:
        try:
            kernel_named(kernel.name)
        except ValueError:
            continue
        names.append(kernel.name)
    return names


def uncertain_problems(measurements: list[Measurement], candidates: list[Problem], kernels: list[Kernel],
                       spec: CardSpec, *, count: int, seed: int) -> list[Problem]:
    """Up to `count` of `candidates` ranked by bagged regret (deterministic for a seed); [] when
    fewer than `MIN_PROBLEMS` problems were measured or nothing can be featurised."""
    names = set(_registry_names(kernels))
    usable = [m for m in measurements if m.kernel in names]
    if not candidates or len({m.problem for m in usable if m.ok}) < MIN_PROBLEMS:
        return []
    data = training_set(usable, spec)
    pairs = [(i, kernel.name) for i, problem in enumerate(candidates) for kernel in kernels
             if kernel.name in names and not kernel.reasons(problem)]
    if not pairs:
        return []
    groups = np.array([i for i, _ in pairs])
    X = feature_matrix([candidates[i] for i, _ in pairs], [name for _, name in pairs], spec)
    rng = np.random.default_rng(seed)
    problems = np.unique(data.groups)
    predictions = []
    for bag in range(BAGS):
        resample = rng.choice(problems, size=len(problems), replace=True)
        rows = np.concatenate([np.flatnonzero(data.groups == g) for g in resample])
        model = CostModel(random_state=bag, max_iter=BAG_ITERATIONS).fit(data.X[rows], data.y[rows])
        predictions.append(model.predict(X))
    regrets = bagged_regret(groups, np.array(predictions), linear=LINEAR_REGRET)
    return [candidates[i] for i in most_uncertain(regrets, count, higher_is_less_sure=True)]
