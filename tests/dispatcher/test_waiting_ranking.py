"""With no table measured on the card, PyTorch's default runs a bucket's first call whatever the ranking, so the
ranking waits for the bucket's second call (`waiting_ranking.Waiting`): that first call ranks nothing, and the bucket
then decides, measures and explains as if it had ranked at once."""

from __future__ import annotations

import pytest

from attn_dispatch.dispatcher import Dispatcher, cold_path, measuring
from attn_dispatch.dispatcher.device_ranking import DeviceRanking
from attn_dispatch.dispatcher.waiting_ranking import WaitingRanking
from tests.dispatcher.helpers import PRIOR_SOURCE, TEST_SOURCE, FixedRanker, assert_matches_reference, qkv

pytestmark = pytest.mark.measuring

KERNELS = ["sdpa_default", "math", "chunked[q=128,kv=1024]"]
ORDER = ["math", "chunked[q=128,kv=1024]", "sdpa_default"]  # the prior's: the default last


def _ranked_by(monkeypatch, ranker: FixedRanker, source=PRIOR_SOURCE) -> None:
    """Rank with `ranker` as the device's analytic prior (nothing measured on the card), or as a table (`source`)."""
    table = ranker if source is TEST_SOURCE else None
    prior = None if source is TEST_SOURCE else ranker
    monkeypatch.setattr(cold_path, "resolve_ranking", lambda device, *, home=None: DeviceRanking(
        table=table, prior=prior, source=source, prior_source=PRIOR_SOURCE))


def _ranked_at_once(monkeypatch) -> None:
    """The dispatcher as it was before the ranking could wait: every bucket ranks on its first call."""
    monkeypatch.setattr(WaitingRanking, "default_first", lambda self, asked: None)
    monkeypatch.setattr(measuring, "_variants_run", set())


def _two_calls(monkeypatch, kernels: list[str], order: list[str], **shape):
    """Two calls of one shape: the ranking calls made by the first and by both, the plan, and its decision."""
    ranker = FixedRanker(order)
    _ranked_by(monkeypatch, ranker)
    ours = Dispatcher(kernels=kernels, measure=True, remember_tunings=False)
    inputs = qkv(**shape)
    assert_matches_reference(ours.attention(**inputs), inputs)
    first = ranker.calls
    assert_matches_reference(ours.attention(**inputs), inputs)
    plan = next(iter(ours._plans.values()))
    return first, ranker.calls, plan, ours.explain(**inputs)


def _same_decision(ours, reference) -> None:
    assert ours.kernel == reference.kernel and ours.source == reference.source
    assert ours.candidates == reference.candidates and ours.dropped == reference.dropped
    assert ours.notes[:-1] == reference.notes[:-1]  # the last: the measuring so far, with its timings


def _contenders(trial) -> list[tuple]:
    return [(c.name, c.option.predicted_s, c.option.workspace_bytes, c.calls, len(c.samples), c.out)
            for c in trial.contenders]


def test_a_first_call_without_a_table_runs_the_default_unranked_and_the_second_ranks_as_before(monkeypatch):
    first, both, plan, decision = _two_calls(monkeypatch, KERNELS, ORDER)
    assert (first, both) == (0, 1)
    assert plan.kernel.name == "sdpa_default" and plan.trial is not None and plan.trial.open
    _ranked_at_once(monkeypatch)
    reference_first, _, reference_plan, reference = _two_calls(monkeypatch, KERNELS, ORDER)
    assert reference_first == 1
    _same_decision(decision, reference)
    assert _contenders(plan.trial) == _contenders(reference_plan.trial)  # the same candidates, the same calls run


def test_a_new_shape_of_a_waiting_bucket_ranks_it_and_joins_its_trial(monkeypatch):
    ranker = FixedRanker(ORDER)
    _ranked_by(monkeypatch, ranker)
    ours = Dispatcher(kernels=KERNELS, measure=True, remember_tunings=False)
    ours.attention(**qkv(q_len=1, kv_len=65))
    assert ranker.calls == 0
    ours.attention(**qkv(q_len=1, kv_len=66))  # the same bucket, another exact shape
    assert ranker.calls == 1
    trials = {id(plan.trial) for plan in ours._plans.values()}
    assert len(trials) == 1 and len(next(iter(ours._plans.values())).trial.contenders) > 1


def test_a_waiting_bucket_with_nothing_to_measure_ends_its_trial_and_runs_its_plan_plainly(monkeypatch):
    first, _, plan, decision = _two_calls(monkeypatch, ["sdpa_default"], ["sdpa_default"])
    assert first == 0
    assert plan.trial is None and not plan.unguardable and plan.run is not None
    assert not any(note.startswith("measure") for note in decision.notes)
    _ranked_at_once(monkeypatch)
    _, _, reference_plan, reference = _two_calls(monkeypatch, ["sdpa_default"], ["sdpa_default"])
    assert reference_plan.trial is None
    assert decision.notes == reference.notes and decision.candidates == reference.candidates


def test_with_measuring_off_the_first_call_ranks_nothing_and_a_new_shape_decides_as_before(monkeypatch):
    ranker = FixedRanker(ORDER)
    _ranked_by(monkeypatch, ranker)
    ours = Dispatcher(kernels=KERNELS, measure=False)
    ours.attention(**qkv(q_len=1, kv_len=65))
    assert ranker.calls == 0
    decision = ours.explain(**qkv(q_len=1, kv_len=66))
    assert ranker.calls == 1 and decision.kernel == "sdpa_default"
    _ranked_at_once(monkeypatch)
    reference = Dispatcher(kernels=KERNELS, measure=False)
    reference.attention(**qkv(q_len=1, kv_len=65))
    _same_decision(decision, reference.explain(**qkv(q_len=1, kv_len=66)))
    assert decision.notes == reference.explain(**qkv(q_len=1, kv_len=66)).notes


def test_a_table_measured_on_the_card_ranks_on_the_first_call(monkeypatch):
    ranker = FixedRanker(ORDER)
    _ranked_by(monkeypatch, ranker, source=TEST_SOURCE)
    ours = Dispatcher(kernels=KERNELS, measure=True, remember_tunings=False)
    ours.attention(**qkv())
    assert ranker.calls == 1
