"""optuna search of a family's parameters: distinct configs only, never the same config twice
(also across a resumed study), clearly losing configs pruned."""

from __future__ import annotations

import math

import optuna
from optuna.trial import TrialState

from attn_dispatch.calibration.storage import open_storage
from attn_dispatch.calibration.tuning import configurations, effective_values, tune_family
from attn_dispatch.models.measurement import Measurement
from tests.calibration.helpers import problem


def test_effective_values_drop_equivalent_configs():
    decode = effective_values("chunked", problem(q_len=1, kv_len=300))
    assert decode == {"q": [64], "kv": [256, 512]}
    assert effective_values("small_q", problem(q_len=1, kv_len=7)) == {"splits": [1, 8]}
    assert len(configurations(effective_values("small_q", problem(kv_len=4096)))) == 8


def _fake(p, calls, best_q=256, best_kv=1024):
    def measure(kernel, hook):
        seconds = 1e-3 * (1 + abs(math.log2(kernel.q_chunk / best_q)) + abs(math.log2(kernel.kv_chunk / best_kv)))
        stopped = "early" if hook is not None and hook([seconds] * 3) else "stable"
        calls.append(kernel.name)
        return Measurement(problem=p, kernel=kernel.name, median_s=seconds, reps=3, extra={"stopped": stopped})
    return measure


def test_no_config_measured_twice_across_a_resume(tmp_path):
    p = problem(q_len=2048, kv_len=4096)
    storage = open_storage(None, default_journal=tmp_path / "j.journal")
    known = {"chunked[q=512,kv=4096]": Measurement(problem=p, kernel="chunked[q=512,kv=4096]", median_s=4e-3)}
    calls: list[str] = []
    kwargs = dict(storage=storage, study_name="cal|tune|chunked|p", best_s=1e-3, measure=_fake(p, calls), seed=0)
    first = tune_family(p, "chunked", trials=6, known=known, **kwargs)
    assert len(first) == len(calls) and "chunked[q=512,kv=4096]" not in calls
    resumed = tune_family(p, "chunked", trials=12, known=known, **kwargs)
    assert len(calls) == len(set(calls)) == len(first) + len(resumed)
    study = optuna.load_study(study_name="cal|tune|chunked|p", storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) >= 12
    assert any(t.user_attrs.get("source") == "sweep" for t in study.trials)  # the default seeded in
    states = {t.user_attrs["kernel"]: t.state for t in study.trials if t.user_attrs.get("kernel") in calls}
    assert TrialState.PRUNED in states.values()  # > 2x the best known: pruned
    assert all(known[name].median_s > 2e-3 for name, s in states.items() if s == TrialState.PRUNED)


def test_small_space_is_tried_exhaustively(tmp_path):
    p = problem(q_len=1, kv_len=300)
    storage = open_storage(None, default_journal=tmp_path / "j.journal")
    calls: list[str] = []
    tune_family(p, "chunked", storage=storage, study_name="s", trials=10, known={}, best_s=1.0,
                measure=_fake(p, calls), seed=0)
    assert sorted(calls) == ["chunked[q=64,kv=256]", "chunked[q=64,kv=512]"]
