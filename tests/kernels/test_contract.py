"""Every kernel against the float64 reference: random (hypothesis) and named cases."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

from attn_dispatch.kernels import kernel_from_name, reference_attention, relative_errors
from tests.kernels.cases import Case, cases
from tests.kernels.contract import (
    EVERY_KERNEL,
    TEST_DEVICE,
    basic_problems,
    check_against_reference,
    dtypes_for,
    every_kernel,
    lossy,
    problem_of,
    runnable_kernel,
    runs_here,
)


@pytest.mark.parametrize("kernel", [k for k in EVERY_KERNEL if not runs_here(k)], ids=lambda k: k.name)
def test_kernels_unavailable_here_say_why(kernel):
    for problem in basic_problems(kernel):
        reasons = kernel.reasons(problem)
        assert reasons and all(isinstance(r, str) and len(r) > 10 for r in reasons)


@runnable_kernel
@given(data=st.data())
def test_random_problems_match_reference(kernel, data):
    case = data.draw(cases(dtypes=dtypes_for(kernel), large_magnitudes=not lossy(kernel)))
    assume(check_against_reference(kernel, case, skip_unsupported=False))


NAMED_CASES = {
    "causal_lq_gt_lk": Case(q_len=13, kv_len=5, causal=True),
    "causal_lq_lt_lk": Case(q_len=5, kv_len=13, causal=True),
    "causal_square": Case(q_len=33, kv_len=33, causal=True),
    "decode": Case(q_len=1, kv_len=67),
    "gqa_4": Case(gqa_ratio=4, q_len=9, kv_len=21),
    "gqa_8_causal": Case(gqa_ratio=8, q_len=17, kv_len=17, causal=True),
    "head_dim_80": Case(head_dim=80, q_len=7, kv_len=9),
    "head_dim_256": Case(head_dim=256, q_len=7, kv_len=9),
    "value_dim_differs": Case(head_dim=64, value_dim=32),
    "odd_lengths": Case(q_len=31, kv_len=97),
    "strided_transformers_layout": Case(lead=(2,), strided=True, q_len=11, kv_len=19),
    "no_batch_dim": Case(lead=(), q_len=6, kv_len=10),
    "two_batch_dims": Case(lead=(2, 3), q_len=4, kv_len=6),
    "bool_mask_full": Case(mask="bool", mask_dims=(True, True, True, True)),
    "bool_mask_rows_only": Case(mask="bool", mask_dims=(False, False, True, False)),
    "bool_mask_keys_only": Case(mask="bool", mask_dims=(False, False, False, True), mask_rank=2),
    "float_mask_per_head": Case(mask="float", mask_dims=(False, True, True, True), mask_rank=3),
    "float_mask_per_batch": Case(lead=(2,), mask="float", mask_dims=(True, False, True, True)),
    "fully_masked_rows_bool": Case(mask="bool", fully_masked_rows=True, q_len=6, kv_len=9),
    "fully_masked_rows_float": Case(mask="float", fully_masked_rows=True, q_len=6, kv_len=9),
    "mask_and_causal": Case(mask="bool", causal=True, q_len=8, kv_len=12),
    "gqa_with_mask_per_head": Case(gqa_ratio=4, mask="bool", mask_dims=(True, True, True, True), lead=(2,)),
    "custom_scale": Case(scale=0.01),
    "fp16": Case(dtype="float16", q_len=20, kv_len=40),
    "bf16": Case(dtype="bfloat16", q_len=20, kv_len=40),
}


@every_kernel
@pytest.mark.parametrize("name", list(NAMED_CASES))
def test_named_case(kernel, name):
    case = NAMED_CASES[name]
    source = getattr(kernel, "source", None)
    if source and case.dtype != source:
        case = Case(**{**case.__dict__, "dtype": source})
    check_against_reference(kernel, case)


@every_kernel
def test_two_dim_inputs(kernel):
    """[L, E] inputs (no heads dimension), as SDPA accepts them."""
    check_against_reference(kernel, Case(lead=(), kv_heads=1, q_len=5, kv_len=8, extra={"two_dim": True}))


@every_kernel
def test_empty_query(kernel):
    case = Case(q_len=0, kv_len=5)
    inputs = case.build(TEST_DEVICE)
    problem_reasons = kernel.reasons(problem_of(inputs))
    if problem_reasons:
        pytest.skip("; ".join(problem_reasons))
    out = kernel(inputs.pop("query"), inputs.pop("key"), inputs.pop("value"), **inputs)
    assert out.shape == (1, 2, 0, 64)


@pytest.mark.parametrize("case", [Case(mask="bool", causal=True), Case(gqa_ratio=4), Case(mask="float", lead=(2,))], ids=str)
def test_reference_matches_pytorch_math_backend(case):
    """The float64 reference is PyTorch's math backend (so every kernel agrees with it too)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    inputs = case.build()
    inputs = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs.items()}
    if inputs["attn_mask"] is not None and inputs["is_causal"]:
        # The math backend refuses the pair; the reference combines them, like the fused CPU path.
        causal = torch.ones(case.q_len, case.kv_len, dtype=torch.bool).tril()
        inputs["attn_mask"] = inputs["attn_mask"] & causal
        inputs["is_causal"] = False
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(**inputs)
    ref = reference_attention(**inputs)
    assert relative_errors(ref, expected)[0] < 1e-12


@every_kernel
def test_no_keys_gives_zeros(kernel):
    """S = 0: every row is empty and SDPA returns zeros (a fused CPU kernel would crash the
    process on it, so no kernel may reach its operator)."""
    for case in (Case(q_len=3, kv_len=0), Case(q_len=3, kv_len=0, causal=True), Case(q_len=3, kv_len=0, mask="bool"),
                 Case(q_len=3, kv_len=0, mask="float", dtype="float16")):
        inputs = case.build(TEST_DEVICE)
        reasons = kernel.reasons(problem_of(inputs))
        if reasons:
            continue
        out = kernel(inputs.pop("query"), inputs.pop("key"), inputs.pop("value"), **inputs)
        assert out.shape == (1, 2, 3, 64) and torch.count_nonzero(out) == 0


@every_kernel
@pytest.mark.parametrize("mask_dtype", ["float32", "same"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_large_finite_mask_penalties_on_half_inputs(kernel, dtype, causal, mask_dtype):
    """Large finite penalties in a float mask (-1e5 overflows fp16; -65504 is what padding masks
    put in fp16): a row penalised everywhere attends by its scores, as SDPA does, not uniformly
    and not as zeros; with causality, the one key row 0 sees counts even if its penalty is huge."""
    if getattr(kernel, "source", None) not in (None, dtype):
        pytest.skip(f"{kernel.name} takes other inputs than {dtype}")
    if getattr(kernel, "target", None) == "float16" and dtype == "bfloat16" and mask_dtype == "same":
        pytest.skip("fp16 cannot hold bf16's lowest value: bf16->fp16 is lossy (accuracy policy) and blocks such rows")
    inputs = Case(dtype=dtype, q_len=4, kv_len=6).build(TEST_DEVICE)
    query, key, value = inputs["query"], inputs["key"], inputs["value"]
    big = -1e5 if mask_dtype == "float32" else torch.finfo(query.dtype).min
    mask = torch.zeros(1, 1, 4, 6, device=query.device, dtype=torch.float32 if mask_dtype == "float32" else query.dtype)
    mask[..., 0, 0] = big  # causal: the only key row 0 sees
    mask[..., 1, :] = big  # a whole row of finite penalties
    mask[..., 2, :3] = big
    mask[..., 3, 2] = float("-inf")
    problem = problem_of({**inputs, "attn_mask": mask, "is_causal": causal})
    if kernel.reasons(problem):
        pytest.skip("; ".join(kernel.reasons(problem)))
    out = kernel(query, key, value, attn_mask=mask, is_causal=causal)
    rel_l2, rel_max = relative_errors(out, reference_attention(query, key, value, attn_mask=mask, is_causal=causal))
    assert kernel.tolerance(problem).accepts(rel_l2, rel_max), f"{kernel.name}: relative L2 error {rel_l2:.2e} (max {rel_max:.2e})"


@pytest.mark.parametrize("mask", ["bool", "float"])
def test_sdpa_default_repairs_dead_rows_when_pytorch_does_not(monkeypatch, mask):
    """Where PyTorch's SDPA is not known to zero fully masked rows (every GPU; a CPU build whose
    probe says so), `sdpa_default` zeroes them itself."""
    from attn_dispatch.kernels.sdpa_default import default_zeroes_dead_rows

    assert not default_zeroes_dead_rows(torch.device("meta"), torch.float32, mask == "bool")  # GPUs alike
    monkeypatch.setattr("attn_dispatch.kernels.sdpa_default.default_zeroes_dead_rows", lambda device, dtype, bool_mask: False)
    check_against_reference(kernel_from_name("sdpa_default"), Case(mask=mask, fully_masked_rows=True))


def test_sdpa_default_dead_row_repair_keeps_gradients(monkeypatch):
    """The repair of a bool mask's fully masked rows (`torch.where`) passes gradients through the
    live rows and none through the dead ones, as the float64 reference does."""
    monkeypatch.setattr("attn_dispatch.kernels.sdpa_default.default_zeroes_dead_rows", lambda device, dtype, bool_mask: False)
    generator = torch.Generator().manual_seed(3)
    query, key, value = (torch.randn(2, 4, length, 16, generator=generator, dtype=torch.float64, requires_grad=True)
                         for length in (5, 7, 7))
    mask = torch.rand(5, 7, generator=generator) > 0.4
    mask[1] = False  # a fully masked row
    out = kernel_from_name("sdpa_default")(query, key, value, attn_mask=mask)
    grads = torch.autograd.grad(out.square().sum(), (query, key, value))
    copies = [t.detach().clone().requires_grad_() for t in (query, key, value)]
    expected = reference_attention(*copies, attn_mask=mask)
    expected_grads = torch.autograd.grad(expected.square().sum(), copies)
    torch.testing.assert_close(out, expected)
    assert torch.count_nonzero(out[:, :, 1]) == 0 and torch.count_nonzero(grads[0][:, :, 1]) == 0
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)
