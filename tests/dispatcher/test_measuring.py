"""A bucket's candidates measured on its own calls (`dispatcher.measuring`): each call runs one
candidate and returns that candidate's output; the baseline stays unless beaten in every round;
slow candidates cost a bounded few calls; results persist in the home. The clock is stood in for
(a virtual one advanced by the kernels): timings never decide a test."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from attn_dispatch.dispatcher import Dispatcher, measuring
from attn_dispatch.dispatcher import device_planner as planner
from attn_dispatch.dispatcher.call_clock import Reading
from attn_dispatch.dispatcher.measuring import (
    BASELINE_CALLS,
    BUDGET_CALLS,
    MAX_PENDING,
    ROUNDS,
    WARM_UP_CALLS,
    Trial,
)
from attn_dispatch.dispatcher.selection import Option
from attn_dispatch.kernels import MathKernel, Problem
from tests.dispatcher.helpers import FixedRanker, assert_matches_reference, qkv, use_ranking

pytestmark = pytest.mark.measuring

BASE_S = 1e-3  # the baseline's virtual seconds per call


class VirtualClock:
    """A clock reading `now` (advanced by `Timed` kernels); `capturing`: nothing may be timed;
    `late`: readings are not ready until `release` (a GPU's events still in flight)."""

    def __init__(self) -> None:
        self.now, self.capturing, self.late, self.held = 0.0, False, False, []

    def can_time(self) -> bool:
        return not self.capturing

    def start(self) -> float:
        return self.now

    def stop(self, started: float) -> Reading:
        reading = _LateReading(self.now - started, self)
        self.held.append(reading)
        return reading

    def release(self) -> None:
        self.late = False


class _LateReading(Reading):
    __slots__ = ("clock",)

    def __init__(self, seconds: float, clock: VirtualClock) -> None:
        super().__init__(seconds)
        self.clock = clock

    def ready(self) -> bool:
        return not self.clock.late


class Timed(MathKernel):
    """The math kernel under another name, advancing the virtual clock by `seconds` per call
    (`seconds_by_call(n)` for the n-th call, when given) and recording which outputs it made."""

    family = "timed"

    def __init__(self, label: str, seconds: float, clock: VirtualClock, *, seconds_by_call=None) -> None:
        self.label, self.seconds, self.clock, self.seconds_by_call = label, seconds, clock, seconds_by_call
        self.outputs: list[torch.Tensor] = []

    @property
    def name(self) -> str:
        return self.label

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem):
        step = self.seconds if self.seconds_by_call is None else self.seconds_by_call(len(self.outputs))
        self.clock.now += step
        out = super().run(query, key, value, attn_mask, scale, enable_gqa, problem)
        self.outputs.append(out)
        return out


@pytest.fixture
def clock(monkeypatch):
    virtual = VirtualClock()
    monkeypatch.setattr(planner, "clock_for", lambda device: virtual)
    return virtual


def _dispatcher(monkeypatch, kernels, *, home=None, **kwargs):
    use_ranking(monkeypatch, FixedRanker([k.name for k in kernels]))
    return Dispatcher(kernels=kernels, home=home, **kwargs)


def _calls(ours, n, **shape):
    inputs = qkv(**shape)
    outs = [ours.attention(**inputs) for _ in range(n)]
    return inputs, outs


def _plan_call(trial: Trial, kernel) -> Callable[[], torch.Tensor]:
    """One call of a measuring plan of `kernel` whose trial is `trial` (what the dispatcher's plan runs)."""
    inputs = qkv()
    problem = Problem.from_tensors(inputs["query"], inputs["key"], inputs["value"], None, False, True)

    class Plan:  # what a measuring plan gives its trial
        count = [0]

    Plan.kernel, Plan.problem = kernel, problem
    run = trial.runner(Plan)
    return lambda: run(inputs["query"], inputs["key"], inputs["value"], None, None, True, problem)


def test_each_call_runs_one_candidate_and_returns_its_output(monkeypatch, clock):
    base, other = Timed("base", BASE_S, clock), Timed("other", 2 * BASE_S, clock)
    ours = _dispatcher(monkeypatch, [base, other])
    inputs = qkv()
    outs = []
    for _ in range(BASELINE_CALLS + 2):
        before = (len(base.outputs), len(other.outputs))
        outs.append(ours.attention(**inputs))
        ran = base if len(base.outputs) > before[0] else other
        assert len(base.outputs) + len(other.outputs) == sum(before) + 1  # one kernel per call, never two
        assert outs[-1] is ran.outputs[-1]  # the call's output is that candidate's
        assert_matches_reference(outs[-1], inputs)
    assert len(base.outputs) == BASELINE_CALLS and len(other.outputs) == 2  # the baseline first, then the next


def test_a_faster_candidate_wins_after_its_rounds_and_serves_the_bucket(monkeypatch, clock):
    base, fast = Timed("base", BASE_S, clock), Timed("fast", BASE_S / 2, clock)
    ours = _dispatcher(monkeypatch, [base, fast])
    inputs, _ = _calls(ours, BASELINE_CALLS + 2 * (ROUNDS + 1) + 2)
    decision = ours.explain(**inputs)
    assert decision.kernel == "fast"
    assert any(note.startswith("measured on this bucket's calls") and "fast beat base in every round" in note
               for note in decision.notes)
    plan = next(iter(ours._plans.values()))
    assert plan.trial is None and plan.kernel is fast  # planned again from the decided bucket: warm path and hot path
    served = len(fast.outputs)
    sibling = qkv(q_len=7, kv_len=6)  # same power-of-two bucket: no new measuring
    assert_matches_reference(ours.attention(**sibling), sibling)
    assert len(fast.outputs) == served + 1 and ours.explain(**sibling).kernel == "fast"


class _DeviceReading(_LateReading):
    """A reading whose events spanned `excess` seconds beyond the host's call."""

    __slots__ = ("excess",)

    def __init__(self, seconds: float, clock: VirtualClock, excess: float) -> None:
        super().__init__(seconds, clock)
        self.excess = excess

    def device_excess(self) -> float:
        return self.excess


class _HostBound(Timed):
    """A `Timed` kernel whose calls the device outlasts by `excess` seconds (a clock with events reads it)."""

    def __init__(self, label: str, seconds: float, clock: VirtualClock, excess: float) -> None:
        super().__init__(label, seconds, clock)
        self.excess = excess

    def run(self, *args):
        self.clock.excess = self.excess
        return super().run(*args)


@pytest.mark.parametrize(("fast_s", "baseline_excess", "winner"), [
    (0.7 * BASE_S, 0.02 * BASE_S, "base"),  # 30% faster on the host alone: the measuring path's launch
    (0.7 * BASE_S, 0.6 * BASE_S, "fast"),  # the baseline's device time backs the saving
    (0.2 * BASE_S, 0.0, "fast"),  # 5x faster: host work every call pays (a per-shape plan), not the path's launch
])
def test_on_a_device_a_saving_counts_only_as_far_as_the_baseline_s_device_time_backs_it(
        monkeypatch, clock, fast_s, baseline_excess, winner):
    """Readings that are the host's call (the device done before the host) compare the measuring's Python path,
    not the fast path that serves the decided bucket: a candidate faster only there, by less than its own time,
    does not replace the baseline."""
    clock.excess = 0.0
    monkeypatch.setattr(clock, "stop", lambda started: _DeviceReading(clock.now - started, clock, clock.excess))
    base = _HostBound("base", BASE_S, clock, baseline_excess)
    fast = _HostBound("fast", fast_s, clock, 0.0)
    ours = _dispatcher(monkeypatch, [base, fast])
    inputs, _ = _calls(ours, BASELINE_CALLS + 2 * (ROUNDS + 1) + 2)
    decision = ours.explain(**inputs)
    assert decision.kernel == winner
    note = next(n for n in decision.notes if n.startswith("measured on this bucket's calls"))
    assert ("not device time: not taken" in note) == (winner == "base")


def _held(clock: VirtualClock, reading: Reading) -> Reading:
    clock.held.append(reading)
    return reading


def test_a_reading_that_completes_after_the_decision_changes_nothing(monkeypatch, clock):
    """Readings wait for their events (`MAX_PENDING`) and are collected together: one that completes after the bucket
    decided is left out, so the outcome and its account stay as decided."""
    clock.excess = 0.0
    monkeypatch.setattr(clock, "stop", lambda started: _held(clock, _DeviceReading(clock.now - started, clock, clock.excess)))
    base = _HostBound("base", BASE_S, clock, 0.02 * BASE_S)
    fast = _HostBound("fast", 0.7 * BASE_S, clock, 0.0)  # faster by host time only: not taken
    trial = Trial((Option(base, None, 0), Option(fast, None, 0)), clock, fits=lambda kernel, problem: True)
    call = _plan_call(trial, base)
    decided_with = []
    monkeypatch.setattr(trial, "on_close", lambda closed: decided_with.append(
        ([len(c.samples) for c in closed.contenders], closed.result, list(closed.host_bound))))
    call()
    call()  # the baseline's warm-up and first sample, collected as they come: its reference is known
    clock.late = True  # every reading waits until released: two pending, then calls run untimed
    while trial.open:
        call()
        if len(trial._pending) == MAX_PENDING:
            clock.release()
            call()  # collects both: the first may decide, the second then comes late
            clock.late = True
    recorded = WARM_UP_CALLS * len(trial.contenders) + sum(len(c.samples) for c in trial.contenders)
    assert len(clock.held) > recorded  # a reading was still out when the trial decided
    clock.release()
    trial._collect()
    assert decided_with == [([len(c.samples) for c in trial.contenders], trial.result, trial.host_bound)]
    assert trial.host_bound == ["fast"] and trial.result.kernel == "base"


def test_a_baseline_that_fails_closes_its_trial_deciding_nothing(clock):
    """Nothing can be measured against a baseline that raised: the trial closes with no result (its bucket decides
    again, without it), instead of staying open with every call untimed."""

    class Failing(Timed):
        def run(self, *args):
            raise RuntimeError("no kernel image for this device")

    base, other = Failing("base", BASE_S, clock), Timed("other", BASE_S, clock)
    failed = []
    trial = Trial((Option(base, None, 0), Option(other, None, 0)), clock, fits=lambda kernel, problem: True,
                  on_failure=lambda name, error: failed.append(name))
    out = _plan_call(trial, other)()  # the plan's own kernel is another: it serves the call
    assert out is other.outputs[-1] and failed == ["base"]
    assert not trial.open and trial.result is None


def test_the_baseline_stays_unless_beaten_in_every_round(monkeypatch, clock):
    base = Timed("base", BASE_S, clock)
    # 30% faster on four calls in five, 2x slower on the fifth: a lower median, but not every round
    noisy = Timed("noisy", 0.0, clock, seconds_by_call=lambda n: 2 * BASE_S if n % 5 == 3 else 0.7 * BASE_S)
    ours = _dispatcher(monkeypatch, [base, noisy])
    inputs, _ = _calls(ours, 40)
    trial_note = next(n for n in ours.explain(**inputs).notes if n.startswith("measured on this bucket's calls"))
    assert ours.explain(**inputs).kernel == "base" and "the baseline stays" in trial_note


def test_a_clearly_slower_candidate_leaves_after_one_sample(monkeypatch, clock):
    base, slow, fast = Timed("base", BASE_S, clock), Timed("slow", 1.5 * BASE_S, clock), Timed("fast", BASE_S / 2, clock)
    ours = _dispatcher(monkeypatch, [base, slow, fast])
    _calls(ours, 60)
    assert len(slow.outputs) == 2  # its warm-up and one sample
    assert ours.explain(**qkv()).kernel == "fast"


def test_what_slower_candidates_cost_a_bucket_is_bounded(monkeypatch, clock):
    base = Timed("base", BASE_S, clock)
    slow = [Timed(f"slow{i}", 1.4 * BASE_S, clock) for i in range(5)]  # each within its prediction's reach
    ours = _dispatcher(monkeypatch, [base, *slow])
    _calls(ours, 100)
    spent = sum(max(0, len(k.outputs) - 1) * (k.seconds - BASE_S) for k in slow)  # each first run is not charged
    assert spent <= (BUDGET_CALLS + 1) * BASE_S  # the budget, overshot by at most the call that spent it
    assert ours.explain(**qkv()).kernel == "base"


def test_a_variant_run_before_in_the_process_pays_its_warm_up_from_the_budget(monkeypatch, clock):
    base = Timed("base", BASE_S, clock)
    slow = [Timed(f"slow{i}", 1.4 * BASE_S, clock) for i in range(5)]
    monkeypatch.setattr(measuring, "first_run", lambda kernel, problem: False)
    ours = _dispatcher(monkeypatch, [base, *slow])
    _calls(ours, 100)
    spent = sum(len(k.outputs) * (k.seconds - BASE_S) for k in slow)
    assert all(len(k.outputs) <= WARM_UP_CALLS + 1 for k in slow)  # warmed up before it was spent: one sample each
    assert spent <= (BUDGET_CALLS + 1) * BASE_S + len(slow) * (slow[0].seconds - BASE_S)


def test_a_first_run_in_the_process_is_not_charged_to_the_bucket(monkeypatch, clock):
    """A candidate's first call that loads its code (a once-per-process cost) does not end the trial."""
    base = Timed("base", BASE_S, clock)
    loading = Timed("loading", 0.0, clock, seconds_by_call=lambda n: 100 * BASE_S if n == 0 else BASE_S / 2)
    ours = _dispatcher(monkeypatch, [base, loading])
    _calls(ours, 30)
    assert ours.explain(**qkv()).kernel == "loading"


def test_a_candidate_whose_first_call_alone_would_spend_the_budget_never_runs(monkeypatch, clock):
    base, huge = Timed("base", BASE_S, clock), Timed("huge", 100 * BASE_S, clock)
    use_ranking(monkeypatch, _Predicting({"base": 1e-3, "huge": 1e-1}))
    ours = Dispatcher(kernels=[base, huge])
    _calls(ours, 20)
    assert huge.outputs == []
    note = next(n for n in ours.explain(**qkv()).notes if n.startswith("measured on this bucket's calls"))
    assert "predicted 100x the baseline's time" in note


class _Predicting(FixedRanker):
    """Ranks by the given predicted seconds per kernel name."""

    def __init__(self, seconds: dict[str, float]) -> None:
        super().__init__(sorted(seconds, key=seconds.get))
        self.seconds = seconds

    def rank(self, problem, kernels):
        return sorted(self.seconds.items(), key=lambda item: item[1])


def test_a_failing_candidate_is_out_and_its_call_still_answers(monkeypatch, clock):
    class Failing(Timed):
        def run(self, *args):
            raise RuntimeError("injected failure on a candidate")

    base, failing = Timed("base", BASE_S, clock), Failing("failing", BASE_S, clock)
    ours = _dispatcher(monkeypatch, [base, failing])
    inputs, outs = _calls(ours, BASELINE_CALLS + 3)
    for out in outs:
        assert_matches_reference(out, inputs)
    decision = ours.explain(**inputs)
    assert decision.kernel == "base"
    assert "injected failure" in decision.reason_dropped("failing")  # remembered for the bucket


def test_nothing_is_timed_while_a_graph_is_captured(monkeypatch, clock):
    base, other = Timed("base", BASE_S, clock), Timed("other", BASE_S / 2, clock)
    ours = _dispatcher(monkeypatch, [base, other])
    clock.capturing = True
    inputs, outs = _calls(ours, 10)
    assert len(base.outputs) == 10 and other.outputs == []  # the serving kernel, untimed
    trial = ours._plans.get(next(iter(ours._plans))).trial
    assert trial.open and all(not c.samples and not c.calls for c in trial.contenders)


def test_readings_still_on_the_device_are_awaited_without_blocking(monkeypatch, clock):
    base, other = Timed("base", BASE_S, clock), Timed("other", BASE_S / 2, clock)
    ours = _dispatcher(monkeypatch, [base, other])
    clock.late = True
    _calls(ours, 10)
    trial = next(iter(ours._plans.values())).trial
    assert trial.contenders[0].calls == BASELINE_CALLS and trial.contenders[1].calls == 0  # untimed until read
    clock.release()
    _calls(ours, 3)
    assert trial.contenders[0].samples and trial.contenders[1].calls > 0


def test_under_torch_compile_the_measuring_bucket_traces_its_serving_kernel(monkeypatch, clock):
    base, other = Timed("base", BASE_S, clock), Timed("other", BASE_S / 2, clock)
    ours = _dispatcher(monkeypatch, [base, other])
    inputs = qkv()
    ours.attention(**inputs)  # eager: the bucket measures, its baseline's warm-up ran
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: ours.attention(q, k, v, enable_gqa=True), backend="eager", fullgraph=True)
    calls = len(base.outputs) + len(other.outputs)
    out = compiled(inputs["query"], inputs["key"], inputs["value"])
    assert_matches_reference(out, inputs)
    trial = ours._plans.get(next(iter(ours._plans))).trial
    assert trial.contenders[0].calls == 1 and trial.contenders[1].calls == 0  # tracing timed nothing
    assert len(other.outputs) == 0 and len(base.outputs) > calls - 1
    torch._dynamo.reset()


def test_stats_count_each_call_under_the_candidate_that_ran_it(monkeypatch, clock):
    base, other = Timed("base", BASE_S, clock), Timed("other", 2 * BASE_S, clock)
    ours = _dispatcher(monkeypatch, [base, other])
    _calls(ours, 30)
    assert ours.stats() == {"base": len(base.outputs), "other": len(other.outputs)}


def test_explain_says_a_measurement_is_pending(monkeypatch, clock):
    base, other = Timed("base", BASE_S, clock), Timed("other", BASE_S / 2, clock)
    ours = _dispatcher(monkeypatch, [base, other])
    inputs, _ = _calls(ours, 1)
    pending = [n for n in ours.explain(**inputs).notes if n.startswith("measurement pending")]
    assert len(pending) == 1 and "base" in pending[0] and "other not yet timed" in pending[0]


def test_measured_buckets_are_kept_for_the_next_process(monkeypatch, clock, tmp_path):
    base, fast = Timed("base", BASE_S, clock), Timed("fast", BASE_S / 2, clock)
    _calls(_dispatcher(monkeypatch, [base, fast], home=tmp_path), 40)
    files = list((tmp_path / "tunings").rglob("*.jsonl"))
    assert len(files) == 1 and '"kernel":"fast"' in files[0].read_text()
    again = _dispatcher(monkeypatch, [base, fast], home=tmp_path)  # a restarted process: same home
    runs = len(base.outputs)
    inputs, _ = _calls(again, 3)
    assert len(base.outputs) == runs  # nothing measured again: the kept result serves
    decision = again.explain(**inputs)
    assert decision.kernel == "fast" and any("kept in the home's tuning store" in n for n in decision.notes)
    assert _calls(_dispatcher(monkeypatch, [base, fast], home=tmp_path, remember_tunings=False), 1)
    assert len(base.outputs) == runs + 1  # not remembering: it measures afresh, the baseline first


def test_measuring_off_runs_the_ranking_and_times_nothing(monkeypatch, clock):
    base, fast = Timed("base", BASE_S, clock), Timed("fast", BASE_S / 2, clock)
    monkeypatch.setenv("ATTN_DISPATCH_MEASURE", "0")
    ours = _dispatcher(monkeypatch, [base, fast])
    _calls(ours, 20)
    assert fast.outputs == [] and ours.explain(**qkv()).kernel == "base"
    assert Dispatcher(measure=True).measure and not Dispatcher().measure


def test_a_trial_needs_two_candidates():
    with pytest.raises(ValueError, match="at least two"):
        Trial((Option(MathKernel(), None, 0),), VirtualClock(), fits=lambda kernel, problem: True)


def test_a_trial_reports_its_result_with_every_median(clock):
    base, fast = Timed("base", BASE_S, clock), Timed("fast", BASE_S / 2, clock)
    closed = []
    trial = Trial((Option(base, None, 0), Option(fast, None, 0)), clock, fits=lambda kernel, problem: True,
                  on_close=closed.append)
    call = _plan_call(trial, base)
    for _ in range(40):
        call()
    assert closed == [trial] and trial.result.kernel == "fast"
    assert dict(trial.result.seconds) == pytest.approx({"base": BASE_S, "fast": BASE_S / 2})
    assert all(math.isfinite(s) for _, s in trial.result.seconds)


def test_a_trial_that_compared_nothing_is_not_kept_for_other_processes(monkeypatch, clock, tmp_path):
    base = Timed("base", BASE_S, clock)
    first_calls = Timed("cold", 0.0, clock, seconds_by_call=lambda n: 100 * BASE_S if n == 0 else BASE_S / 2)
    monkeypatch.setattr(measuring, "first_run", lambda kernel, problem: False)  # its code was loaded before
    ours = _dispatcher(monkeypatch, [base, first_calls], home=tmp_path)  # its first call spends the budget at once
    _calls(ours, 10)
    assert len(first_calls.outputs) == 1 and ours.explain(**qkv()).kernel == "base"
    assert not list((tmp_path / "tunings").rglob("*.jsonl"))  # the next process measures again


def test_warm_ups_that_spend_the_budget_leave_started_candidates_their_first_sample(monkeypatch, clock, tmp_path):
    """One-off costs of first calls at a new shape (memory, lazy set-up) are charged, but they are no sign of being
    slower: a candidate whose warm-up ran gets its first sample, whichever warm-ups spent the budget."""
    base = Timed("base", BASE_S, clock)
    fast = Timed("fast", 0.0, clock, seconds_by_call=lambda n: 2.5 * BASE_S if n == 0 else BASE_S / 2)
    slow = Timed("slow", 0.0, clock, seconds_by_call=lambda n: 2.5 * BASE_S if n == 0 else 2 * BASE_S)
    monkeypatch.setattr(measuring, "first_run", lambda kernel, problem: False)  # their code was loaded before
    use_ranking(monkeypatch, _Predicting({"base": BASE_S, "fast": BASE_S, "slow": BASE_S}))  # each within the budget
    ours = Dispatcher(kernels=[base, fast, slow], home=tmp_path)  # the two warm-ups spend 3 baseline calls
    _calls(ours, BASELINE_CALLS + 2 * WARM_UP_CALLS + 2 * ROUNDS + 2)
    assert len(slow.outputs) == WARM_UP_CALLS + 1  # its sample is slower: out
    assert ours.explain(**qkv()).kernel == "fast"
    assert list((tmp_path / "tunings").rglob("*.jsonl"))


class _Gated(Reading):
    """A reading that is ready once `open` (its events done on the device)."""

    __slots__ = ("open",)

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.open = False

    def ready(self) -> bool:
        return self.open


def test_a_warm_up_still_on_the_device_when_the_budget_is_spent_waits_for_its_reading(monkeypatch, clock):
    """A GPU's readings come in call order: another candidate's may spend the budget while this one's warm-up is
    still on the device. It stays, without a call, until that reading is in: then it gets its sample, unless its
    own warm-up cost the whole budget."""
    gated: list[_Gated] = []
    monkeypatch.setattr(clock, "stop", lambda started: gated.append(_Gated(clock.now - started)) or gated[-1])
    monkeypatch.setattr(measuring, "first_run", lambda kernel, problem: False)
    base = Timed("base", BASE_S, clock)
    costly = Timed("costly", 0.0, clock, seconds_by_call=lambda n: 100 * BASE_S if n == 0 else 2 * BASE_S)
    fast = Timed("fast", BASE_S / 2, clock)
    huge = Timed("huge", 100 * BASE_S, clock)
    trial = Trial(tuple(Option(k, None, 0) for k in (base, costly, fast, huge)), clock, fits=lambda kernel, problem: True)
    call = _plan_call(trial, base)

    def call_released():
        for reading in gated:
            reading.open = True
        call()

    for _ in range(BASELINE_CALLS):
        call_released()  # the baseline's warm-up and sample
    call_released()  # the baseline's sample is in (its reference known); costly's warm-up
    call()  # fast's warm-up: both still on the device (MAX_PENDING)
    assert len(gated) == BASELINE_CALLS + 2 and len(trial._pending) == MAX_PENDING
    gated[2].open = True  # costly's reading comes in: the budget is spent
    call()
    costly_c, fast_c = trial.contenders[1], trial.contenders[2]
    assert costly_c.out is not None and fast_c.out is None  # fast's warm-up is not in yet: no call, not out
    assert (len(costly.outputs), len(fast.outputs)) == (WARM_UP_CALLS, WARM_UP_CALLS)
    while trial.open:
        call_released()
    assert trial.result.kernel == "fast" and len(costly.outputs) == WARM_UP_CALLS
    assert huge.outputs == []  # not run when the budget was spent: it leaves


def test_a_candidate_whose_deferred_probe_fails_leaves_the_trial_unrun(monkeypatch, clock):
    """Ranked while probes are deferred (`sdpa_default.probes_deferred`), a backend whose probe then
    fails where it would first run never runs: it leaves the trial, which goes on without it."""
    from attn_dispatch.kernels import sdpa_default

    class Refusing(Timed):
        def reasons(self, problem):
            return [] if sdpa_default._DEFERRED.get() else ["its probe failed (wrong results on this build)"]

    base, refusing, fast = Timed("base", BASE_S, clock), Refusing("refusing", BASE_S, clock), Timed("fast", BASE_S / 2, clock)
    ours = _dispatcher(monkeypatch, [base, refusing, fast])
    trial = None
    for _ in range(40):
        ours.attention(**qkv())
        trial = trial or next(iter(ours._plans.values())).trial
    assert refusing.outputs == [] and "cannot run" in trial.contenders[1].out
    assert not trial.open and ours.explain(**qkv()).kernel == "fast"
