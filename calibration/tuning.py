"""optuna search over one kernel family's parameters (chunk sizes, splits) on one problem, with
real timings.

One study per (calibration, family, problem) in the shared storage, so a killed run resumes its
search. Parameters are indices into the family's candidate values, restricted to those that give
distinct kernels on this problem (a 4096-row query chunk is the same kernel as a 64-row one when
the query has 1 row), so TPE sees an ordinal space. The sweep's default configurations are added
to the study as finished trials; a config already measured (in the study, the sweep or the results
store) is never measured again; a config clearly losing after its first repetitions is pruned.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable

import optuna
from optuna.distributions import IntDistribution
from optuna.pruners import BasePruner
from optuna.samplers import TPESampler
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import PLAIN_FAMILIES, kernel_from_name, param_space
from attn_dispatch.kernels.small_q import effective_splits
from attn_dispatch.models.measurement import Measurement

TUNABLE_FAMILIES = ("chunked", "small_q")
# Tune a family on a problem when its best default configuration is within this factor of the
# problem's fastest kernel: elsewhere better parameters cannot change the decision.
TUNE_WITHIN = 1.5
# A configuration whose median after `min_reps` repetitions is this many times the best time known
# for the problem is "clearly losing": pruned, its few repetitions kept as a data point.
PRUNE_RATIO = 2.0
# Asks per wanted trial before giving up on a small space (asks that hit a measured config are free).
ASKS_PER_TRIAL = 3
# TPE's random start-up trials (optuna's default is 10; our studies have about 10 trials in all).
TPE_STARTUP_TRIALS = 3
LENGTH_PARAMS = {("chunked", "q"): "q_len", ("chunked", "kv"): "kv_len"}

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
            seen, kept = set(), []
            for v in values:
                if effective_splits(v, problem.kv_len) not in seen:
                    seen.add(effective_splits(v, problem.kv_len))
                    kept.append(v)
            out[name] = kept
        else:
            out[name] = values
    return out


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
        kernel = build_kernel_from_name(name)
        encoded = _encode(values, kernel.params) if kernel is not None else None
        if encoded is None:
            continue
        ok = measurement.status == "ok"
        study.add_trial(optuna.trial.create_trial(
            params=encoded, distributions=distributions, user_attrs={"kernel": name, "source": "sweep"},
            value=measurement.median_s if ok else None, state=TrialState.COMPLETE if ok else TrialState.FAIL,
        ))


def build_kernel_from_name(name: str) -> Kernel | None:
    try:
        return kernel_from_name(name)
    except ValueError:
        return None


def tune_family(
    problem: Problem,
    family: str,
    *,
    storage: BaseStorage,
    study_name: str,
    trials: int,
    known: dict[str, Measurement],
    best_s: float,
    measure: MeasureFn,
    seed: int,
) -> list[Measurement]:
    """Search `family`'s parameters on `problem` until the study holds `trials` finished trials.

    Parameters
    ----------
    known: kernel name -> measurement already taken on this problem (updated in place).
    best_s: the fastest time measured on this problem (the pruner's yardstick).
    measure: times one kernel; receives the pruning hook for `time_repetitions`.

    Returns the new measurements (each config measured at most once).
    """
    values = effective_values(family, problem)
    distributions = _distributions(values)
    pruner = RelativePruner(PRUNE_RATIO, best_s)
    study = optuna.create_study(
        storage=storage, study_name=study_name, load_if_exists=True, direction="minimize", pruner=pruner,
        sampler=TPESampler(seed=seed, n_startup_trials=TPE_STARTUP_TRIALS),
    )
    _fail_orphans(storage, study)
    _seed_known(study, family, values, known)
    untried = [c for c in configurations(values) if build_kernel(family, c).name not in known]
    finished = sum(1 for t in study.get_trials(deepcopy=False) if t.state.is_finished())
    if len(untried) <= trials - finished:  # small space: try every config, no sampling
        for config in untried:
            study.enqueue_trial(_encode(values, config))
    new: list[Measurement] = []
    for _ in range(ASKS_PER_TRIAL * trials):
        finished = sum(1 for t in study.get_trials(deepcopy=False) if t.state.is_finished())
        if finished >= trials or not untried:
            break
        trial = study.ask(distributions)
        config = {name: values[name][trial.params[name]] for name in values}
        kernel = build_kernel(family, config)
        trial.set_user_attr("kernel", kernel.name)
        if kernel.name in known:  # never measure the same config twice
            previous = known[kernel.name]
            study.tell(trial, previous.median_s if previous.status == "ok" else None,
                       state=TrialState.COMPLETE if previous.status == "ok" else TrialState.FAIL)
            continue
        pruner.best_s = min(best_s, study.best_value if _has_complete(study) else best_s)
        measurement = measure(kernel, _prune_hook(trial))
        known[kernel.name] = measurement
        untried = [c for c in untried if build_kernel(family, c).name != kernel.name]
        new.append(measurement)
        if measurement.status != "ok":
            study.tell(trial, state=TrialState.FAIL)
        elif measurement.extra.get("stopped") == "early":
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, measurement.median_s)
    return new


def _has_complete(study: optuna.Study) -> bool:
    return any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False))


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
