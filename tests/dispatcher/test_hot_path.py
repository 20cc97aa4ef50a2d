"""The hot path (`dispatcher.hot_path`): a plan called again is matched by a guard on its tensors;
the guard refuses any call the plan's key would not cover, a refused call takes the dict path, and
everything that changes the plan cache takes plans off the hot path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attn_dispatch.dispatcher import Dispatcher, core, hot_path
from attn_dispatch.dispatcher.hot_path import HOT_AFTER, HOT_SLOTS, rehot, tensor_guard
from attn_dispatch.kernels.sdpa_backends import TORCH_HAS_ENABLE_GQA
from tests.dispatcher.helpers import FixedRanker, use_ranking


def _inputs(q_len=5, kv_len=7, heads=2, kv_heads=2, dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, h, n, dim, generator=generator)
                 for h, n in ((heads, q_len), (kv_heads, kv_len), (kv_heads, kv_len)))


def _hot_dispatcher(kernels=("math",), calls=HOT_AFTER + 1, **arguments):
    inputs = _inputs()
    ours = Dispatcher(kernels=list(kernels))
    with torch.no_grad():
        for _ in range(calls):
            ours.attention(*inputs, **arguments)
    return ours, inputs


def test_a_shape_called_again_goes_hot_and_gives_pytorchs_result():
    ours, (q, k, v) = _hot_dispatcher(calls=HOT_AFTER - 1)
    assert ours._hot_path.slots == ()
    with torch.no_grad():
        outs = [ours.attention(q, k, v) for _ in range(4)]
    (entry,) = ours._hot_path.slots
    assert entry.plan is next(iter(ours._plans.values()))
    for out in outs:
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert ours.stats() == {"math": HOT_AFTER - 1 + 4}


def test_fresh_tensors_of_the_same_kind_pass_the_guard():
    q, k, v = _inputs()
    check = tensor_guard((q, k, v))
    assert check is not None and check(q, k, v)
    assert check(*_inputs(seed=1))


@pytest.mark.parametrize("change", ["shape", "dtype", "strides", "requires_grad", "subclass", "meta"])
def test_the_guard_refuses_a_tensor_of_another_kind(change):
    q, k, v = _inputs()
    check = tensor_guard((q, k, v))
    other = {
        "shape": lambda t: torch.randn(2, 2, 9, 8),
        "dtype": lambda t: t.double(),
        "strides": lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),  # same shape, another layout
        "requires_grad": lambda t: t.clone().requires_grad_(),
        "subclass": lambda t: t.as_subclass(torch.nn.Parameter),
        "meta": lambda t: t.to("meta"),
    }[change](v)
    assert other.shape == v.shape or change == "shape"
    assert not check(q, k, other)


def test_inference_mode_and_grad_mode_calls_each_get_their_route():
    ours, (q, k, v) = _hot_dispatcher()
    with torch.inference_mode():
        torch.testing.assert_close(ours.attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    q_grad = q.clone().requires_grad_()
    out = ours.attention(q_grad, k, v)  # grad enabled: the training route, not the hot inference plan
    assert out.requires_grad
    out.sum().backward()
    assert q_grad.grad is not None


def test_plans_of_tensors_requiring_grad_under_no_grad_never_go_hot():
    q, k, v = (t.requires_grad_() for t in _inputs())
    ours = Dispatcher(kernels=["math"])
    with torch.no_grad():
        for _ in range(HOT_AFTER + 2):
            ours.attention(q, k, v)
    assert ours._hot_path.slots == ()


@pytest.mark.parametrize("arguments", [{"is_causal": True}, {"enable_gqa": True}, {"mask": True}, {"dropout": True}])
def test_a_call_with_other_arguments_takes_its_own_plan(arguments):
    ours, (q, k, v) = _hot_dispatcher()
    call = {}
    if arguments.get("is_causal"):
        call["is_causal"] = True
    if arguments.get("enable_gqa"):
        call["enable_gqa"] = True
    if arguments.get("mask"):
        call["attn_mask"] = torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    if arguments.get("dropout"):
        call["dropout_p"] = 0.5
        torch.manual_seed(0)
        out = ours.attention(q, k, v, **call)
        torch.manual_seed(0)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, **call))
        return
    with torch.no_grad():
        out = ours.attention(q, k, v, **call)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, **call))
    assert len(ours._plans) == 2, "the call was served by the hot plan of other arguments"


def test_two_alternating_shapes_both_stay_hot():
    assert HOT_SLOTS >= 2
    a, b = _inputs(kv_len=7), _inputs(kv_len=11)
    ours = Dispatcher(kernels=["math"])
    with torch.no_grad():
        for _ in range(HOT_AFTER + 1):
            ours.attention(*a)
            ours.attention(*b)
    assert {entry.plan.problem.kv_len for entry in ours._hot_path.slots} == {7, 11}


def test_sdpa_kernel_restrictions_reach_pytorch_from_a_hot_plan():
    ours, (q, k, v) = _hot_dispatcher()
    before = ours.stats()
    mask = torch.ones(5, 7, dtype=torch.bool)
    with sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
        out = ours.attention(q, k, v)
        with pytest.raises(RuntimeError, match="is_causal"):
            ours.attention(q, k, v, attn_mask=mask, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert ours.stats() == before, "a restricted call ran our kernel"


def test_reset_and_eviction_take_plans_off_the_hot_path(monkeypatch):
    ours, inputs = _hot_dispatcher()
    assert ours._hot_path.slots
    ours.reset()
    assert ours._hot_path.slots == ()
    monkeypatch.setattr(core, "MAX_PLANS", 2)
    small = Dispatcher(kernels=["math"])
    with torch.no_grad():
        for kv_len in (7, 7, 7, 9, 11):  # the 7-key plan goes hot, then is evicted
            small.attention(*_inputs(kv_len=kv_len))
    assert all(entry.plan.problem.kv_len != 7 for entry in small._hot_path.slots)
    assert small.stats() == {"math": 5}


def test_a_failure_on_the_hot_path_falls_back_and_leaves_it(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["sdpa_default", "math"]))
    ours, (q, k, v) = _hot_dispatcher(kernels=["sdpa_default", "math"])
    assert ours._hot_path.slots and ours._hot_path.slots[0].plan.kernel.name == "sdpa_default"

    def failing(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(core, "_sdpa", failing)
    with torch.no_grad():
        torch.testing.assert_close(ours.attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    assert ours._hot_path.slots == ()
    assert ours.stats() == {"sdpa_default": HOT_AFTER + 1, "math": 1}


def test_without_tensor_guards_the_dict_path_serves_every_call(monkeypatch):
    monkeypatch.setattr(hot_path, "tensor_guard", lambda tensors: None)
    ours, (q, k, v) = _hot_dispatcher(calls=HOT_AFTER + 3)
    assert ours._hot_path.slots == ()
    assert ours.stats() == {"math": HOT_AFTER + 3}
    with torch.no_grad():
        torch.testing.assert_close(ours.attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("value", ["0", "off"])
def test_the_environment_turns_the_hot_path_off(monkeypatch, value):
    monkeypatch.setenv("ATTN_DISPATCH_HOT_PATH", value)
    ours, (q, k, v) = _hot_dispatcher(calls=HOT_AFTER + 2)
    assert ours._hot_path.slots == ()
    assert ours.stats() == {"math": HOT_AFTER + 2}
    monkeypatch.setenv("ATTN_DISPATCH_HOT_PATH", "1")
    assert _hot_dispatcher()[0]._hot_path.slots


def test_an_evicted_plan_leaves_the_hot_path_and_the_others_stay(monkeypatch):
    monkeypatch.setattr(core, "MAX_PLANS", 3)
    ours = Dispatcher(kernels=["math"])
    with torch.no_grad():
        for kv_len in (7, 7, 9, 9):  # both hot
            ours.attention(*_inputs(kv_len=kv_len))
        for kv_len in (33, 65):  # the 7-key plan is evicted by the fourth plan (new buckets: not hot at once)
            ours.attention(*_inputs(kv_len=kv_len))
    assert [entry.plan.problem.kv_len for entry in ours._hot_path.slots] == [9]


def test_a_new_shape_of_a_bucket_whose_shapes_are_called_again_goes_hot_at_its_first_call():
    """A decode loop's next key length: the bucket's earlier shapes got two calls or more each."""
    ours = Dispatcher(kernels=["math"])
    with torch.no_grad():
        ours.attention(*_inputs(kv_len=9))  # a bucket's first shape, called once: not hot
        assert not ours._hot_path.slots
        ours.attention(*_inputs(kv_len=9))
        assert [entry.plan.problem.kv_len for entry in ours._hot_path.slots] == [9]
        ours.attention(*_inputs(kv_len=10))  # its history says shapes are called again: hot at once
        assert [entry.plan.problem.kv_len for entry in ours._hot_path.slots] == [10, 9]
        ours.attention(*_inputs(kv_len=17))  # another bucket, no history: its second call makes it hot
        assert [entry.plan.problem.kv_len for entry in ours._hot_path.slots] == [10, 9]


def test_a_plan_pushed_off_the_hot_path_comes_back_at_powers_of_two():
    ours = Dispatcher(kernels=["math"])
    shapes = {n: _inputs(kv_len=n) for n in (7, 9, 11)}
    with torch.no_grad():
        for n in (7, 7, 7, 9, 9, 11, 11):  # 7 goes hot at its second call, then 9 and 11 push it off
            ours.attention(*shapes[n])
        assert 7 not in {entry.plan.problem.kv_len for entry in ours._hot_path.slots}
        ours.attention(*shapes[7])  # its fourth call, on the dict path: back on
        assert ours._hot_path.slots[0].plan.problem.kv_len == 7
    assert ours.stats() == {"math": 8}


def test_a_hot_plan_that_is_pytorchs_call_keeps_pytorchs_behaviour_under_restrictions():
    """A plan that is one call of PyTorch's SDPA makes that call from the hot path under
    `sdpa_kernel` too: the same result, and PyTorch's own error where the backends left on refuse
    the call (no memory-efficient backend on a CPU), never a fallback to another kernel."""
    q, k, v = _inputs(q_len=6, kv_len=6)
    mask = torch.rand(6, 6, generator=torch.Generator().manual_seed(3)) > 0.2
    ours = Dispatcher(kernels=["sdpa_default", "math"])
    with torch.no_grad():
        for _ in range(HOT_AFTER + 1):
            ours.attention(q, k, v, attn_mask=mask)
            ours.attention(q, k, v)
        assert len(ours._hot_path.slots) == 2 and all(entry.plan.sdpa_flags is not None for entry in ours._hot_path.slots)
        with sdpa_kernel([SDPBackend.MATH]):
            for arguments in ({}, {"attn_mask": mask}):
                torch.testing.assert_close(ours.attention(q, k, v, **arguments),
                                           F.scaled_dot_product_attention(q, k, v, **arguments))
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            for arguments in ({}, {"attn_mask": mask}):
                with pytest.raises(RuntimeError) as theirs:
                    F.scaled_dot_product_attention(q, k, v, **arguments)
                with pytest.raises(RuntimeError) as ours_error:
                    ours.attention(q, k, v, **arguments)
                assert str(ours_error.value) == str(theirs.value)
    assert "math" not in ours.stats() and not ours._cold.state(q.device).failures


def test_a_plan_served_twice_in_a_row_by_the_dict_path_goes_back_on():
    """A repeated decode loop: each key length gets one run of calls (a layer each) per pass. In
    a late pass a length's second call puts it back on the hot path, whatever its call count."""
    ours = Dispatcher(kernels=["math"])
    shapes = {n: _inputs(kv_len=n) for n in (7, 9, 11)}
    with torch.no_grad():
        for _ in range(10):
            for n, inputs in shapes.items():
                ours.attention(*inputs)
                ours.attention(*inputs)
                assert ours._hot_path.slots[0].plan.problem.kv_len == n
                ours.attention(*inputs)
                ours.attention(*inputs)
    assert ours.stats() == {"math": 120}


def test_rehot_is_every_power_of_two_past_hot_after():
    assert [calls for calls in range(1, 70) if rehot(calls)] == [c for c in (4, 8, 16, 32, 64) if c > HOT_AFTER]


@pytest.mark.skipif(not TORCH_HAS_ENABLE_GQA, reason="no in-place call on torch < 2.5")
def test_a_plan_that_drops_enable_gqa_is_not_taken_for_pytorchs_own_call():
    """Equal head counts with enable_gqa=True: the plan calls PyTorch's SDPA without the flag (the
    same result), so under sdpa_kernel restrictions the hot path leaves the call to `route`, which
    passes the flag as given."""
    q, k, v = _inputs(heads=2, kv_heads=2)
    ours = Dispatcher(kernels=["sdpa_default"])
    with torch.no_grad():
        for _ in range(HOT_AFTER + 1):
            ours.attention(q, k, v, enable_gqa=True)
            ours.attention(q, k, v)
    by_flag = {entry.enable_gqa: entry for entry in ours._hot_path.slots}
    assert by_flag[False].pytorch_call
    assert by_flag[True].plan.sdpa_flags == {} and not by_flag[True].pytorch_call


def test_a_tensor_passed_twice_is_guarded_once_with_its_aliasing():
    q, kv, _ = _inputs()
    check = tensor_guard((q, kv, kv))  # TensorGuards alone refuses a tensor given twice
    assert check is not None and check(q, kv, kv)
    fresh_q, fresh_kv, _ = _inputs(seed=1)
    assert check(fresh_q, fresh_kv, fresh_kv)
    assert not check(q, kv, kv.clone())  # the same kind, but not the same tensor twice
    assert not check(q, kv.double(), kv.double())
    x = _inputs()[0]
    assert tensor_guard((x, x, x))(x, x, x) and not tensor_guard((x, x, x))(x, x.clone(), x)


@pytest.mark.parametrize("kernel", ["math", "sdpa_default"])
def test_a_call_with_key_is_value_goes_hot_and_builds_one_guard(monkeypatch, kernel):
    built = []
    real = hot_path.tensor_guard
    monkeypatch.setattr(hot_path, "tensor_guard", lambda tensors: built.append(len(tensors)) or real(tensors))
    q, kv, _ = _inputs()
    ours = Dispatcher(kernels=[kernel])
    with torch.no_grad():
        outs = [ours.attention(q, kv, kv) for _ in range(HOT_AFTER + 8)]
    assert len(ours._hot_path.slots) == 1 and built == [3]
    for out in outs:
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, kv, kv))


def test_a_plan_no_guard_can_cover_is_not_tried_on_every_call(monkeypatch):
    tried = []
    monkeypatch.setattr(hot_path, "tensor_guard", lambda tensors: tried.append(1) and None)
    ours, (q, k, v) = _hot_dispatcher(calls=HOT_AFTER + 8)  # `math`: no fast-path entry either
    assert ours._hot_path.slots == () and len(tried) == 1
    assert next(iter(ours._plans.values())).unguardable
