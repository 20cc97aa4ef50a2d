"""The hot path (`dispatcher.hot_path`) gives what the dict path gives, on inputs and sequences of
calls found in its review: a strided nested tensor meeting a hot plan (Dynamo's guard reads its
strides, which abort the interpreter), a plan taken off the cache while its guard was being
built (another thread's `reset` or eviction: the plan must not go hot afterwards), and a
`CausalBias` mask, whose variant (upper-left or lower-right) no tensor guard sees."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalVariant, causal_lower_right, causal_upper_left

from attn_dispatch.dispatcher import Dispatcher, core, hot_path
from attn_dispatch.dispatcher.hot_path import HOT_AFTER


def _inputs(kv_len=7, seed=0):
    """query ``[2, 2, 5, 8]``, key and value ``[2, 2, kv_len, 8]``."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 2, n, 8, generator=generator) for n in (5, kv_len, kv_len))


def _outcome(call):
    """``("ok", output)`` or ``("raised", type, message)``."""
    try:
        return ("ok", call())
    except Exception as error:  # noqa: BLE001 - the outcome is what is compared
        return ("raised", type(error), str(error))


def _nested_call_outcome(position: str):
    """A plan made hot (where guards are on), then a call of its tensors with `position` replaced
    by a strided nested tensor of the same pieces: (the call's outcome, whether a plan was hot)."""
    query, key, value = _inputs()
    mask = torch.zeros(5, 7) if position == "mask" else None
    ours = Dispatcher(kernels=["math"])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the prototype warning of strided nested tensors
        for _ in range(HOT_AFTER + 1):
            ours.attention(query, key, value, mask)
        arguments = {"query": query, "key": key, "value": value, "mask": mask}
        arguments[position] = torch.nested.nested_tensor(list(arguments[position]))
        return _outcome(lambda: ours.attention(*arguments.values())), bool(ours._hot_path.slots)


@pytest.mark.parametrize("position", ["query", "key", "value", "mask"])
def test_a_strided_nested_tensor_meeting_a_hot_plan_gets_what_the_dict_path_gives(monkeypatch, position):
    hot, went_hot = _nested_call_outcome(position)  # aborted the interpreter: the guard read its strides
    monkeypatch.setattr(hot_path, "tensor_guard", lambda tensors: None)
    cold, _ = _nested_call_outcome(position)
    assert went_hot
    assert hot[0] == cold[0] == "raised" and hot[1:] == cold[1:]


def _hot_during_guard(monkeypatch, meanwhile):
    """A dispatcher whose one shape reaches `HOT_AFTER` calls while `meanwhile(dispatcher)` runs
    (once) between building the plan's guard and putting it on the hot path (what another thread
    may do)."""
    ours = Dispatcher(kernels=["math"])
    build = hot_path.tensor_guard
    pending = [meanwhile]

    def interleaved(tensors):
        check = build(tensors)
        if pending:
            pending.pop()(ours)
        return check

    monkeypatch.setattr(hot_path, "tensor_guard", interleaved)
    with torch.no_grad():
        for _ in range(HOT_AFTER):
            ours.attention(*_inputs())
    monkeypatch.setattr(hot_path, "tensor_guard", build)
    return ours


def test_a_plan_reset_while_its_guard_is_built_does_not_go_hot(monkeypatch):
    ours = _hot_during_guard(monkeypatch, Dispatcher.reset)
    with torch.no_grad():
        ours.attention(*_inputs())
    assert ours.stats() == {"math": 1}, "the call after reset ran the plan reset forgot"
    assert len(ours._plans) == 1


def test_a_plan_evicted_while_its_guard_is_built_does_not_go_hot(monkeypatch):
    monkeypatch.setattr(core, "MAX_PLANS", 1)
    ours = _hot_during_guard(monkeypatch, lambda dispatcher: dispatcher.attention(*_inputs(kv_len=9)))
    with torch.no_grad():
        ours.attention(*_inputs())  # plans its shape again, evicting the other
    assert ours.stats() == {"math": HOT_AFTER + 1 + 1}, "a call ran the evicted plan and went uncounted"


def _upper_left_bias(made: str):
    """An upper-left `CausalBias` for query length 5 and key length 7: as PyTorch makes one, or a
    lower-right one whose variant was set afterwards (its tensor then looks lower-right)."""
    if made == "causal_upper_left":
        return causal_upper_left(5, 7)
    bias = causal_lower_right(5, 7)
    bias.variant = CausalVariant.UPPER_LEFT
    return bias


@pytest.mark.parametrize("made", ["causal_upper_left", "variant set"])
def test_an_upper_left_causal_bias_after_a_lower_right_one_went_hot_gets_pytorchs_result(made):
    query, key, value = _inputs()
    ours = Dispatcher(kernels=["math"])
    with torch.no_grad():
        for _ in range(HOT_AFTER + 1):
            lower_right = ours.attention(query, key, value, causal_lower_right(5, 7))
        upper_left = _upper_left_bias(made)
        torch.testing.assert_close(ours.attention(query, key, value, upper_left),
                                   F.scaled_dot_product_attention(query, key, value, upper_left))
    expected = F.scaled_dot_product_attention(query, key, value, causal_lower_right(5, 7))
    torch.testing.assert_close(lower_right, expected)
