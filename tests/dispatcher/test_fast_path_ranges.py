"""The fast path's range entries and operator entries (`hot_path`, `fast_call.cpp`): a decode
loop's next key lengths are served in C++ from their first call, and a plan that runs a fused
backend's operator bare is served in C++ with the Python path's exact result; whatever the plan's
bucket would plan differently goes to Python."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attn_dispatch.dispatcher import Dispatcher, fast_path
from attn_dispatch.dispatcher.hot_path import bucket_key_lengths, served_key_lengths
from attn_dispatch.models.probe_store import kind_of
from tests.dispatcher.test_fast_path import (  # noqa: F401 - `built`: a fixture
    SDPA,
    WARM_CALLS,
    built,
    served,
    warm,
)

CACHE = 80  # positions of the preallocated cache the decode tests slice
FIRST = 40  # the key length a test's plan goes hot at: its bucket holds 33..64


def _decode_inputs(q_len=1, heads=4, kv_heads=2, dim=16, seed=0):
    """A query ``[1, heads, q_len, dim]`` and a K/V cache ``[1, kv_heads, CACHE, dim]`` each."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, heads, q_len, dim, generator=generator)
    cache_k = torch.randn(1, kv_heads, CACHE, dim, generator=generator)
    cache_v = torch.randn(1, kv_heads, CACHE, dim, generator=generator)
    return query, cache_k, cache_v


def _only_plan(ours: Dispatcher):
    (plan,) = ours._plans.table.values()
    return plan


def test_bucket_key_lengths_are_the_powers_of_two_that_bound_a_length():
    assert bucket_key_lengths(40) == (33, 64)
    assert bucket_key_lengths(64) == (33, 64)
    assert bucket_key_lengths(65) == (65, 128)
    assert bucket_key_lengths(2) == (2, 2)
    assert bucket_key_lengths(1) == (1, 1)


@pytest.mark.parametrize("layout", ["cache slices", "contiguous"])
def test_a_decode_loop_s_next_key_lengths_are_served_in_cpp_from_their_first_call(layout):
    ours = Dispatcher(kernels=["sdpa_default"])
    query, cache_k, cache_v = _decode_inputs()

    def kv(length):
        key, value = cache_k[:, :, :length], cache_v[:, :, :length]
        return (key, value) if layout == "cache slices" else (key.contiguous(), value.contiguous())

    fast = warm(ours, query, *kv(FIRST), enable_gqa=True)
    plans = len(ours._plans)
    for length in range(33, 65):
        key, value = kv(length)
        out = []
        assert served(ours, lambda k=key, v=value, out=out: out.append(fast(query, k, v, enable_gqa=True))), length
        assert torch.equal(out[0], SDPA(query, key, value, enable_gqa=True))
    assert len(ours._plans) == plans  # no plan made per length
    assert ours.stats() == {"sdpa_default": WARM_CALLS + 32}
    for length in (32, 65):  # the neighbouring buckets: Python
        assert not served(ours, lambda n=length: fast(query, *kv(n), enable_gqa=True))
    other = kv(50)
    other = (other[0].contiguous(), other[1].contiguous()) if layout == "cache slices" else (
        cache_k[:, :, :50], cache_v[:, :, :50])
    assert not served(ours, lambda: fast(query, *other, enable_gqa=True))  # another layout: its own plan


def test_a_mask_that_follows_the_key_length_is_served_over_the_range():
    ours = Dispatcher(kernels=["sdpa_default"])
    query, cache_k, cache_v = _decode_inputs(q_len=3)
    keep = torch.rand(1, 1, 3, CACHE, generator=torch.Generator().manual_seed(1)) > 0.2
    keep[..., 0] = True
    fast = warm(ours, query, cache_k[:, :, :FIRST], cache_v[:, :, :FIRST], keep[..., :FIRST], enable_gqa=True)
    for length in (33, 47, 64):
        key, value, mask = cache_k[:, :, :length], cache_v[:, :, :length], keep[..., :length]
        out = []
        assert served(ours, lambda k=key, v=value, m=mask, out=out: out.append(fast(query, k, v, m, enable_gqa=True)))
        assert torch.equal(out[0], SDPA(query, key, value, mask, enable_gqa=True))
    two_rows = keep[:, :, :2, :50]  # a mask of another shape: its own plan
    assert not served(ours, lambda: fast(query[:, :, :2], cache_k[:, :, :50], cache_v[:, :, :50], two_rows,
                                         enable_gqa=True))


def test_key_and_value_of_different_lengths_go_to_python():
    ours = Dispatcher(kernels=["sdpa_default"])
    query, cache_k, cache_v = _decode_inputs()
    fast = warm(ours, query, cache_k[:, :, :FIRST], cache_v[:, :, :FIRST], enable_gqa=True)
    key, value = cache_k[:, :, :45], cache_v[:, :, :46]
    with pytest.raises(RuntimeError) as python_path:
        Dispatcher(kernels=["sdpa_default"]).attention(query, key, value, enable_gqa=True)
    with pytest.raises(RuntimeError) as fast_path_error:
        fast(query, key, value, enable_gqa=True)
    assert str(fast_path_error.value) == str(python_path.value)


def test_no_range_where_a_new_shape_of_the_bucket_would_be_planned_otherwise():
    ours = Dispatcher(kernels=["sdpa_default", "math"])
    query, cache_k, cache_v = _decode_inputs()
    ours.attention(query, cache_k[:, :, :FIRST], cache_v[:, :, :FIRST], enable_gqa=True)
    plan = _only_plan(ours)
    planner = ours._cold.planners[plan.device]
    assert served_key_lengths(planner, plan) == (33, 64)
    plan.settle_at = 5  # settling ahead: its shape alone
    assert served_key_lengths(planner, plan) is None
    plan.settle_at = 0
    plan.recheck = True  # a memory re-check asked
    assert served_key_lengths(planner, plan) is None
    plan.recheck = False
    # PyTorch's default setting up per shape, and math free to run new shapes instead (nothing timed)
    planner.cold_costs["sdpa_default"] = {kind_of(1): 1e-2}
    plan.bucket._cold = None
    assert not plan.bucket.new_shapes_run_first(planner.cold_costs)
    assert served_key_lengths(planner, plan) is None


@pytest.mark.parametrize(("kernel", "expected"), [("math", None), ("sdpa_default", (33, 64))])
def test_on_a_gpu_a_plan_of_our_kernels_serves_no_range(monkeypatch, kernel, expected):
    """A GPU decides a bucket's lengths apart by key-count alignment (`selection.decision_bucket`),
    and consecutive lengths cross it: a plan of our own kernel stands for its own alignment only.
    Here the CPU plan is given the GPU's answer to "is the key count aligned?"."""
    from attn_dispatch.dispatcher import hot_path
    from attn_dispatch.kernels._blocks import key_count_aligned

    ours = Dispatcher(kernels=[kernel])
    query, cache_k, cache_v = _decode_inputs()
    ours.attention(query, cache_k[:, :, :FIRST], cache_v[:, :, :FIRST], enable_gqa=True)
    plan = _only_plan(ours)
    planner = ours._cold.planners[plan.device]
    assert served_key_lengths(planner, plan) == (33, 64)  # on the CPU: one decision for every length
    monkeypatch.setattr(hot_path, "keys_aligned", lambda problem: key_count_aligned(problem.kv_len))
    assert served_key_lengths(planner, plan) == expected


@pytest.mark.parametrize(("q_len", "kv_len", "expected"),
                         [(4, 40, (33, 64)), (40, 48, (41, 64)), (40, 36, (33, 39)), (40, 40, None)])
def test_a_causal_range_stays_on_one_side_of_the_query_length(q_len, kv_len, expected):
    ours = Dispatcher(kernels=["sdpa_default"])
    query, cache_k, cache_v = _decode_inputs(q_len=q_len)
    ours.attention(query, cache_k[:, :, :kv_len], cache_v[:, :, :kv_len], is_causal=True, enable_gqa=True)
    plan = _only_plan(ours)
    assert served_key_lengths(ours._cold.planners[plan.device], plan) == expected


def test_a_failure_at_one_length_takes_the_bucket_s_range_off_the_fast_path(monkeypatch):
    from attn_dispatch.dispatcher import core

    failing = 50

    def out_of_memory_at(failing_length, real):
        def call(*args, **kwargs):
            if args[1].shape[-2] == failing_length:
                raise torch.OutOfMemoryError("out of memory (injected)")
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(fast_path, "pytorch_sdpa", out_of_memory_at(failing, SDPA))
    monkeypatch.setattr(core, "_sdpa", out_of_memory_at(failing, core._sdpa))
    ours = Dispatcher(kernels=["sdpa_default", "math"])
    query, cache_k, cache_v = _decode_inputs()
    fast = warm(ours, query, cache_k[:, :, :FIRST], cache_v[:, :, :FIRST], enable_gqa=True)
    assert served(ours, lambda: fast(query, cache_k[:, :, :45], cache_v[:, :, :45], enable_gqa=True))
    key, value = cache_k[:, :, :failing], cache_v[:, :, :failing]
    torch.testing.assert_close(fast(query, key, value, enable_gqa=True), SDPA(query, key, value, enable_gqa=True))
    assert not served(ours, lambda: fast(query, cache_k[:, :, :45], cache_v[:, :, :45], enable_gqa=True))


# ------------------------------------------------------------------ operator entries (CPU flash)
@pytest.mark.parametrize(("heads", "kv_heads", "q_len", "causal"), [(4, 4, 5, True), (8, 2, 1, False),
                                                                     (8, 2, 3, False)])
def test_a_bare_operator_plan_is_served_in_cpp_with_the_python_path_s_exact_result(heads, kv_heads, q_len, causal):
    ours = Dispatcher(kernels=["sdpa_flash"])
    query, cache_k, cache_v = _decode_inputs(q_len=q_len, heads=heads, kv_heads=kv_heads)
    key, value = cache_k[:, :, :FIRST].contiguous(), cache_v[:, :, :FIRST].contiguous()
    gqa = heads != kv_heads
    fast = warm(ours, query, key, value, is_causal=causal, scale=0.3, enable_gqa=gqa)
    plan = _only_plan(ours)
    assert plan.kernel.bare_call(plan.problem) is not None and plan.sdpa_flags is None
    out = []
    assert served(ours, lambda: out.append(fast(query, key, value, is_causal=causal, scale=0.3, enable_gqa=gqa)))
    expected = plan.run(query, key, value, None, 0.3, gqa, plan.problem)
    assert torch.equal(out[0], expected)
    assert ours.stats() == {"sdpa_flash": WARM_CALLS + 1}


def test_an_operator_entry_leaves_an_int_scale_and_restricted_backends_to_python():
    ours = Dispatcher(kernels=["sdpa_flash"])
    query, cache_k, cache_v = _decode_inputs()
    key, value = cache_k[:, :, :FIRST], cache_v[:, :, :FIRST]
    fast = warm(ours, query, key, value, enable_gqa=True)
    assert served(ours, lambda: fast(query, key, value, enable_gqa=True))
    out = []
    assert not served(ours, lambda: out.append(fast(query, key, value, scale=1, enable_gqa=True)))
    torch.testing.assert_close(out[0], SDPA(query, key, value, scale=1.0, enable_gqa=True))
    with sdpa_kernel(SDPBackend.MATH):
        assert not served(ours, lambda: fast(query, key, value, enable_gqa=True))


def test_an_operator_entry_serves_the_range_of_a_decode_loop():
    ours = Dispatcher(kernels=["sdpa_flash"])
    query, cache_k, cache_v = _decode_inputs()
    fast = warm(ours, query, cache_k[:, :, :FIRST], cache_v[:, :, :FIRST], enable_gqa=True)
    for length in (33, 51, 64):
        key, value = cache_k[:, :, :length], cache_v[:, :, :length]
        out = []
        assert served(ours, lambda k=key, v=value, out=out: out.append(fast(query, k, v, enable_gqa=True)))
        torch.testing.assert_close(out[0], SDPA(query, key, value, enable_gqa=True))
    assert len(ours._plans) == 1


def test_a_range_computed_before_a_failure_in_its_bucket_is_not_installed(monkeypatch):
    """`_make_hot` computes a range outside the dispatcher's lock: where another thread's call fails
    in the bucket meanwhile (forced here from inside `served_key_lengths`), no stale range goes on the
    fast path: the failure took the bucket's plans (this one too), and `attention` plans its lengths
    anew without the failed kernel."""
    from attn_dispatch.dispatcher import core, hot_path

    failing = 50

    def out_of_memory_at(real):
        def call(*args, **kwargs):
            if args[1].shape[-2] == failing:
                raise torch.OutOfMemoryError("out of memory (injected)")
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(fast_path, "pytorch_sdpa", out_of_memory_at(SDPA))
    monkeypatch.setattr(core, "_sdpa", out_of_memory_at(core._sdpa))
    ours = Dispatcher(kernels=["sdpa_default", "math"])
    query, cache_k, cache_v = _decode_inputs()
    real = hot_path.served_key_lengths

    def failure_meanwhile(planner, plan):
        lengths = real(planner, plan)
        monkeypatch.setattr(hot_path, "served_key_lengths", real)  # once
        ours.attention(query, cache_k[:, :, :failing], cache_v[:, :, :failing], enable_gqa=True)
        return lengths

    monkeypatch.setattr(hot_path, "served_key_lengths", failure_meanwhile)
    key, value = cache_k[:, :, :FIRST], cache_v[:, :, :FIRST]
    fast = warm(ours, query, key, value, enable_gqa=True)
    out = []
    assert not served(ours, lambda: out.append(fast(query, key, value, enable_gqa=True)))  # planned anew
    torch.testing.assert_close(out[0], SDPA(query, key, value, enable_gqa=True))
    key, value = cache_k[:, :, :45], cache_v[:, :, :45]
    out = []
    assert not served(ours, lambda: out.append(fast(query, key, value, enable_gqa=True)))
    torch.testing.assert_close(out[0], SDPA(query, key, value, enable_gqa=True))


def test_a_failure_replans_every_shape_of_the_bucket_on_the_python_path_too(monkeypatch):
    """A range entry serves lengths with no plan of their own; the Python path had one per length.
    After a failure the bucket decides again for both: its cached plans leave with it."""
    from attn_dispatch.dispatcher import core

    real = core._sdpa

    def out_of_memory_at_50(*args, **kwargs):
        if args[1].shape[-2] == 50:
            raise torch.OutOfMemoryError("out of memory (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "_sdpa", out_of_memory_at_50)
    ours = Dispatcher(kernels=["sdpa_default", "math"])
    query, cache_k, cache_v = _decode_inputs()
    for length in (40, 45):
        ours.attention(query, cache_k[:, :, :length], cache_v[:, :, :length], enable_gqa=True)
    failed_bucket = _only_plan_of(ours, 40).bucket
    ours.attention(query, cache_k[:, :, :50], cache_v[:, :, :50], enable_gqa=True)  # fails, recovers on math
    assert all(plan.bucket is not failed_bucket for plan in ours._plans.table.values())
    ours.attention(query, cache_k[:, :, :40], cache_v[:, :, :40], enable_gqa=True)
    assert ours.stats() == {"sdpa_default": 2, "math": 2}


def _only_plan_of(ours: Dispatcher, kv_len: int):
    (plan,) = (p for p in ours._plans.table.values() if p.problem.kv_len == kv_len)
    return plan
