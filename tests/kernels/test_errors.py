"""Bad input raises SDPA's exception type with a message naming the argument."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_dispatch.kernels import (
    AccuracyPolicy,
    MathKernel,
    Problem,
    UnsupportedProblemError,
    kernel_from_name,
)
from attn_dispatch.kernels.small_q import effective_splits

q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)

BAD_INPUTS = {
    "dtype_mismatch": (dict(query=q.half(), key=k, value=v), "dtype"),
    "int_inputs": (dict(query=q.int(), key=k.int(), value=v.int()), "dtype"),
    "one_dim": (dict(query=torch.randn(8), key=torch.randn(8), value=torch.randn(8)), "2-D"),
    "head_dim_mismatch": (dict(query=q, key=k[..., :4], value=v), "head dim"),
    "mask_dtype": (dict(query=q, key=k, value=v, attn_mask=torch.zeros(3, 5, dtype=torch.float64)), "attn_mask"),
    "mask_int": (dict(query=q, key=k, value=v, attn_mask=torch.zeros(3, 5, dtype=torch.int32)), "attn_mask"),
    "mask_shape": (dict(query=q, key=k, value=v, attn_mask=torch.ones(4, 5, dtype=torch.bool)), "attn_mask"),
    "heads_without_gqa": (dict(query=torch.randn(1, 4, 3, 8), key=k, value=v), "enable_gqa"),
    "gqa_ratio": (dict(query=torch.randn(1, 3, 3, 8), key=k, value=v, enable_gqa=True), "heads"),
    "device_mismatch": (dict(query=q, key=k.to("meta"), value=v), "device"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_same_exception_type_as_sdpa_and_names_the_argument(name):
    kwargs, word = BAD_INPUTS[name]
    with pytest.raises(Exception) as sdpa_error:
        F.scaled_dot_product_attention(**kwargs)
    with pytest.raises(Exception) as ours:
        MathKernel()(**kwargs)
    assert type(ours.value) is type(sdpa_error.value) or isinstance(ours.value, type(sdpa_error.value))
    assert word in str(ours.value), str(ours.value)


def test_value_length_mismatch_is_an_error():
    """SDPA's fused CPU path silently accepts this (reading past value); we refuse it."""
    with pytest.raises(RuntimeError, match="value's sequence length"):
        MathKernel()(q, k, v[:, :, :4])


def test_not_a_tensor():
    with pytest.raises(TypeError, match="key must be a torch.Tensor"):
        Problem.from_tensors(q, [1, 2], v)
    with pytest.raises(TypeError, match="attn_mask"):
        Problem.from_tensors(q, k, v, attn_mask=[[True]])


def test_unsupported_problem_error_lists_reasons():
    kernel = kernel_from_name("convert[fp32->bf16]+math".replace("math", "chunked[q=512,kv=4096]"))
    with pytest.raises(UnsupportedProblemError, match="lossy.*AccuracyPolicy.allowing"):
        kernel(q, k, v)
    allowed = kernel_from_name("convert[fp32->bf16]+chunked[q=512,kv=4096]", policy=AccuracyPolicy.allowing("fp32->bf16"))
    assert allowed(q, k, v).dtype == torch.float32


@pytest.mark.parametrize(
    "name, message",
    [
        ("flash", "unknown kernel"),
        ("chunked[q=0,kv=4]", "positive integer"),
        ("chunked[q=abc]", "key=<integer>"),
        ("chunked[kv=1024,q=256]", "not canonical"),
        ("small_q[q=4]", "takes parameters: splits"),
        ("convert[fp32->int8]+math", "SRC->DST"),
        ("convert[fp32->bf16]+convert[bf16->fp32]+math", "unknown kernel|do not nest"),
        ("x" * 500, "at most"),
        ("__import__('os')", "unknown kernel"),
    ],
)
def test_bad_kernel_names(name, message):
    with pytest.raises(ValueError, match=message):
        kernel_from_name(name)


def test_problem_field_validation():
    with pytest.raises(ValueError, match="kv_heads"):
        Problem(1, 6, 4, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="dtype"):
        Problem(1, 1, 1, 1, 1, 8, 8, dtype="int8")
    with pytest.raises(ValueError, match="mask_shape"):
        Problem(1, 1, 1, 1, 1, 8, 8, mask_kind="bool")
    with pytest.raises(ValueError, match="q_len"):
        Problem.from_dict({**Problem(1, 1, 1, 1, 1, 8, 8).to_dict(), "q_len": "7"})
    with pytest.raises(ValueError, match="unknown problem fields"):
        Problem.from_dict({**Problem(1, 1, 1, 1, 1, 8, 8).to_dict(), "evil": 1})


@pytest.mark.parametrize("requested, length, expected", [(8, 4096, 8), (8, 4097, 1), (8, 4098, 6), (32, 30, 30), (4, 0, 1)])
def test_effective_splits(requested, length, expected):
    assert effective_splits(requested, length) == expected
