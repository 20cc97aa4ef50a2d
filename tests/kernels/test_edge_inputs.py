"""Every kernel at the edges PyTorch's own SDPA tests look at (issue 13): scores past fp16's range,
zero-size dimensions, `CausalBias` objects, meta tensors, complex inputs, and backward with every
mask kind on kernels that declare a backward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from attn_dispatch.kernels import reference_attention, relative_errors
from tests.kernels.cases import Case
from tests.kernels.contract import (
    EVERY_KERNEL,
    TEST_DEVICE,
    check_against_reference,
    dtypes_for,
    every_kernel,
    lossy,
    problem_of,
)

HALF = ("float16", "bfloat16")
pytestmark = pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs")


def _skip_unless_takes(kernel, dtype: str) -> None:
    if dtype not in dtypes_for(kernel):
        pytest.skip(f"{kernel.name} takes other inputs than {dtype}")
    if lossy(kernel):
        pytest.skip(f"{kernel.name} converts lossily: its error is the accuracy policy's business")


def _run_or_skip(kernel, query, key, value, **kwargs):
    problem = problem_of({"query": query, "key": key, "value": value, "attn_mask": kwargs.get("attn_mask"),
                          "is_causal": kwargs.get("is_causal", False), "enable_gqa": kwargs.get("enable_gqa", False)})
    reasons = kernel.reasons(problem)
    if reasons:
        pytest.skip("; ".join(reasons))
    return kernel(query, key, value, **kwargs)


# ---------------------------------------------------------------- scores past fp16's range
@every_kernel
@pytest.mark.parametrize("dtype", HALF)
def test_dot_products_past_fp16_range(kernel, dtype):
    """PyTorch's regression test for its issue #160841, rebuilt: constant inputs of 256 in 80
    dims give raw dot products of 5.2e6 (scaled: 5.9e5), far past fp16's 65504. SDPA returns the
    values (256); scores made in fp16 gave NaN."""
    _skip_unless_takes(kernel, dtype)
    x = torch.full((1, 1, 2, 80), 256.0, dtype=getattr(torch, dtype), device=TEST_DEVICE)
    out = _run_or_skip(kernel, x, x, x)
    assert torch.equal(out, x), f"{kernel.name}: {out.flatten()[:4].tolist()} instead of 256"


@every_kernel
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", ["decode", "prefill_causal", "masked"])
def test_large_magnitude_inputs(kernel, dtype, shape):
    """randn * 64 inputs (dot products near and past 65504) against the float64 reference."""
    _skip_unless_takes(kernel, dtype)
    case = {
        "decode": Case(q_len=1, kv_len=130, gqa_ratio=4, head_dim=128),
        "prefill_causal": Case(q_len=40, kv_len=40, causal=True, head_dim=80),
        "masked": Case(q_len=9, kv_len=33, mask="float", mask_dims=(False, True, True, True)),
    }[shape]
    check_against_reference(kernel, Case(**{**case.__dict__, "dtype": dtype, "magnitude": 64.0}))


# ---------------------------------------------------------------- zero-size dimensions
ZERO_SIZES = {  # name -> (query, key, value) shapes
    "batch_0": ((0, 2, 3, 8), (0, 2, 4, 8), (0, 2, 4, 8)),
    "heads_0": ((1, 0, 3, 8), (1, 0, 4, 8), (1, 0, 4, 8)),
    "head_dim_0": ((1, 2, 3, 0), (1, 2, 4, 0), (1, 2, 4, 5)),
    "value_dim_0": ((1, 2, 3, 8), (1, 2, 4, 8), (1, 2, 4, 0)),
    "q_len_0": ((1, 2, 0, 8), (1, 2, 4, 8), (1, 2, 4, 8)),
    "kv_len_0": ((1, 2, 3, 8), (1, 2, 0, 8), (1, 2, 0, 8)),
}


def _zero_size_answer(q, k, v):
    """SDPA's answer with a size of 0, written out: an empty output, zeros without keys, the
    values' mean with head dim 0 (every score is 0). Not PyTorch's SDPA itself: on the H200
    (torch 2.11) its CUDA path returned None (an undefined tensor) for half inputs with B, H or
    Ev = 0, and its CPU path crashed the process with H = 0 (kernel suite, 2026-12-01)."""
    shape = (*q.shape[:-1], v.shape[-1])
    if k.shape[-2] == 0:
        return q.new_zeros(shape)
    return v.float().mean(dim=-2, keepdim=True).to(q.dtype).expand(shape)


@every_kernel
@pytest.mark.parametrize("name", list(ZERO_SIZES))
def test_zero_size_dimensions(kernel, name):
    """What SDPA returns (an empty output, zeros without keys, the values' mean with head dim 0),
    in the autograd graph: ``out.sum().backward()`` works, as with PyTorch."""
    dtype = getattr(torch, dtypes_for(kernel)[0])
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=generator).to(TEST_DEVICE, dtype) for shape in ZERO_SIZES[name])
    expected = _zero_size_answer(q, k, v)
    q.requires_grad_()
    out = _run_or_skip(kernel, q, k, v)
    assert out.shape == expected.shape and out.dtype == dtype
    rel_l2, rel_max = relative_errors(out, expected)  # lossy conversions round the values' mean
    assert kernel.tolerance(problem_of({"query": q, "key": k, "value": v, "attn_mask": None, "is_causal": False,
                                        "enable_gqa": False})).accepts(rel_l2, rel_max), f"{kernel.name}: {rel_l2:.2e}"
    if kernel.supports_backward or name in ("q_len_0", "kv_len_0"):
        out.sum().backward()
        assert q.grad is not None and q.grad.shape == q.shape


# ---------------------------------------------------------------- CausalBias
BIAS_SHAPES = [(5, 13), (13, 5), (9, 9), (1, 40)]


@every_kernel
@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
@pytest.mark.parametrize("lengths", BIAS_SHAPES, ids=lambda lengths: f"L{lengths[0]}_S{lengths[1]}")
def test_causal_bias(kernel, variant, lengths):
    """`causal_upper_left` is ``is_causal``; `causal_lower_right` aligns the diagonal bottom-right
    (rows that see no key give zeros). Never read as a float mask (its storage is garbage)."""
    L, S = lengths
    dtype = dtypes_for(kernel)[0]
    inputs = Case(q_len=L, kv_len=S, dtype=dtype, gqa_ratio=2).build(TEST_DEVICE)
    query, key, value = inputs["query"], inputs["key"], inputs["value"]
    bias = (causal_upper_left if variant == "upper_left" else causal_lower_right)(L, S)
    out = _run_or_skip(kernel, query, key, value, attn_mask=bias, enable_gqa=True)
    offset = S - L if variant == "lower_right" else 0
    allowed = torch.ones(L, S, dtype=torch.bool, device=query.device).tril(diagonal=offset)
    reference = reference_attention(query, key, value, attn_mask=allowed, enable_gqa=True)
    rel_l2, rel_max = relative_errors(out, reference)
    assert kernel.tolerance(problem_of({**inputs, "attn_mask": allowed})).accepts(rel_l2, rel_max), (
        f"{kernel.name}: relative L2 error {rel_l2:.2e} (max {rel_max:.2e})")


def test_reference_agrees_with_pytorch_on_causal_bias():
    """The materialised masks above are what PyTorch's own `CausalBias` handling computes."""
    for L, S in BIAS_SHAPES:
        inputs = Case(q_len=L, kv_len=S, dtype="float64").build()
        query, key, value = inputs["query"], inputs["key"], inputs["value"]
        for make, offset in ((causal_upper_left, 0), (causal_lower_right, S - L)):
            if make is causal_lower_right and L > S:
                continue  # PyTorch warns it gives NaN rows there; the kernels give zeros (SDPA's rule)
            expected = F.scaled_dot_product_attention(query, key, value, attn_mask=make(L, S))
            allowed = torch.ones(L, S, dtype=torch.bool).tril(diagonal=offset)
            assert relative_errors(reference_attention(query, key, value, attn_mask=allowed), expected)[0] < 1e-12


@every_kernel
def test_causal_bias_with_is_causal_raises_value_error(kernel):
    inputs = Case(q_len=4, kv_len=6).build(TEST_DEVICE)
    with pytest.raises(ValueError, match="CausalBias"):
        kernel(inputs["query"], inputs["key"], inputs["value"], attn_mask=causal_lower_right(4, 6), is_causal=True)


# ---------------------------------------------------------------- meta tensors, complex inputs
@every_kernel
@pytest.mark.parametrize("causal", [False, True])
def test_meta_tensors_give_meta_output(kernel, causal):
    """Shape inference (models built under ``torch.device("meta")``): a meta output of SDPA's
    shape, or a reason; never a read of the data."""
    dtype = getattr(torch, dtypes_for(kernel)[0])
    q = torch.empty(2, 4, 16, 8, device="meta", dtype=dtype)
    kv = torch.empty(2, 2, 24, 8, device="meta", dtype=dtype)
    mask = torch.empty(16, 24, device="meta", dtype=torch.bool)
    out = _run_or_skip(kernel, q, kv, kv, attn_mask=mask, is_causal=causal, enable_gqa=True)
    assert out.device.type == "meta" and out.shape == (2, 4, 16, 8) and out.dtype == dtype


@every_kernel
def test_complex_inputs_raise_not_implemented(kernel):
    q = torch.randn(1, 2, 3, 8, dtype=torch.complex64)
    with pytest.raises(NotImplementedError, match="complex"):
        kernel(q, q, q)


# ---------------------------------------------------------------- backward with masks
BACKWARD_KERNELS = [kernel for kernel in EVERY_KERNEL if kernel.supports_backward]
MASK_KINDS = {
    "none": {},
    "causal": {"is_causal": True},
    "bool": {"mask": "bool"},
    "float": {"mask": "float"},
    "bool_and_causal": {"mask": "bool", "is_causal": True},
    "fully_masked_rows": {"mask": "bool", "fully_masked_rows": True},
    "lower_right": {"bias": causal_lower_right},
}


@pytest.mark.parametrize("kernel", BACKWARD_KERNELS, ids=lambda kernel: kernel.name)
@pytest.mark.parametrize("kind", list(MASK_KINDS))
def test_backward_with_every_mask_kind(kernel, kind):
    """Gradients of query, key and value against the float64 reference's (autograd through it)."""
    spec = MASK_KINDS[kind]
    dtype = dtypes_for(kernel)[0]
    case = Case(q_len=6, kv_len=9, dtype=dtype, mask=spec.get("mask", "none"), mask_dims=(False, True, True, True),
                fully_masked_rows=spec.get("fully_masked_rows", False))
    inputs = case.build(TEST_DEVICE)
    mask = spec["bias"](6, 9) if "bias" in spec else inputs["attn_mask"]
    causal = spec.get("is_causal", False)
    leaves = [inputs[name].detach().requires_grad_() for name in ("query", "key", "value")]
    out = _run_or_skip(kernel, *leaves, attn_mask=mask, is_causal=causal)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    (out * weights).sum().backward()
    ref_leaves = [leaf.detach().double().requires_grad_() for leaf in leaves]
    ref_mask = mask
    if "bias" in spec:
        ref_mask = torch.ones(6, 9, dtype=torch.bool, device=out.device).tril(diagonal=3)
    (reference_attention(*ref_leaves, attn_mask=ref_mask, is_causal=causal) * weights.double()).sum().backward()
    tolerance = kernel.tolerance(problem_of({**inputs, "attn_mask": None, "is_causal": causal}))
    for name, leaf, ref in zip(("query", "key", "value"), leaves, ref_leaves, strict=True):
        assert leaf.grad is not None, f"{kernel.name}: no gradient for {name}"
        rel_l2, rel_max = relative_errors(leaf.grad, ref.grad)
        assert math.isfinite(rel_l2) and rel_l2 <= 10 * tolerance.relative_l2, (
            f"{kernel.name} {kind}: d{name} relative L2 error {rel_l2:.2e}")
