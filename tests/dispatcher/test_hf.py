"""The transformers attention function without transformers: which dispatcher it calls, bound
once when the function is made."""

from __future__ import annotations

import torch

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher import Dispatcher, api
from attn_dispatch.dispatcher.hf import make_attention_function
from tests.dispatcher.helpers import assert_matches_reference, qkv


def test_default_dispatcher_is_looked_up_once(monkeypatch):
    lookups = {"n": 0}
    default = api.default_dispatcher

    def counting_default():
        lookups["n"] += 1
        return default()

    monkeypatch.setattr(api, "default_dispatcher", counting_default)
    forward = make_attention_function()
    inputs = qkv()
    for _ in range(3):
        out, weights = forward(torch.nn.Module(), inputs["query"], inputs["key"], inputs["value"], None, is_causal=False)
        assert weights is None
    assert_matches_reference(out.transpose(1, 2), inputs)
    assert lookups["n"] == 1
    assert sum(dispatcher.stats().values()) == 3


def test_own_dispatcher_is_called():
    ours = Dispatcher(kernels=["math"])
    inputs = qkv()
    make_attention_function(ours)(torch.nn.Module(), inputs["query"], inputs["key"], inputs["value"], None, is_causal=False)
    assert ours.stats() == {"math": 1} and dispatcher.stats() == {}
