"""Where predicted times come from: tables, the prior, and what happens when they fail."""

from __future__ import annotations

import warnings

import pytest

from attn_dispatch.dispatcher import Dispatcher, TableWarning
from attn_dispatch.dispatcher.device_ranking import resolve_ranking
from attn_dispatch.kernels import MathKernel, Problem
from tests.dispatcher.helpers import BrokenRanker, FixedRanker, assert_matches_reference, qkv, use_ranking


def test_table_order_is_followed_and_explained(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["chunked[q=128,kv=1024]", "math"]))
    ours = Dispatcher(kernels="portable")
    decision = ours.explain(**qkv())
    assert decision.kernel == "chunked[q=128,kv=1024]" and decision.params == {"q": 128, "kv": 1024}
    assert [c.name for c in decision.candidates[:2]] == ["chunked[q=128,kv=1024]", "math"]
    assert decision.predicted_s == pytest.approx(1e-6)
    assert decision.source.level == "exact" and decision.source.path == "<test>"
    text = str(decision)
    assert "chunked[q=128,kv=1024]" in text and "1 us" in text and "lookup level: exact" in text
    assert decision.to_dict()["candidates"][0]["predicted_s"] == pytest.approx(1e-6)


def test_sdpa_default_is_always_a_fallback_candidate(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math"]))  # a table that never mentions sdpa_default
    names = [c.name for c in Dispatcher(kernels="all").explain(**qkv()).candidates]
    assert names[0] == "math" and names.index("sdpa_default") == 1  # first of the kernels the table did not rank
    portable = [c.name for c in Dispatcher(kernels="portable").explain(**qkv()).candidates]
    assert portable[0] == "math" and portable[-1] == "sdpa_default"  # the portable set's last resort: last


def test_portable_sets_last_resort_is_never_ranked(monkeypatch):
    # A table that ranks PyTorch's default first (on a GPU with fused backends it is fast): in the
    # portable set, which emulates a card without them, it stays the last resort.
    use_ranking(monkeypatch, FixedRanker(["sdpa_default", "math", "chunked[q=128,kv=1024]"]))
    portable = [c.name for c in Dispatcher(kernels="portable").explain(**qkv()).candidates]
    assert portable[:2] == ["math", "chunked[q=128,kv=1024]"] and "sdpa_default" in portable[2:]
    assert Dispatcher(kernels="all").explain(**qkv()).kernel == "sdpa_default"


def test_kernel_variant_named_only_by_the_table_is_built(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["chunked[q=64,kv=256]", "no_such_kernel[x=1]", "math"]))
    ours = Dispatcher(kernels=[MathKernel()])
    inputs = qkv()
    decision = ours.explain(**inputs)
    assert decision.kernel == "chunked[q=64,kv=256]"
    assert "not a kernel of this version" in decision.reason_dropped("no_such_kernel[x=1]")
    assert_matches_reference(ours.attention(**inputs), inputs)


def test_broken_table_warns_and_the_prior_serves(monkeypatch):
    use_ranking(monkeypatch, BrokenRanker(), prior=FixedRanker(["math"]))
    ours = Dispatcher(kernels="portable")
    inputs = qkv()
    with pytest.warns(TableWarning, match="failed to rank"):
        out = ours.attention(**inputs)
    assert_matches_reference(out, inputs)
    decision = ours.explain(**inputs)
    assert decision.kernel == "math" and decision.source.level == "prior"


def test_broken_table_and_prior_still_answer(monkeypatch):
    inputs = qkv()
    for kernels, first in (("all", "sdpa_default"), ("portable", "math")):  # portable: its last resort stays last
        use_ranking(monkeypatch, BrokenRanker(), prior=BrokenRanker())
        ours = Dispatcher(kernels=kernels)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TableWarning)
            out = ours.attention(**inputs)
        assert_matches_reference(out, inputs)
        decision = ours.explain(**inputs)
        assert decision.kernel == first and "sdpa_default" in [c.name for c in decision.candidates]


def test_real_resolution_never_raises(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TableWarning)
        ranking = resolve_ranking(__import__("torch").device("cpu"), home=tmp_path)
    assert ranking.source.level in ("exact", "model", "family", "prior", "none")


def test_a_measured_entry_is_explained_in_words(tmp_path):
    from attn_dispatch.dispatcher.decision import RankingSource
    from attn_dispatch.dispatcher.device_ranking import DeviceRanking
    from attn_dispatch.kernels import Problem
    from attn_dispatch.models.measured import MeasuredEntry, MeasuredTime, entry_key

    problem = Problem(1, 4, 2, 8, 8, 64, 64, "float32")
    entry = MeasuredEntry(entry_key(problem), 1, 8, 8, (MeasuredTime("math", 1e-5, 0.9e-5, 1.1e-5, 20),
                                                         MeasuredTime("sdpa_default", 3e-5, 2.9e-5, 3.1e-5, 20)))

    class WithEntry:
        def measured_entry(self, asked):
            return entry if entry_key(asked) == entry.key else None

    source = RankingSource("exact", "test")
    ranking = DeviceRanking(table=WithEntry(), prior=None, source=source, prior_source=source)
    note = ranking.measured_note(problem)
    assert note.startswith("measured in this bucket (calibration") and "math 0.01 ms" in note
    assert ranking.measured_note(Problem(1, 4, 2, 800, 800, 64, 64, "float32")) is None
    assert DeviceRanking(table=None, prior=None, source=source, prior_source=source).measured_note(problem) is None


def test_an_entry_tied_to_the_default_does_not_decide_its_bucket():
    """An entry whose winner is PyTorch's default only because a faster kernel's spread overlaps
    it leaves the bucket to be measured on its calls (`measuring`); a clear winner, either way, decides."""
    from attn_dispatch.dispatcher.decision import RankingSource
    from attn_dispatch.dispatcher.device_ranking import DeviceRanking
    from attn_dispatch.kernels import Problem
    from attn_dispatch.models.measured import MeasuredEntry, MeasuredTime, entry_key

    problem = Problem(1, 4, 2, 8, 8, 64, 64, "float32")

    def ranking_with(*times):
        entry = MeasuredEntry(entry_key(problem), 1, 8, 8, times)

        class WithEntry:
            def measured_entry(self, asked):
                return entry if entry_key(asked) == entry.key else None

        source = RankingSource("exact", "test")
        return DeviceRanking(table=WithEntry(), prior=None, source=source, prior_source=source), entry

    tied, entry = ranking_with(MeasuredTime("math", 2.4e-5, 2.2e-5, 4.5e-5, 20),
                               MeasuredTime("sdpa_default", 3.0e-5, 2.9e-5, 3.1e-5, 20))
    assert entry.winner == "sdpa_default" and entry.default_by_tie
    assert entry.faster_than_default() == ("math",)
    assert not tied.entry_decides(problem)
    faster, _ = ranking_with(MeasuredTime("sdpa_flash", 2.0e-5, 1.9e-5, 2.1e-5, 20),
                             MeasuredTime("sdpa_default", 3.0e-5, 2.9e-5, 3.1e-5, 20))
    default_faster, _ = ranking_with(MeasuredTime("sdpa_flash", 4.0e-5, 3.9e-5, 4.1e-5, 20),
                                     MeasuredTime("sdpa_default", 3.0e-5, 2.9e-5, 3.1e-5, 20))
    assert faster.entry_decides(problem) and default_faster.entry_decides(problem)
    assert not faster.entry_decides(Problem(1, 4, 2, 800, 800, 64, 64, "float32"))  # no entry there
    source = RankingSource("exact", "test")
    assert not DeviceRanking(table=None, prior=None, source=source, prior_source=source).entry_decides(problem)


class _RankerWithEntry(FixedRanker):
    """A table holding one measured entry for every problem it is asked about."""

    def __init__(self, order, times):
        super().__init__(order)
        self.times = times

    def measured_entry(self, problem):
        from attn_dispatch.models.measured import MeasuredEntry, entry_key

        return MeasuredEntry(entry_key(problem), problem.batch, problem.q_len, problem.kv_len, self.times)


def test_an_entry_of_ours_measured_at_an_aligned_key_count_does_not_decide_an_unaligned_call():
    """On a GPU, a portable kernel's measured win at 8,192 keys does not carry to 4,731 keys (rows
    not a multiple of `KEY_COUNT_MULTIPLE`: 2.45x PyTorch's default on the H200, session 15): the
    bucket measures its candidates on its calls, and `explain` says why. PyTorch's backends, and CPUs, keep the
    entry's word."""
    from attn_dispatch.dispatcher.device_ranking import DeviceRanking, entry_decides_bucket
    from attn_dispatch.models.measured import MeasuredEntry, MeasuredTime, entry_key
    from tests.dispatcher.helpers import PRIOR_SOURCE, TEST_SOURCE

    def entry(winner, problem):
        times = (MeasuredTime(winner, 1.3e-4, 1.24e-4, 1.36e-4, 5), MeasuredTime("sdpa_default", 1.9e-4, 1.88e-4, 1.93e-4, 5))
        return MeasuredEntry(entry_key(problem), problem.batch, problem.q_len, 8192, times)

    def call(kv_len, device_type="cuda"):
        return Problem(4, 32, 8, 2, kv_len, 256, 256, "bfloat16", device_type=device_type)

    ours = entry("small_q[splits=1]", call(8192))
    assert not entry_decides_bucket(ours, call(4731))
    assert entry_decides_bucket(ours, call(4736)) and entry_decides_bucket(ours, call(8192))
    assert entry_decides_bucket(entry("small_q[splits=1]", call(8192, "cpu")), call(4731, "cpu"))
    assert entry_decides_bucket(entry("sdpa_flash", call(8192)), call(4731))
    from attn_dispatch.dispatcher.selection import decision_bucket

    assert decision_bucket(call(4731)) != decision_bucket(call(4736))  # decided apart: the first seen never decides both
    assert decision_bucket(call(4731, "cpu")) == decision_bucket(call(4736, "cpu"))
    ranking = DeviceRanking(table=_RankerWithEntry(["small_q[splits=1]", "sdpa_default"], ours.times),
                            prior=None, source=TEST_SOURCE, prior_source=PRIOR_SOURCE)
    ranking.table.measured_entry = lambda problem: ours
    assert not ranking.entry_decides(call(4731)) and ranking.entry_decides(call(4736))
    assert "this call has 4731, not a multiple" in ranking.entry_doubt(call(4731))
    assert ranking.entry_doubt(call(4736)) is None
