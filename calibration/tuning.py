"""optuna search over one kernel family's parameters on one problem, with real timings.

One study per (calibration, family, problem) in the shared storage (a killed run resumes). TPE
sees indices into the candidate values that give distinct kernels here; the sweep's defaults join
as finished trials; nothing is measured twice; a clear loser is pruned. A refused config is
recorded unsupported (no trial); one that fails is recorded failed (a trial scoring ``inf``).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable

import optuna
from optuna.distributions import IntDistribution
from optuna.pruners import BasePruner
from optuna.samplers import TPESampler
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from attn_dispatch.kernels._triton_decode_layout import DecodeLayout
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import PLAIN_FAMILIES, kernel_from_name, param_space
from attn_dispatch.kernels.small_q import effective_splits
from attn_dispatch.models.measurement import Measurement

TUNABLE_FAMILIES = ("chunked", "small_q", "triton_flash", "triton_decode")
# Tune a family on a problem when its best default configuration is within this factor of the
# problem's fastest kernel.
TUNE_WITHIN = 1.5
# A configuration whose median after `min_reps` repetitions is this many times the best time known
# for the problem is pruned (its few repetitions kept as a data point).
PRUNE_RATIO = 2.0
ASKS_PER_TRIAL = 3  # asks per wanted trial before giving up on a small space
TPE_STARTUP_TRIALS = 3
LENGTH_PARAMS = {
    ("chunked", "q"): "q_len", ("chunked", "kv"): "kv_len",
    ("triton_flash", "bm"): "q_len", ("triton_flash", "bn"): "kv_len", ("triton_decode", "bn"): "kv_len",
}
"""Block sizes past a problem's length: the first that covers it is kept, larger ones only pad."""
REFUSED = "refused"  # user attribute of a trial whose configuration `reasons` refused (not run)
FAILED_SCORE = math.inf  # the score of a configuration that did not give a time

MeasureFn = Callable[[Kernel, Callable[[list[float]], bool] | None], Measurement]


def effective_values(family: str, problem: Problem) -> dict[str, list[int]]:
    """Each parameter's candidate values that give distinct kernels on `problem`."""
    space = param_space(family)
    out: dict[str, list[int]] = {}
    for name, values in space.items():
        values = sorted(values)
        if (family, name) in LENGTH_PARAMS:
            length = max(1, getattr(problem, LENGTH_PARAMS[family, name]))
            first_cover = next((v for v in values if v >= length), values[-1])
            out[name] = [v for v in values if v < length] + [first_cover]
        elif family == "small_q" and name == "splits":
            out[name] = _distinct(values, lambda v: effective_splits(v, problem.kv_len))
        elif family == "triton_decode" and name == "splits":  # splits actually used, at the finest key block
            out[name] = _distinct(values, lambda v: DecodeLayout.of(problem, v, min(space["bn"])).splits)
        else:
            out[name] = values
    return out


def _distinct(values: list[int], effect: Callable[[int], object]) -> list[int]:
    """The first of `values` (ascending) for each distinct `effect`."""
    first: dict[object, int] = {}
    for value in values:
        first.setdefault(effect(value), value)
    return list(first.values())


def configurations(values: dict[str, list[int]]) -> list[dict[str, int]]:
    names = list(values)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(values[n] for n in names))]


def build_kernel(family: str, params: dict[str, int]) -> Kernel:
    return PLAIN_FAMILIES[family](**params)


class RelativePruner(BasePruner):
    """Prunes a trial whose last reported time exceeds `ratio` times the best time known."""

    def __init__(self, ratio: float, best_s: float) -> None:
        self.ratio = ratio
        self.best_s = best_s

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        return step is not None and trial.intermediate_values[step] > self.ratio * self.best_s


def _distributions(values: dict[str, list[int]]) -> dict[str, IntDistribution]:
    return {name: IntDistribution(0, len(options) - 1) for name, options in values.items()}


def _encode(values: dict[str, list[int]], params: dict[str, object]) -> dict[str, int] | None:
    """Kernel params -> index params (None when a value is not a candidate here)."""
    try:
        return {name: values[name].index(params[name]) for name in values}
    except (KeyError, ValueError):
        return None


def _fail_orphans(storage: BaseStorage, study: optuna.Study) -> None:
    """Trials left RUNNING by a killed worker (we own the problem now): mark them failed."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)


def _seed_known(study: optuna.Study, family: str, values: dict, known: dict[str, Measurement]) -> None:
    present = {t.user_attrs.get("kernel") for t in study.get_trials(deepcopy=False)}
    distributions = _distributions(values)
    for name, measurement in known.items():
        if name in present or not name.startswith(family + "["):
            continue
        try:
            encoded = _encode(values, kernel_from_name(name).params)
        except ValueError:
            continue
        if encoded is None:
            continue
        attrs = {"kernel": name, "source": "sweep", **_refused_attr(measurement)}
        study.add_trial(optuna.trial.create_trial(params=encoded, distributions=distributions, user_attrs=attrs,
                                                  value=_score(measurement)))


def tune_family(problem: Problem, family: str, *, storage: BaseStorage, study_name: str, trials: int,
                known: dict[str, Measurement], best_s: float, measure: MeasureFn, seed: int) -> list[Measurement]:
    """Search `family`'s parameters on `problem` until the study holds `trials` finished trials.
    `known`: kernel name -> measurement already taken on this problem (updated in place); `best_s`:
    the fastest time measured on it (the pruner's yardstick); `measure` times one kernel, given the
    pruning hook. Returns the new measurements."""
    values = effective_values(family, problem)
    distributions = _distributions(values)
    pruner = RelativePruner(PRUNE_RATIO, best_s)
    study = optuna.create_study(
        storage=storage, study_name=study_name, load_if_exists=True, direction="minimize", pruner=pruner,
        sampler=TPESampler(seed=seed, n_startup_trials=TPE_STARTUP_TRIALS),
    )
    _fail_orphans(storage, study)
    _seed_known(study, family, values, known)
    every = configurations(values)
    untried = [c for c in every if _runnable(build_kernel(family, c), problem, known)]
    if len(untried) <= trials - _finished(study):  # small space: try every config, no sampling
        for config in untried:
            study.enqueue_trial(_encode(values, config))
    new: list[Measurement] = []
    refused_asks = len(every) - len(untried)  # asks that hit a refused config cost nothing to answer
    for _ in range(ASKS_PER_TRIAL * trials + refused_asks):
        if _finished(study) >= trials or not untried:
            break
        trial = study.ask(distributions)
        config = {name: values[name][trial.params[name]] for name in values}
        kernel = build_kernel(family, config)
        trial.set_user_attr("kernel", kernel.name)
        if kernel.name in known:  # never measure the same config twice
            previous = known[kernel.name]
            for key, value in _refused_attr(previous).items():
                trial.set_user_attr(key, value)
            study.tell(trial, _score(previous))
            continue
        complete = any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
        pruner.best_s = min(best_s, study.best_value) if complete else best_s
        measurement = measure(kernel, _prune_hook(trial))
        known[kernel.name] = measurement
        untried = [c for c in untried if build_kernel(family, c).name != kernel.name]
        new.append(measurement)
        for key, value in _refused_attr(measurement).items():
            trial.set_user_attr(key, value)
        if measurement.ok and measurement.extra.get("stopped") == "early":
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, _score(measurement))
    return new


def _score(measurement: Measurement) -> float:
    """A trial's value: the measured median, `FAILED_SCORE` when the config gave no time."""
    return measurement.median_s if measurement.ok else FAILED_SCORE


def _refused_attr(measurement: Measurement) -> dict[str, bool]:
    """``{REFUSED: True}`` for a configuration its `reasons` refused, else nothing."""
    return {REFUSED: True} if measurement.status == "unsupported" else {}


def _runnable(kernel: Kernel, problem: Problem, known: dict[str, Measurement]) -> bool:
    """Not measured yet, and not refused by the kernel's `reasons` on `problem`."""
    return kernel.name not in known and not kernel.reasons(problem)


def _finished(study: optuna.Study) -> int:
    """Trials that count against the budget: finished, except configurations refused unrun."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.is_finished() and not t.user_attrs.get(REFUSED))


def _prune_hook(trial: optuna.Trial) -> Callable[[list[float]], bool]:
    """Report the median once (after `min_reps`) and ask the pruner: one storage write per trial."""
    asked: list[bool] = []

    def should_stop(samples: list[float]) -> bool:
        if asked:
            return False
        asked.append(True)
        trial.report(statistics.median(samples), step=len(samples))
        return trial.should_prune()

    return should_stop
