"""A call with a forward-mode AD dual tensor (``torch.autograd.forward_ad.make_dual``) behaves as
PyTorch's SDPA (its result and tangent, or its exception type), and leaves its size bucket alone:
later plain calls run the kernel they ran before. A new user's trial: PyTorch's CPU flash raises
NotImplementedError on a dual; the recovery remembered that against the bucket, moved every plain
call of it to ``sdpa_math`` and returned a result where PyTorch raises."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import forward_ad

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher.cold_path import carries_tangent
from attn_dispatch.kernels import MathKernel
from tests.dispatcher.helpers import FailingKernel, FixedRanker, qkv, use_ranking

SDPA = torch._C._nn.scaled_dot_product_attention  # PyTorch's own operator, whatever is patched


def dual_outcome(attention, inputs: dict, tangent: torch.Tensor):
    """``(primal, tangent)`` of `attention` on `inputs` with a dual query, or the exception type it raised."""
    with forward_ad.dual_level():
        dual = dict(inputs, query=forward_ad.make_dual(inputs["query"], tangent))
        try:
            out = attention(**dual)
        except Exception as error:  # noqa: BLE001 - the outcome compared is the exception's type
            return type(error)
        primal, out_tangent = forward_ad.unpack_dual(out)
        return primal.clone(), None if out_tangent is None else out_tangent.clone()


def assert_same_outcome(ours, theirs) -> None:
    if isinstance(theirs, type):
        assert ours is theirs
        return
    assert not isinstance(ours, type), f"ours raised {ours.__name__}, PyTorch's SDPA returned"
    torch.testing.assert_close(ours[0], theirs[0])
    assert (ours[1] is None) == (theirs[1] is None)
    if theirs[1] is not None:
        torch.testing.assert_close(ours[1], theirs[1])


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("entry", ["attention", "fast_attention"])
def test_a_dual_call_is_pytorchs_and_plain_calls_keep_their_kernel(entry, warm):
    inputs = qkv(heads=2, kv_heads=2, dim=4, dtype=torch.float64)
    ours = Dispatcher()
    attention = getattr(ours, entry)
    before = ours.explain(**inputs).kernel
    if warm:
        for _ in range(3):
            attention(**inputs)
    tangent = torch.randn_like(inputs["query"])
    assert_same_outcome(dual_outcome(attention, inputs, tangent), dual_outcome(SDPA, inputs, tangent))
    other_length = qkv(heads=2, kv_heads=2, q_len=7, kv_len=7, dim=4, dtype=torch.float64, seed=1)  # same bucket
    for call in (inputs, other_length):
        for _ in range(3):
            torch.testing.assert_close(attention(**call), SDPA(**call))
        assert ours.explain(**call).kernel == before
    assert set(ours.stats()) == {before}


def test_a_dual_call_whose_kernel_raises_gets_pytorchs_result_and_nothing_is_remembered(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["failing", "math"]))
    failing = FailingKernel()
    ours = Dispatcher(kernels=[failing, MathKernel()])
    # a last-dim stride of 2: PyTorch's CPU SDPA takes its math path, which has forward AD
    inputs = {name: torch.randn(1, 2, 8, 4, 2, dtype=torch.float64)[..., 0] for name in ("query", "key", "value")}
    tangent = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    theirs = dual_outcome(SDPA, inputs, tangent)
    assert not isinstance(theirs, type) and theirs[1] is not None  # the case this test is for
    assert_same_outcome(dual_outcome(ours.attention, inputs, tangent), theirs)
    assert failing.attempts == 1
    decision = ours.explain(**inputs)
    assert decision.kernel == "failing" and decision.reason_dropped("failing") is None


def test_carries_tangent_sees_only_duals_of_the_current_level():
    plain = torch.randn(2, 3)
    assert not carries_tangent(plain, None)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(plain, torch.randn(2, 3))
        assert carries_tangent(plain, dual, None) and not carries_tangent(plain, None)
    assert not carries_tangent(dual)  # the level was exited: its tangents are gone
