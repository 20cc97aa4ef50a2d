"""`dispatcher.attention` is a drop-in for `F.scaled_dot_product_attention`: same outputs on the
kernel contract cases, same exception types for bad inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from tests.dispatcher.helpers import assert_matches_reference, qkv
from tests.kernels.cases import Case, cases
from tests.kernels.test_contract import NAMED_CASES

CASES = {
    **NAMED_CASES,
    "gqa_8_fp16_mask": Case(gqa_ratio=8, dtype="float16", mask="bool", q_len=3, kv_len=29),
    "gqa_4_bf16_causal_rect": Case(gqa_ratio=4, dtype="bfloat16", causal=True, q_len=6, kv_len=17),
    "leading_dims_strided_float_mask": Case(lead=(2, 2), strided=True, mask="float", mask_rank=2, q_len=5, kv_len=9),
    "empty_query": Case(q_len=0, kv_len=5),
}
KERNEL_SETS = {"all": Dispatcher(), "portable": Dispatcher(kernels="portable")}


def _split(inputs: dict):
    return inputs.pop("query"), inputs.pop("key"), inputs.pop("value"), inputs


@pytest.mark.parametrize("kernel_set", list(KERNEL_SETS))
@pytest.mark.parametrize("name", list(CASES))
def test_named_case_matches_sdpa(name, kernel_set):
    inputs = CASES[name].build()
    query, key, value, flags = _split(dict(inputs))
    run = KERNEL_SETS[kernel_set].attention
    out = run(query, key, value, **flags)
    expected = pytorch_sdpa(query, key, value, **flags)
    assert out.shape == expected.shape and out.dtype == expected.dtype and out.device == expected.device
    if out.numel():
        assert_matches_reference(out, inputs)
    again = run(query, key, value, **flags)  # warm path: the cached decision
    assert torch.equal(again, out)


def _pytorch_refuses(query, key, value, flags) -> bool:
    """Whether PyTorch's SDPA raises its "mask with is_causal" RuntimeError here (its MATH backend's)."""
    try:
        pytorch_sdpa(query, key, value, **flags)
    except Exception as error:  # noqa: BLE001 - a 1-D mask: PyTorch's IndexError, which SDPA's broadcasting allows
        return isinstance(error, RuntimeError) and "Explicit attn_mask should not be set when is_causal=True" in str(error)
    return False


@given(case=cases())  # the project profile (tests/conftest.py): no deadline
def test_random_cases_match_reference(case):
    inputs = case.build()
    query, key, value, flags = _split(dict(inputs))
    if case.causal and case.mask != "none" and _pytorch_refuses(query, key, value, flags):
        with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
            dispatcher.attention(query, key, value, **flags)
        return
    assert_matches_reference(dispatcher.attention(query, key, value, **flags), inputs)


def test_positional_arguments_and_keyword_only_scale():
    inputs = qkv(heads=2, kv_heads=2)
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    mask = torch.rand(8, 8) > 0.2
    out = dispatcher.attention(q, k, v, mask, 0.0, False, scale=0.3)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale=0.3))
    with pytest.raises(TypeError):
        dispatcher.attention(q, k, v, None, 0.0, False, 0.3)  # scale is keyword-only, as in SDPA


BAD_INPUTS = {
    "dtype_mismatch": lambda q, k, v: ((q, k.double(), v), {}),
    "head_dim_mismatch": lambda q, k, v: ((q, k[..., :8], v), {}),
    "kv_len_mismatch": lambda q, k, v: ((q, k, v[..., :3, :]), {}),
    "heads_without_gqa": lambda q, k, v: ((q, torch.cat([k, k[:, :1]], 1), torch.cat([v, v[:, :1]], 1)), {}),
    "gqa_heads_do_not_divide": lambda q, k, v: ((torch.cat([q, q[:, :1]], 1), k, v), {"enable_gqa": True}),
    "mask_wrong_shape": lambda q, k, v: ((q, k, v), {"attn_mask": torch.ones(3, 5, dtype=torch.bool)}),
    "mask_int_dtype": lambda q, k, v: ((q, k, v), {"attn_mask": torch.ones(8, 8, dtype=torch.int32)}),
    "integer_inputs": lambda q, k, v: ((q.long(), k.long(), v.long()), {}),
    "query_not_a_tensor": lambda q, k, v: ((q.tolist(), k, v), {}),
    "mask_not_a_tensor": lambda q, k, v: ((q, k, v), {"attn_mask": [[True]]}),
    "zero_dim_inputs": lambda q, k, v: ((q[0, 0, 0, 0], k[0, 0, 0, 0], v[0, 0, 0, 0]), {}),
    "zero_dim_key_value": lambda q, k, v: ((q, k[0, 0, 0, 0], v[0, 0, 0, 0]), {}),
    "one_dim_inputs": lambda q, k, v: ((q[0, 0, 0], k[0, 0, 0], v[0, 0, 0]), {}),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_inputs_raise_sdpa_exception_types(name):
    inputs = qkv(heads=2, kv_heads=2)
    args, kwargs = BAD_INPUTS[name](inputs["query"], inputs["key"], inputs["value"])
    try:
        F.scaled_dot_product_attention(*args, **kwargs)
        expected = RuntimeError  # PyTorch's CPU path accepts some bad shapes; we still refuse them
    except Exception as error:  # noqa: BLE001
        expected = type(error)
    with pytest.raises(Exception) as ours:
        dispatcher.attention(*args, **kwargs)
    assert isinstance(ours.value, expected), (
        f"SDPA raises {expected.__name__}, the dispatcher {type(ours.value).__name__}: {ours.value}"
    )


def test_bad_scale_is_not_blamed_on_the_kernels():
    inputs = qkv()
    ours = dispatcher.Dispatcher()
    ours.attention(inputs["query"], inputs["key"], inputs["value"], enable_gqa=True)  # a warm plan
    with pytest.raises(TypeError, match="scale"):
        ours.attention(inputs["query"], inputs["key"], inputs["value"], scale="0.1", enable_gqa=True)
    out = ours.attention(inputs["query"], inputs["key"], inputs["value"], enable_gqa=True)
    assert torch.isfinite(out).all()  # nothing was remembered as failed for the bucket
    assert not any("failed" in why for _, why in ours.explain(**inputs).dropped)
    assert sum(ours.stats().values()) == 2  # the call that raised is not counted


def test_inference_mode():
    inputs = qkv()
    with torch.inference_mode():
        out = dispatcher.attention(**inputs)
        out_again = dispatcher.attention(**inputs)
    assert out.is_inference() and torch.equal(out, out_again)
    assert_matches_reference(out, inputs)


@pytest.mark.parametrize("mask", [torch.tensor(True), torch.tensor(False), torch.tensor(-1.5)])
def test_a_zero_dim_mask_broadcasts_as_a_one_dim_mask_does(mask):
    """PyTorch's SDPA raises IndexError for a 0-D (or 1-D) mask; broadcasting gives it a meaning, as for 1-D."""
    inputs = qkv(heads=2, kv_heads=2)
    query, key, value = inputs["query"], inputs["key"], inputs["value"]
    expanded = mask.expand(query.shape[-2], key.shape[-2])
    torch.testing.assert_close(dispatcher.attention(query, key, value, attn_mask=mask),
                               F.scaled_dot_product_attention(query, key, value, attn_mask=expanded))
