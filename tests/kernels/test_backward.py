"""Every kernel that declares a backward: gradients of query, key and value against the float64
reference's, `torch.autograd.gradcheck` on tiny fp64 problems, and the forward+backward peak
memory against `backward_workspace_bytes`."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.calibration.measure import measure_peak_bytes
from attn_dispatch.kernels import ChunkedKernel, reference_attention, relative_errors
from attn_dispatch.kernels.accuracy import Tolerance
from tests.kernels.cases import Case
from tests.kernels.contract import RUNNABLE_HERE, TEST_DEVICE, problem_of
from tests.kernels.test_contract import NAMED_CASES
from tests.kernels.test_workspace import CUDA_ALLOCATOR_SLACK_BYTES

GRADIENT_TOLERANCE_FACTOR = 2
"""Gradients may err up to twice the forward's tolerance (issue 16's target): the backward chains
three products where the forward has two."""

SMALL_BLOCKS = (ChunkedKernel(q=4, kv=8), ChunkedKernel(q=16, kv=5))  # several blocks on tiny cases
# One default `chunked` stands for its variants: on these tiny cases each is one block.
WITH_BACKWARD = [k for k in RUNNABLE_HERE if k.supports_backward and k.family != "chunked"] + [ChunkedKernel(), *SMALL_BLOCKS]
with_backward = pytest.mark.parametrize("kernel", WITH_BACKWARD, ids=lambda kernel: kernel.name)

GRADIENT_CASES = {
    name: NAMED_CASES[name]
    for name in (
        "causal_lq_gt_lk", "causal_lq_lt_lk", "causal_square", "decode", "gqa_4", "gqa_8_causal",
        "value_dim_differs", "odd_lengths", "strided_transformers_layout", "two_batch_dims",
        "bool_mask_full", "bool_mask_keys_only", "float_mask_per_head", "float_mask_per_batch",
        "fully_masked_rows_bool", "fully_masked_rows_float", "mask_and_causal", "gqa_with_mask_per_head",
        "custom_scale", "fp16", "bf16",
    )
}
GRADIENT_CASES["bf16_gqa_causal_mask"] = Case(dtype="bfloat16", gqa_ratio=4, q_len=19, kv_len=23, causal=True,
                                              mask="bool", fully_masked_rows=True)
GRADIENT_CASES["fp16_float_mask_dead_rows"] = Case(dtype="float16", mask="float", fully_masked_rows=True, q_len=17, kv_len=29)


def gradients(fn, inputs: dict, grad_out: torch.Tensor, dtype=None) -> tuple[torch.Tensor, ...]:
    """(output, d_query, d_key, d_value) of `fn` on copies of `inputs` (in `dtype` if given)."""
    leaves = [inputs[name].detach().to(dtype or inputs[name].dtype).requires_grad_(True) for name in ("query", "key", "value")]
    rest = {name: value for name, value in inputs.items() if name not in ("query", "key", "value")}
    out = fn(*leaves, **rest)
    return (out, *torch.autograd.grad(out, leaves, grad_out.to(out.dtype)))


@with_backward
@pytest.mark.parametrize("name", list(GRADIENT_CASES))
def test_gradients_match_float64_reference(kernel, name):
    inputs = GRADIENT_CASES[name].build(TEST_DEVICE)
    problem = problem_of(inputs)
    if kernel.reasons(problem):
        pytest.skip("; ".join(kernel.reasons(problem)))
    grad_out = torch.randn(reference_attention(**inputs).shape, generator=torch.Generator().manual_seed(1))
    grad_out = grad_out.to(inputs["query"].device)
    ours = gradients(kernel, inputs, grad_out)
    expected = gradients(reference_attention, inputs, grad_out, dtype=torch.float64)
    forward = kernel.tolerance(problem)
    tolerance = Tolerance(forward.relative_l2 * GRADIENT_TOLERANCE_FACTOR, forward.relative_max * GRADIENT_TOLERANCE_FACTOR)
    for label, got, want in zip(("out", "d_query", "d_key", "d_value"), ours, expected, strict=True):
        assert got.shape == want.shape and got.dtype == inputs["query"].dtype, label
        rel_l2, rel_max = relative_errors(got, want)
        assert tolerance.accepts(rel_l2, rel_max), f"{kernel.name} {name} {label}: {rel_l2:.2e} (max {rel_max:.2e}) > {tolerance}"


@pytest.mark.parametrize("mask", ["bool", "float"])
def test_fully_masked_rows_get_zero_query_gradients(mask):
    inputs = Case(mask=mask, fully_masked_rows=True, q_len=9, kv_len=13).build(TEST_DEVICE)
    grad_out = torch.ones(1, 2, 9, 64, device=inputs["query"].device)
    _, d_query, _, _ = gradients(ChunkedKernel(q=4, kv=4), inputs, grad_out)
    assert torch.count_nonzero(d_query[..., 0, :]) == 0


GRADCHECK_CASES = {
    "causal_lq_gt_lk_gqa": Case(dtype="float64", gqa_ratio=2, q_len=5, kv_len=3, causal=True, head_dim=4),
    "causal_lq_lt_lk": Case(dtype="float64", q_len=3, kv_len=6, causal=True, head_dim=4),
    "bool_mask_dead_row": Case(dtype="float64", q_len=4, kv_len=5, mask="bool", fully_masked_rows=True, head_dim=3),
    "float_mask_scale": Case(dtype="float64", q_len=4, kv_len=7, mask="float", head_dim=4, scale=0.3, value_dim=2),
    "strided": Case(dtype="float64", lead=(2,), q_len=3, kv_len=4, strided=True, head_dim=4),
}


@pytest.mark.parametrize("name", list(GRADCHECK_CASES))
def test_gradcheck_tiny_fp64(name):
    inputs = GRADCHECK_CASES[name].build(TEST_DEVICE)
    leaves = tuple(inputs.pop(name).requires_grad_(True) for name in ("query", "key", "value"))
    kernel = ChunkedKernel(q=2, kv=3)
    assert torch.autograd.gradcheck(lambda q, k, v: kernel(q, k, v, **inputs), leaves, eps=1e-6, atol=1e-7,
                                    check_batched_grad=True)  # the backward under vmap, as PyTorch's own tests run it


def test_mask_requiring_grad_is_refused():
    inputs = Case(mask="float").build(TEST_DEVICE)
    mask = inputs.pop("attn_mask").requires_grad_(True)
    with pytest.raises(RuntimeError, match="attn_mask requires grad"):
        ChunkedKernel()(inputs.pop("query").requires_grad_(True), inputs.pop("key"), inputs.pop("value"),
                        attn_mask=mask, **inputs)


BACKWARD_MEMORY_CASES = {
    "prefill_causal": Case(q_len=96, kv_len=96, causal=True),
    "masked_strided": Case(lead=(2,), mask="bool", mask_dims=(True, False, True, True), strided=True, q_len=40, kv_len=70),
    "float_mask_fp16": Case(dtype="float16", mask="float", q_len=33, kv_len=65),
    "bf16_gqa_causal": Case(dtype="bfloat16", gqa_ratio=8, q_len=20, kv_len=50, causal=True),
    "decode_gqa": Case(gqa_ratio=4, q_len=1, kv_len=300),
}
MEMORY_KERNELS = (ChunkedKernel(q=32, kv=48), ChunkedKernel(q=512, kv=4096))  # several tiles / one tile


@pytest.mark.parametrize("kernel", MEMORY_KERNELS, ids=lambda kernel: kernel.name)
@pytest.mark.parametrize("name", list(BACKWARD_MEMORY_CASES))
def test_backward_workspace_bounds_measured_peak(kernel, name):
    """Forward plus backward (gradients included) allocate at most `backward_workspace_bytes`."""
    inputs = BACKWARD_MEMORY_CASES[name].build(TEST_DEVICE)
    problem = problem_of(inputs)
    leaves = [inputs.pop(name).requires_grad_(True) for name in ("query", "key", "value")]
    grad_out = torch.randn(problem.batch, problem.q_heads, problem.q_len, problem.value_dim,
                           dtype=leaves[0].dtype, device=leaves[0].device).reshape(reference_attention(*leaves, **inputs).shape)

    def train_step():
        return torch.autograd.grad(kernel(*leaves, **inputs), leaves, grad_out)

    train_step()  # warm-up
    device = leaves[0].device
    allocated_before = bytes_allocated_so_far(device)
    peak, grads = measure_peak_bytes(train_step, device)
    bound = kernel.backward_workspace_bytes(problem)
    if device.type == "cuda":
        bound += CUDA_ALLOCATOR_SLACK_BYTES
    assert len(grads) == 3
    assert peak <= bound, f"{kernel.name}: peak {peak} B, bound {bound} B"
    # the measurement saw the backward run: it allocated the gradients. On CUDA the allocator's running
    # total, not the peak: memory another test left and freed during the call (a pytest-xdist worker runs
    # many) lowers the peak over the start, never the total allocated.
    allocated = peak if allocated_before is None else bytes_allocated_so_far(device) - allocated_before
    assert allocated > problem.q_bytes + problem.kv_bytes, f"{kernel.name}: {allocated} B allocated"


def bytes_allocated_so_far(device: torch.device) -> int | None:
    """The CUDA caching allocator's running total of bytes allocated (None off CUDA). Unlike the peak over
    the start, memory another test left and freed during a measured call (a pytest-xdist worker runs many)
    never lowers it."""
    if device.type != "cuda":
        return None
    return torch.cuda.memory_stats(device)["allocated_bytes.all.allocated"]


def test_backward_peak_does_not_grow_with_the_score_matrix():
    """Quadrupling both lengths grows forward+backward memory like the inputs (x4), not like the
    score matrix (x16): the backward works tile by tile."""
    kernel = ChunkedKernel(q=64, kv=128)

    def peak(length):
        inputs = Case(q_len=length, kv_len=length, kv_heads=1).build(TEST_DEVICE)
        leaves = [inputs.pop(name).requires_grad_(True) for name in ("query", "key", "value")]
        out = kernel(*leaves, **inputs)
        grad_out = torch.randn_like(out)

        def train_step():
            return torch.autograd.grad(kernel(*leaves, **inputs), leaves, grad_out)

        train_step()  # warm-up: a GPU's first backward allocates its BLAS workspace (32 MiB on an H100)
        return measure_peak_bytes(train_step, leaves[0].device)[0]

    assert peak(512) <= 4.5 * peak(128)


@pytest.mark.parametrize(("q_len", "kv_len"), [(16, 300), (128, 256), (40, 24)])
def test_lower_right_causality_spanning_several_key_blocks(q_len, kv_len):
    """A `causal_lower_right` bias on the training path reads every key block its rows see (the
    diagonal shifted by S - L), as the inference path does: outputs and gradients as PyTorch's."""
    from torch.nn.attention.bias import causal_lower_right

    generator = torch.Generator().manual_seed(0)
    leaves = [torch.randn(1, 2, length, 16, generator=generator, dtype=torch.float64).requires_grad_()
              for length in (q_len, kv_len, kv_len)]
    bias = causal_lower_right(q_len, kv_len)
    out = ChunkedKernel(q=32, kv=64)(*leaves, attn_mask=bias)
    grads = torch.autograd.grad(out.sum(), leaves)
    expected_leaves = [leaf.detach().clone().requires_grad_() for leaf in leaves]
    expected = torch.nn.functional.scaled_dot_product_attention(*expected_leaves, attn_mask=bias)
    expected_grads = torch.autograd.grad(expected.sum(), expected_leaves)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)

