"""The warm path's inlined key equals `cache_key`, every attribute that changes the Problem or its
validity changes the key, and equal keys mean equal Problems."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher.plans import cache_key, problem_at_key_length
from attn_dispatch.kernels import Problem
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


def _strided(tensor: torch.Tensor) -> torch.Tensor:
    """The same values with the last two dimensions' storage swapped (not contiguous)."""
    return tensor.transpose(-1, -2).contiguous().transpose(-1, -2)


def test_equal_keys_mean_equal_problems_whichever_input_is_strided():
    """The key holds one contiguity flag for query, key and value together: the `Problem` reads no
    more of their layout, and any one of them strided changes the key."""
    inputs = qkv()
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    dense = cache_key(q, k, v, None, False, True)
    calls = [(_strided(q), k, v), (q, _strided(k), v), (q, k, _strided(v))]
    keys = [cache_key(*call, None, False, True) for call in calls]
    problems = [Problem.from_tensors(*call, None, False, True) for call in calls]
    assert all(key != dense for key in keys)
    assert len(set(keys)) == 1 and all(problem == problems[0] for problem in problems)


def test_a_causal_bias_and_a_mask_of_its_shape_and_dtype_are_planned_apart():
    """A `CausalBias` reports a shape and dtype a plain float mask can have; the key tells them
    apart by class, so neither call runs the other's plan (either order)."""
    inputs = qkv(heads=2, kv_heads=2, q_len=4, kv_len=8)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    bias = causal_lower_right(4, 8)
    mask = torch.randn(bias.shape, generator=torch.Generator().manual_seed(1))
    assert (mask.shape, mask.dtype) == (bias.shape, bias.dtype)
    assert cache_key(q, k, v, bias, False, False) != cache_key(q, k, v, mask, False, False)
    for order in ((bias, mask), (mask, bias)):
        ours = Dispatcher(kernels=["sdpa_default", "math"])
        with torch.inference_mode():
            for attn_mask in order:
                torch.testing.assert_close(ours.attention(q, k, v, attn_mask), F.scaled_dot_product_attention(q, k, v, attn_mask))


@pytest.mark.parametrize("mask", [False, True])
def test_a_sibling_problem_at_another_key_length_is_the_validated_one(mask):
    """`problem_at_key_length` (no validation, `Problem.at_key_length`) gives what validating the
    call in full gives."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 3, 16, generator=generator)

    def call(kv_len):
        k, v = torch.randn(2, 2, kv_len, 16, generator=generator), torch.randn(2, 2, kv_len, 16, generator=generator)
        attn_mask = torch.rand(2, 1, 3, kv_len, generator=generator) > 0.5 if mask else None
        return q, k, v, attn_mask

    sibling = Problem.from_tensors(*call(100), False, True)
    q, k, v, attn_mask = call(257)
    moved = problem_at_key_length(sibling, k, v, attn_mask)
    expected = Problem.from_tensors(q, k, v, attn_mask, False, True)
    assert moved == expected and hash(moved) == hash(expected) and sibling.kv_len == 100
