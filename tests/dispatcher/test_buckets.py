"""Decisions per size bucket: a new exact shape in a decided bucket is planned from the bucket's
decision (no ranking, no tuning), the caches stay bounded, `plan()` runs with no lookup, and a
kernel with a per-shape set-up gives way where the bucket's shapes keep changing."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
import torch

from attn_dispatch.dispatcher import Dispatcher, core
from attn_dispatch.dispatcher import plans as buckets
from attn_dispatch.dispatcher.plans import BoundedCache, cache_key
from attn_dispatch.dispatcher.selection import failure_bucket
from attn_dispatch.kernels import MathKernel, Problem
from tests.dispatcher.helpers import FixedRanker, assert_matches_reference, qkv, use_ranking


def _decode(kv_len: int, **kwargs) -> dict:
    return qkv(q_len=1, kv_len=kv_len, **kwargs)


def test_a_new_length_in_a_decided_bucket_is_not_ranked_again(monkeypatch):
    ranker = FixedRanker(["chunked[q=128,kv=1024]", "math"])
    use_ranking(monkeypatch, ranker)
    ours = Dispatcher(kernels=["math", "chunked[q=128,kv=1024]"])
    for kv_len in range(65, 129):  # one bucket: 65..128 keys round up to 128
        inputs = _decode(kv_len)
        assert_matches_reference(ours.attention(**inputs), inputs)
    assert ranker.calls == 1
    assert ours.stats() == {"chunked[q=128,kv=1024]": 64}
    ours.attention(**_decode(129))  # the next bucket is decided anew
    assert ranker.calls == 2


@pytest.mark.measuring
def test_a_decode_loop_measures_each_bucket_once(monkeypatch):
    """A decode loop's key length grows by one per step: every new length is a new exact shape of
    the same bucket, measured by one trial (its calls, whatever their lengths, run its candidates)."""
    use_ranking(monkeypatch, FixedRanker(["math", "chunked[q=128,kv=1024]"]))
    from attn_dispatch.dispatcher import device_planner as planner

    trials = []

    class CountedTrial(planner.Trial):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            trials.append(self)

    monkeypatch.setattr(planner, "Trial", CountedTrial)
    ours = Dispatcher(kernels=["math", "chunked[q=128,kv=1024]"], remember_tunings=False)
    for kv_len in range(100, 128, 3):
        inputs = _decode(kv_len)
        assert_matches_reference(ours.attention(**inputs), inputs)
    assert len(trials) == 1
    assert sum(c.calls for c in trials[0].contenders) > 1  # calls of several key lengths measured by the one trial


def test_an_exact_shape_the_buckets_kernel_cannot_run_is_decided_alone(monkeypatch):
    """small_q runs at most 64 query rows... but here the bucket's first problem decides with a
    kernel, and a later shape of the bucket that the kernel does not support gets its own decision."""
    use_ranking(monkeypatch, FixedRanker(["small_q[splits=8]", "math"]))
    ours = Dispatcher(kernels=["math", "small_q[splits=8]"])
    small = qkv(q_len=33, kv_len=256)
    ours.attention(**small)
    assert ours.explain(**small).kernel == "small_q[splits=8]"
    mask_first = qkv(q_len=40, kv_len=256)
    decision = ours.explain(**mask_first)
    assert decision.kernel in {"small_q[splits=8]", "math"}
    assert_matches_reference(ours.attention(**mask_first), mask_first)


class EmptyKernel(MathKernel):
    """Returns the output's shape without computing it: the dispatcher's own cost alone."""

    family = "empty"

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem):
        return query.new_empty(*query.shape[:-1], value.shape[-1])


def test_ten_thousand_key_lengths_keep_the_caches_bounded_and_memory_flat(monkeypatch):
    monkeypatch.setattr(core, "MAX_PLANS", 256)
    use_ranking(monkeypatch, FixedRanker(["empty"]))
    ours = Dispatcher(kernels=[EmptyKernel()])
    query = torch.randn(1, 1, 1, 8)
    keys = torch.randn(1, 1, 10_001, 8)

    def run(lengths):
        for kv_len in lengths:
            key = keys[:, :, :kv_len]
            ours.attention(query, key, key)

    run(range(1, 6001))
    gc.collect()
    tracemalloc.start()  # counts what is allocated from here on and still held
    run(range(6001, 8001))
    gc.collect()
    after_8000, _ = tracemalloc.get_traced_memory()
    run(range(8001, 10_001))
    gc.collect()
    after_10000, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(ours._plans) <= ours._plans.limit == 256
    assert len(ours._cold.families) <= 4096 and len(ours._cold.planner(torch.device("cpu")).buckets) <= buckets.MAX_BUCKETS
    assert sum(ours.stats().values()) == 10_000  # evicted plans' calls are still counted
    assert after_10000 - after_8000 < 64 * 1024, (after_8000, after_10000)


def test_bounded_cache_evicts_oldest_first():
    evicted = []
    cache = BoundedCache(2, on_evict=lambda key, value: evicted.append((key, value)))
    for key in "abc":
        cache.put(key, key.upper())
    assert list(cache) == ["b", "c"] and evicted == [("a", "A")]
    cache.put("b", "B2")  # replacing does not evict
    assert len(cache) == 2 and cache.get("b") == "B2"
    with pytest.raises(ValueError, match="limit"):
        BoundedCache(0)


def test_plan_runs_the_chosen_kernel_and_refuses_another_shape(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["chunked[q=128,kv=1024]", "math"]))
    ours = Dispatcher(kernels=["math", "chunked[q=128,kv=1024]"])
    inputs = qkv(q_len=5, kv_len=40)
    prepared = ours.plan(inputs["query"], inputs["key"], inputs["value"], is_causal=True, enable_gqa=True)
    assert prepared.kernel == "chunked[q=128,kv=1024]"
    out = prepared(inputs["query"], inputs["key"], inputs["value"])
    assert_matches_reference(out, {**inputs, "is_causal": True})
    assert ours.stats() == {"chunked[q=128,kv=1024]": 1}
    other = qkv(q_len=5, kv_len=41)
    with pytest.raises(ValueError, match=r"key shape .*40.* planned, .*41.* given"):
        prepared(other["query"], other["key"], other["value"])


def test_plan_hands_a_gradient_call_to_the_training_route(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math"]))
    ours = Dispatcher(kernels=["math"])
    inputs = qkv()
    prepared = ours.plan(inputs["query"], inputs["key"], inputs["value"], enable_gqa=True)
    query = inputs["query"].clone().requires_grad_()
    prepared(query, inputs["key"], inputs["value"]).sum().backward()
    assert query.grad is not None and ours.stats() == {"pytorch_sdpa (training)": 1}


class SetUpKernel(MathKernel):
    """The math kernel under another name: stands in for a kernel with a per-shape set-up."""

    family = "setup_math"


def _key(call: dict) -> tuple:
    return cache_key(call["query"], call["key"], call["value"], None, False, call.get("enable_gqa", False))


def _cold_dispatcher(monkeypatch, cold_s: float) -> Dispatcher:
    use_ranking(monkeypatch, FixedRanker(["setup_math", "math"]))  # 1 us and 2 us predicted
    ours = Dispatcher(kernels=[SetUpKernel(), MathKernel()])
    ours._cold.planner(torch.device("cpu")).cold_costs["setup_math"] = {"decode": cold_s, "prefill": cold_s}
    return ours


def test_a_kernel_that_sets_up_per_shape_gives_way_where_shapes_keep_changing(monkeypatch):
    ours = _cold_dispatcher(monkeypatch, cold_s=1e-3)  # 1 ms per new shape, spread over 4 calls each
    first = _decode(100)
    for _ in range(4):  # four layers of one decode step
        ours.attention(**first)
    assert ours.explain(**first).kernel == "setup_math"
    second = _decode(101)
    decision = ours.explain(**second)
    assert decision.kernel == "math"
    assert any("sets up per exact shape" in note for note in decision.notes)
    assert_matches_reference(ours.attention(**second), second)


def test_a_shape_called_often_enough_settles_on_the_kernel_that_sets_up(monkeypatch):
    """Ski rental: math loses 1 us per call against setup_math's 1 ms set-up, so the 1000th call
    of one exact shape moves it to setup_math (a repeated decode loop ends on PyTorch's warm choice)."""
    ours = _cold_dispatcher(monkeypatch, cold_s=1e-3)
    for _ in range(4):
        ours.attention(**_decode(100))
    second = _decode(101)
    decision = ours.explain(**second)
    assert decision.kernel == "math" and any("1000 times settles on setup_math" in n for n in decision.notes)
    for _ in range(999):
        ours.attention(**second)
    assert ours.stats() == {"setup_math": 4, "math": 999}
    out = ours.attention(**second)
    assert ours.stats() == {"setup_math": 5, "math": 999}
    assert_matches_reference(out, second)
    settled = ours.explain(**second)
    assert settled.kernel == "setup_math" and any("called often enough" in n for n in settled.notes)


def test_calls_toward_settling_survive_the_plan_s_eviction(monkeypatch):
    """A server whose key lengths outnumber the plan cache: the 600 calls a shape made before its
    plan was evicted count, so its next plan settles after 400 more, not 1000."""
    ours = _cold_dispatcher(monkeypatch, cold_s=1e-3)
    ours._plans.limit = 2
    for _ in range(4):
        ours.attention(**_decode(100))
    second = _decode(101)
    for _ in range(600):
        ours.attention(**second)
    for kv_len in (102, 103):  # two more shapes push 101's plan out
        ours.attention(**_decode(kv_len))
    assert _key(second) not in ours._plans
    for _ in range(399):
        ours.attention(**second)
    assert ours.explain(**second).kernel == "math"
    ours.attention(**second)  # the 1000th call of this shape in all
    assert ours.explain(**second).kernel == "setup_math"


def test_a_repeating_shape_keeps_the_kernel_that_sets_up(monkeypatch):
    ours = _cold_dispatcher(monkeypatch, cold_s=1e-5)  # 10 us per new shape, spread over 200 calls
    first = _decode(100)
    for _ in range(200):
        ours.attention(**first)
    assert ours.explain(**_decode(101)).kernel == "setup_math"


def test_a_shape_the_kernel_already_set_up_is_not_charged_again(monkeypatch):
    ours = _cold_dispatcher(monkeypatch, cold_s=1.0)
    first = _decode(100)
    for _ in range(4):
        ours.attention(**first)
    ours._plans.clear()  # evicted: the exact shape comes back, the kernel's set-up for it is still there
    assert ours.explain(**first).kernel == "setup_math"


def test_bucket_of_a_problem_ignores_exact_lengths_within_powers_of_two():
    p = Problem(1, 4, 2, 1, 100, 16, 16, "float32")
    q = Problem(1, 4, 2, 1, 128, 16, 16, "float32")
    r = Problem(1, 4, 2, 1, 129, 16, 16, "float32")
    assert failure_bucket(p) == failure_bucket(q) != failure_bucket(r)


def test_a_floor_measured_for_one_variant_bounds_the_others_of_its_family():
    from attn_dispatch.dispatcher.selection import floor_seconds
    from attn_dispatch.kernels import kernel_from_name

    floors = {"small_q[splits=16]": {"decode": 1e-4, "prefill": 7e-4}, "small_q[splits=4]": {"decode": 2e-4},
              "math": {"prefill": 5e-5}, "sdpa_flash": {"decode": 3e-5, "prefill": 8e-5}}
    assert floor_seconds(kernel_from_name("small_q[splits=16]"), floors) == 1e-4  # the smallest over its probes
    assert floor_seconds(kernel_from_name("small_q[splits=1]"), floors) == 1e-4  # the family's smallest
    assert floor_seconds(kernel_from_name("convert[fp32->bf16]+math"), floors) == 5e-5  # its inner kernel's
    assert floor_seconds(kernel_from_name("chunked[q=64,kv=64]"), floors) is None


def test_pytorch_backends_have_no_floor():
    """A fused backend is one launch: a probe it is busy on measures its time there, not a floor
    (the H200's prefill probe took flash 79 us, where Lq 2-64 shapes take it 25-40 us)."""
    from attn_dispatch.dispatcher.selection import floor_seconds
    from attn_dispatch.kernels import kernel_from_name

    floors = {"sdpa_flash": {"decode": 3e-5, "prefill": 8e-5}, "sdpa_default": {"decode": 2e-5}}
    for name in ("sdpa_flash", "sdpa_default", "convert[fp32->bf16]+sdpa_flash"):
        assert floor_seconds(kernel_from_name(name), floors) is None


def test_a_new_shape_swaps_only_to_a_kernel_the_bucket_measured(monkeypatch):
    """Where the bucket's calls measured options (`measuring`; here a result kept from an earlier
    process), a new shape leaves the kernel that sets up per shape only for a measured one: chunked
    is predicted fastest, but only math was measured."""
    from attn_dispatch.dispatcher.selection import Tuned

    chunked = "chunked[q=128,kv=1024]"
    use_ranking(monkeypatch, FixedRanker(["setup_math", chunked, "math"]))
    ours = Dispatcher(kernels=[SetUpKernel(), "chunked[q=128,kv=1024]", MathKernel()])

    def start(measured):
        ours.reset()
        planner = ours._cold.planner(torch.device("cpu"))
        planner.cold_costs["setup_math"] = {"decode": 1e-3, "prefill": 1e-3}
        bucket = failure_bucket(Problem.from_tensors(**{k: v for k, v in _decode(100).items()}))
        if measured:
            planner.state.open_store(None, "")
            planner.state.tuned[bucket] = Tuned("setup_math", (("setup_math", 1e-6), ("math", 3e-6)))
        for _ in range(4):
            ours.attention(**_decode(100))

    start(measured=True)
    second = _decode(101)
    assert ours.explain(**second).kernel == "math"
    assert_matches_reference(ours.attention(**second), second)
    start(measured=False)  # nothing measured: the table's prediction decides, as before
    assert ours.explain(**second).kernel == chunked


def test_only_a_material_set_up_counts_as_one():
    """Flash's measured 2 us per new shape is the measurement's floor, not a set-up to avoid: it must
    stay among the options a bucket may measure as set-up-free (`selection.measured_candidates`)."""
    from types import SimpleNamespace

    from attn_dispatch.dispatcher.selection import costly_setups, first_call_setups
    from attn_dispatch.kernels import kernel_from_name

    options = [SimpleNamespace(kernel=kernel_from_name(name)) for name in ("sdpa_default", "sdpa_flash", "math")]
    decode = Problem(8, 32, 8, 1, 1024, 128, 128, "bfloat16", device_type="cuda")
    measured = {"sdpa_default": {"decode": 0.036}, "sdpa_flash": {"decode": 2e-6}}
    assert costly_setups(first_call_setups(options, decode, measured)) == {"sdpa_default"}
    flash_measured = {"sdpa_flash": {"decode": 0.002}}
    assert costly_setups(first_call_setups(options[1:], decode, flash_measured)) == {"sdpa_flash"}


class TiedRanker(FixedRanker):
    """setup_math first although math is predicted faster: the order a table's tie gives."""

    def rank(self, problem, kernels):
        self.calls += 1
        return [("setup_math", 2e-6), ("math", 1e-6)]


def test_a_swap_the_numbers_call_free_still_settles(monkeypatch):
    """The bucket ranks setup_math first although math is predicted faster (a table's tie, within
    its noise): the swap to math for a new shape is taken to lose `TIED_LOSS_SHARE` of setup_math's
    time per call, so the shape settles instead of running math for good."""
    from attn_dispatch.dispatcher.selection import TIED_LOSS_SHARE

    use_ranking(monkeypatch, TiedRanker(["setup_math", "math"]))
    ours = Dispatcher(kernels=[SetUpKernel(), MathKernel()])
    ours._cold.planner(torch.device("cpu")).cold_costs["setup_math"] = {"decode": 1e-3, "prefill": 1e-3}
    for _ in range(4):
        ours.attention(**_decode(100))
    second = _decode(101)
    settle = round(1e-3 / (TIED_LOSS_SHARE * 2e-6))
    decision = ours.explain(**second)
    assert decision.kernel == "math" and any(f"{settle} times settles on setup_math" in n for n in decision.notes)
    for _ in range(settle - 1):
        ours.attention(**second)
    assert ours.explain(**second).kernel == "math"
    ours.attention(**second)
    assert ours.explain(**second).kernel == "setup_math"


def test_settle_after_weighs_at_least_the_tied_share_and_nothing_unpriced():
    from attn_dispatch.dispatcher.selection import TIED_LOSS_SHARE, settle_after

    assert settle_after(1e-3, 1e-6, 2e-6) == 1000  # a real loss over the share: the set-up over it
    share = TIED_LOSS_SHARE * 1e-6
    assert settle_after(1e-3, 1e-6, 1e-6 + share / 5) == round(1e-3 / share)  # a smaller gap: the share
    assert settle_after(1e-3, 1e-6, 0.5e-6) == round(1e-3 / share)  # predicted faster: the share too
    assert settle_after(1e-3, 0.0, 0.0) == 0  # no time, no loss to weigh (was a ZeroDivisionError)
    assert settle_after(1e-3, float("inf"), 1e-6) == 0  # unpriced
    assert settle_after(0.0, 1e-6, 2e-6) == 0 and settle_after(1e-3, None, 2e-6) == 0
