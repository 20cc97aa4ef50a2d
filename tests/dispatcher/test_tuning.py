"""First-call tuning: the closest candidates are timed on the call's own inputs, the fastest is kept
for the whole bucket, and nothing is timed when tuning is off or only one candidate is close."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.dispatcher import Dispatcher, tuning
from attn_dispatch.dispatcher.kernel_set import LastResortDefault
from attn_dispatch.dispatcher.planning import Option, failure_bucket
from attn_dispatch.dispatcher.tuning_store import TuningStore
from attn_dispatch.kernels import MathKernel, Problem
from attn_dispatch.models.environment import TUNE
from tests.dispatcher.helpers import FailingKernel, FixedRanker, assert_matches_reference, qkv, use_ranking

SLOW_S = 5e-3  # the slow double's virtual seconds per call (see `virtual_stopwatch`)
FAST_S = 1e-4
CLOCK = [0.0]  # virtual seconds: CountingMath calls advance it, the tuning stopwatch reads it


@pytest.fixture(autouse=True)
def virtual_stopwatch(monkeypatch):
    """Tuning times contenders with a stopwatch that reads `CLOCK`, not the wall clock: which
    kernel is faster must not depend on how busy the machine running the tests is."""
    from attn_dispatch.calibration import timer

    def time_batch(run, first, calls, device):
        start = CLOCK[0]
        for index in range(calls):
            run(first + index)
        return (CLOCK[0] - start) / calls

    monkeypatch.setattr(timer, "time_batch", time_batch)
    monkeypatch.setattr(timer, "calls_per_sample", lambda single_call_s: 1)


class CountingMath(MathKernel):
    """The math kernel under another name, counting its runs; each run takes `delay_s` (default
    `FAST_S`) on the virtual clock."""

    family = "counting"

    def __init__(self, label: str, delay_s: float = 0.0) -> None:
        self.label, self.delay_s, self.runs = label, delay_s, 0

    @property
    def name(self) -> str:
        return self.label

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem):
        self.runs += 1
        CLOCK[0] += self.delay_s or FAST_S
        return super().run(query, key, value, attn_mask, scale, enable_gqa, problem)


class CloseRanker(FixedRanker):
    """`order`, each predicted 1% behind the previous: all within the tuning margin."""

    def rank(self, problem, kernels):
        return [(name, 1e-6 * 1.01 ** i) for i, name in enumerate(self.order)]


def _pair(monkeypatch):
    slow, fast = CountingMath("slow", SLOW_S), CountingMath("fast")
    use_ranking(monkeypatch, CloseRanker(["slow", "fast"]))
    return slow, fast


def test_tuning_keeps_the_measured_fastest_for_the_bucket(monkeypatch):
    slow, fast = _pair(monkeypatch)
    ours = Dispatcher(kernels=[slow, fast], tune=True)
    inputs = qkv()
    assert_matches_reference(ours.attention(**inputs), inputs)
    decision = ours.explain(**inputs)
    assert decision.kernel == "fast"
    assert [c.name for c in decision.candidates] == ["fast", "slow"]
    assert any(note.startswith("tuned on the first call") and "slow" in note for note in decision.notes)
    timed_slow = slow.runs
    assert timed_slow >= 2  # a warm-up and at least one round's sample
    longer = qkv(q_len=7, kv_len=6)  # same power-of-two bucket: reuses the tuning, times nothing
    assert_matches_reference(ours.attention(**longer), longer)
    assert slow.runs == timed_slow and ours.explain(**longer).kernel == "fast"
    assert ours.stats() == {"fast": 2}


def test_candidates_predicted_far_behind_are_not_timed(monkeypatch):
    slow, fast = CountingMath("slow", SLOW_S), CountingMath("fast")
    use_ranking(monkeypatch, FixedRanker(["slow", "unknown", "fast"]))  # 1 us and 3 us: beyond the margin
    ours = Dispatcher(kernels=[slow, fast], tune=True)
    ours.attention(**qkv())
    assert ours.explain(**qkv()).kernel == "slow"
    assert (slow.runs, fast.runs) == (1, 0)


def test_without_tuning_the_ranking_decides_and_nothing_is_timed(monkeypatch):
    slow, fast = _pair(monkeypatch)
    ours = Dispatcher(kernels=[slow, fast])
    ours.attention(**qkv())
    assert ours.explain(**qkv()).kernel == "slow"
    assert (slow.runs, fast.runs) == (1, 0)


def test_environment_variable_turns_tuning_on(monkeypatch):
    slow, fast = _pair(monkeypatch)
    monkeypatch.setenv(TUNE.name, "1")
    ours = Dispatcher(kernels=[slow, fast])
    assert ours.tune
    ours.attention(**qkv())
    assert ours.explain(**qkv()).kernel == "fast"
    assert not Dispatcher(tune=False).tune


def test_a_contender_that_fails_is_not_chosen(monkeypatch):
    use_ranking(monkeypatch, CloseRanker(["failing", "math"]))
    ours = Dispatcher(kernels=[FailingKernel(), MathKernel()], tune=True)
    inputs = qkv()
    assert_matches_reference(ours.attention(**inputs), inputs)
    decision = ours.explain(**inputs)
    assert decision.kernel == "math"
    assert "injected failure" in decision.reason_dropped("failing")  # remembered for the bucket


def test_contenders_are_the_options_predicted_within_the_margin():
    def option(name, seconds):
        return Option(CountingMath(name), seconds, 0)

    options = (option("a", 1.0), option("b", 1.2), option("c", tuning.TUNE_MARGIN * 1.01), option("d", None))
    assert [o.kernel.name for o in tuning.contenders(options)] == ["a", "b"]
    many = tuple(option(str(i), 1.0 + 0.01 * i) for i in range(10))
    assert len(tuning.contenders(many)) == tuning.MAX_TUNED
    unpredicted_first = (option("x", None), option("y", 1.0))
    assert [o.kernel.name for o in tuning.contenders(unpredicted_first)] == ["x"]  # nothing to compare
    with_default = (*options, option("sdpa_default", 5.0))
    assert [o.kernel.name for o in tuning.contenders(with_default)] == ["a", "b", "sdpa_default"]
    last_resort = (*options, Option(LastResortDefault(), None, 0))  # the portable set's: never timed
    assert [o.kernel.name for o in tuning.contenders(last_resort)] == ["a", "b"]


def test_put_first_moves_one_option_and_keeps_the_rest_in_order():
    options = tuple(Option(CountingMath(name), 1.0, 0) for name in "abc")
    assert [o.kernel.name for o in tuning.put_first(options, "c")] == ["c", "a", "b"]
    assert tuning.put_first(options, "zzz") == options


class FlakyMath(CountingMath):
    """Runs its warm-up, then raises (as an out-of-memory in a later round would)."""

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem):
        if self.runs >= 1:
            self.runs += 1
            raise RuntimeError("injected failure after the warm-up")
        return super().run(query, key, value, attn_mask, scale, enable_gqa, problem)


def test_a_contender_failing_after_its_warm_up_is_not_chosen_and_the_call_answers(monkeypatch):
    flaky, fast = FlakyMath("flaky"), CountingMath("fast", SLOW_S)
    use_ranking(monkeypatch, CloseRanker(["flaky", "fast"]))
    ours = Dispatcher(kernels=[flaky, fast], tune=True)
    inputs = qkv()
    assert_matches_reference(ours.attention(**inputs), inputs)
    assert ours.explain(**inputs).kernel == "fast"


def test_a_decision_made_without_inputs_is_tuned_by_the_next_inference_call(monkeypatch):
    # explain() decides without a call's inputs; the decision must not stay untuned.
    slow, fast = _pair(monkeypatch)
    ours = Dispatcher(kernels=[slow, fast], tune=True)
    inputs = qkv()
    assert ours.explain(**inputs).kernel == "slow"  # nothing timed yet
    ours.attention(**inputs)
    ours.attention(**inputs)
    assert ours.explain(**inputs).kernel == "fast"
    assert ours.stats() == {"fast": 2}


def test_a_training_call_first_does_not_keep_the_shape_untuned(monkeypatch):
    slow, fast = _pair(monkeypatch)
    ours = Dispatcher(kernels=[slow, fast], tune=True)
    inputs = qkv()
    ours.attention(**{**inputs, "query": inputs["query"].clone().requires_grad_()})  # training route
    with torch.no_grad():
        ours.attention(**inputs)
    assert ours.explain(**inputs).kernel == "fast"


def test_nothing_is_kept_when_every_contender_fails():
    options = (Option(FailingKernel(), 1.0, 0), Option(FailingKernel(), 1.0, 0))
    assert tuning.tune(options, _inputs(), None, torch.device("cpu")) is None


def _inputs() -> tuple:
    inputs = qkv()
    return (inputs["query"], inputs["key"], inputs["value"], None, None, inputs["enable_gqa"])


def test_tunings_are_remembered_by_the_next_process(monkeypatch, tmp_path):
    slow, fast = _pair(monkeypatch)
    first = Dispatcher(kernels=[slow, fast], tune=True, home=tmp_path)
    first.attention(**qkv())
    timed = slow.runs
    files = list((tmp_path / "tunings").rglob("*.jsonl"))
    assert len(files) == 1 and '"kernel":"fast"' in files[0].read_text()
    again = Dispatcher(kernels=[slow, fast], tune=True, home=tmp_path)  # a restarted process
    again.attention(**qkv())
    assert slow.runs == timed and again.explain(**qkv()).kernel == "fast"  # nothing timed again
    assert any(note.startswith("tuned on the first call") for note in again.explain(**qkv()).notes)


def test_another_kernel_set_or_no_memory_tunes_afresh(monkeypatch, tmp_path):
    slow, fast = _pair(monkeypatch)
    Dispatcher(kernels=[slow, fast], tune=True, home=tmp_path).attention(**qkv())
    timed = slow.runs
    Dispatcher(kernels=[slow, fast, MathKernel()], tune=True, home=tmp_path).attention(**qkv())
    assert slow.runs > timed  # another set of contenders: its own store
    timed = slow.runs
    Dispatcher(kernels=[slow, fast], tune=True, home=tmp_path, remember_tunings=False).attention(**qkv())
    assert slow.runs > timed


def test_a_damaged_store_is_skipped_line_by_line(tmp_path):
    store = TuningStore(tmp_path / "t.jsonl")
    bucket = failure_bucket(Problem.from_tensors(**{k: v for k, v in qkv().items()}))
    store.append(bucket, tuning.Tuned("fast", (("fast", 1e-3), ("slow", float("inf")))))
    with open(store.path, "a") as handle:
        handle.write("not json\n" + '{"bucket": [1, 2], "kernel": "x", "seconds": [["x", 1]]}\n' + "{\n")
    loaded = store.load()
    assert list(loaded) == [bucket] and loaded[bucket].kernel == "fast"
    assert dict(loaded[bucket].seconds)["slow"] == float("inf")
    assert TuningStore(tmp_path / "missing.jsonl").load() == {}


def _tuned_with_samples(monkeypatch, samples: dict[str, list[float]]) -> str:
    """The kernel `tuning.tune` keeps when the stopwatch gives these samples (no real timing)."""
    monkeypatch.setattr(tuning, "_time_contenders", lambda timed, inputs, problem, device, on_failure: samples)
    options = tuple(Option(kernel, 1e-6, 0) for kernel in (MathKernel(), Dispatcher(kernels=["sdpa_default"]).kernels[0]))
    inputs = qkv()
    problem = Problem.from_tensors(inputs["query"], inputs["key"], inputs["value"], enable_gqa=True)
    args = (inputs["query"], inputs["key"], inputs["value"], None, None, True)
    return tuning.tune(options, args, problem, torch.device("cpu")).kernel


def test_pytorchs_default_stays_unless_beaten_beyond_the_noise(monkeypatch):
    steady = [1.0e-3] * 5
    assert _tuned_with_samples(monkeypatch, {"math": [0.99e-3] * 5, "sdpa_default": steady}) == "sdpa_default"
    assert _tuned_with_samples(monkeypatch, {"math": [0.5e-3] * 5, "sdpa_default": steady}) == "math"
    noisy = [0.6e-3, 0.7e-3, 0.8e-3, 0.9e-3, 1.0e-3]  # median 0.8 ms, but a 50% spread
    assert _tuned_with_samples(monkeypatch, {"math": noisy, "sdpa_default": steady}) == "sdpa_default"


def test_spread_is_relative_to_the_median():
    assert tuning.spread([1.0, 2.0, 3.0]) == 1.0
    assert tuning.spread([1.0]) == 0.0 and tuning.spread([1.0, float("inf")]) == 0.0
