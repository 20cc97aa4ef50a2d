"""The warm path's inlined key equals `cache_key`, and every attribute that changes the Problem
or its validity changes the key."""

from __future__ import annotations

import torch

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher._plan import cache_key
from tests.dispatcher.helpers import qkv


def test_inlined_key_equals_cache_key():
    ours = Dispatcher(kernels=["math"])
    inputs = qkv()
    mask = torch.ones(8, 8, dtype=torch.bool)
    ours.attention(inputs["query"], inputs["key"], inputs["value"], mask, enable_gqa=True)
    assert list(ours._plans) == [cache_key(inputs["query"], inputs["key"], inputs["value"], mask, False, True)]


def test_key_changes_with_everything_validated():
    inputs = qkv()
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    base = cache_key(q, k, v, None, False, True)
    variants = [
        cache_key(q.double(), k, v, None, False, True),
        cache_key(q, k.double(), v, None, False, True),
        cache_key(q, k, v.double(), None, False, True),
        cache_key(q, k, v.to("meta"), None, False, True),
        cache_key(q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v, None, False, True),
        cache_key(q, k, v, torch.ones(8, 8, dtype=torch.bool), False, True),
        cache_key(q, k, v, torch.ones(8, 8), False, True),
        cache_key(q, k, v, None, True, True),
        cache_key(q, k, v, None, False, False),
        cache_key(q[..., :4, :], k, v, None, False, True),
    ]
    assert all(variant != base for variant in variants)
    assert len(set(variants)) == len(variants)
