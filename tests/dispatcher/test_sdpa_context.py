"""The caller's context before a decision (issue 13, `dispatcher.sdpa_context`): `sdpa_kernel`
restrictions, `CausalBias` objects, meta tensors, and the errors PyTorch gives."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from attn_dispatch.dispatcher import Dispatcher, patched, sdpa_context
from attn_dispatch.kernels import reference_attention, relative_errors

pytestmark = pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs")


def qkv(L=6, S=9, **kwargs):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, L, 16, generator=generator, **kwargs)
    k = torch.randn(1, 2, S, 16, generator=generator, **kwargs)
    v = torch.randn(1, 2, S, 16, generator=generator, **kwargs)
    return q, k, v


@pytest.mark.parametrize("make", [causal_upper_left, causal_lower_right])
@pytest.mark.parametrize("lengths", [(23, 56), (6, 6), (7, 3)])
def test_causal_bias_under_patched_is_exact(make, lengths):
    """The issue's repro: a bias under `patched()` read as a float mask gave errors of 0.85."""
    L, S = lengths
    q, k, v = qkv(L, S)
    offset = S - L if make is causal_lower_right else 0
    allowed = torch.ones(L, S, dtype=torch.bool).tril(diagonal=offset)
    with patched(Dispatcher(kernels="portable")) as ours:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=make(L, S))
        again = F.scaled_dot_product_attention(q, k, v, attn_mask=make(L, S))  # the warm path
    assert sum(ours.stats().values()) == 2
    for result in (out, again):
        assert relative_errors(result, reference_attention(q, k, v, attn_mask=allowed))[0] < 1e-5


def test_upper_and_lower_right_biases_get_separate_decisions():
    q, k, v = qkv(4, 10)
    ours = Dispatcher(kernels=["math", "sdpa_default"])
    upper = ours.attention(q, k, v, attn_mask=causal_upper_left(4, 10))
    lower = ours.attention(q, k, v, attn_mask=causal_lower_right(4, 10))
    assert not torch.allclose(upper, lower)
    assert ours.explain(q, k, v, attn_mask=causal_lower_right(4, 10)).problem.causal_alignment == "bottom_right"
    assert ours.explain(q, k, v, attn_mask=causal_upper_left(4, 10)).problem.causal_alignment == "top_left"


def test_causal_bias_with_is_causal_raises_value_error_like_pytorch():
    q, k, v = qkv(4, 10)
    for make in (causal_upper_left, causal_lower_right):
        with pytest.raises(ValueError):
            F.scaled_dot_product_attention(q, k, v, attn_mask=make(4, 10), is_causal=True)
        with pytest.raises(ValueError, match="CausalBias"):
            Dispatcher().attention(q, k, v, attn_mask=make(4, 10), is_causal=True)


def test_lower_right_bias_training_gets_pytorchs_gradients():
    q, k, v = (t.requires_grad_() for t in qkv(4, 10))
    out = Dispatcher(kernels="portable").attention(q, k, v, attn_mask=causal_lower_right(4, 10))
    out.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(4, 10)).sum().backward()
    for ours, theirs in zip(grads, (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_sdpa_kernel_restriction_gives_pytorchs_behaviour():
    """Under ``sdpa_kernel([MATH])`` the call is PyTorch's: its MATH backend refuses a mask with
    is_causal. Outside it, the dispatcher combines them (PyTorch's default CPU path does too)."""
    q, k, v = qkv(6, 6)
    mask = torch.ones(6, 6, dtype=torch.bool)
    ours = Dispatcher(kernels="portable")
    with sdpa_kernel([SDPBackend.MATH]):
        assert sdpa_context.backends_restricted()
        with pytest.raises(RuntimeError, match="is_causal"):
            ours.attention(q, k, v, attn_mask=mask, is_causal=True)
        out = ours.attention(q, k, v)
    assert not ours.stats(), "a restricted call went to one of our kernels"
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    combined = ours.attention(q, k, v, attn_mask=mask, is_causal=True)
    torch.testing.assert_close(combined, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert sum(ours.stats().values()) == 1


def _outcome(call):
    """What `call()` gives: ``(exception type, None)`` or ``(None, output)``."""
    try:
        return None, call()
    except Exception as error:  # noqa: BLE001 - the type is what is compared
        return type(error), None


@pytest.mark.filterwarnings("ignore:.*kernel not used because")
@pytest.mark.filterwarnings("ignore:All fused kernels requires")
@pytest.mark.parametrize("ignore", ["0", "1"], ids=["respected", "IGNORE_SDPA_KERNEL=1"])
@pytest.mark.parametrize("case", ["3d", "4d", "4d_under_math"])
def test_a_mask_with_is_causal_raises_or_combines_as_pytorch(case, ignore, monkeypatch):
    """New-user trial: a mask together with is_causal=True gives PyTorch's outcome for the same input,
    with or without ``ATTN_DISPATCH_IGNORE_SDPA_KERNEL=1``: RuntimeError where PyTorch takes its MATH
    backend (3-D inputs; inside ``sdpa_kernel([MATH])``, also from a plan made hot outside it), the
    combined result where its fused CPU backend runs it; through `attention`, the fast path and `patched()`."""
    generator = torch.Generator().manual_seed(0)
    lead = (5,) if case == "3d" else (5, 2)
    q = torch.randn(*lead, 4, 6, generator=generator)
    k, v = (torch.randn(*lead, 3, 6, generator=generator) for _ in range(2))
    mask = torch.ones(4, 3, dtype=torch.bool).tril()
    sdpa = torch._C._nn.scaled_dot_product_attention  # PyTorch's, never patched
    monkeypatch.setenv("ATTN_DISPATCH_IGNORE_SDPA_KERNEL", ignore)
    try:
        ours = Dispatcher()
        fast = ours.fast_attention
        calls = {"attention": lambda: ours.attention(q, k, v, attn_mask=mask, is_causal=True),
                 "fast path": lambda: fast(q, k, v, attn_mask=mask, is_causal=True)}
        with patched(ours):
            calls["patched"] = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
            if case == "4d_under_math":  # the plan made and hot outside the restriction first
                for call in calls.values():
                    call()
            with sdpa_kernel([SDPBackend.MATH]) if case == "4d_under_math" else contextlib.nullcontext():
                error, expected = _outcome(lambda: sdpa(q, k, v, mask, 0.0, True))
                assert (error is RuntimeError) is (case != "4d")
                for name, call in calls.items():
                    for _ in range(3):  # cold, then warm and hot
                        got_error, got = _outcome(call)
                        assert got_error is error, (name, got_error)
                        if error is None:
                            torch.testing.assert_close(got, expected)
    finally:
        monkeypatch.delenv("ATTN_DISPATCH_IGNORE_SDPA_KERNEL")
        sdpa_context.follow_environment()


def test_sdpa_kernel_restriction_opt_out():
    q, k, v = qkv()
    ours = Dispatcher(kernels=["math"])
    sdpa_context.respect_sdpa_kernel(False)
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            assert not sdpa_context.backends_restricted()
            ours.attention(q, k, v)
    finally:
        sdpa_context.respect_sdpa_kernel(None)  # back to following the environment
    assert ours.stats() == {"math": 1}
    with pytest.raises(TypeError):
        sdpa_context.respect_sdpa_kernel("no")


@pytest.fixture
def restrictions_ignored():
    sdpa_context.respect_sdpa_kernel(False)
    yield
    sdpa_context.respect_sdpa_kernel(None)  # back to following the environment


@pytest.mark.filterwarnings("ignore:.*kernel not used because")
@pytest.mark.filterwarnings("ignore:All fused kernels requires")
def test_a_failure_the_switches_caused_is_not_remembered_past_its_call(restrictions_ignored):
    """Restrictions ignored, a 3-D call under flash only fails in PyTorch's SDPA (a switch, not the
    problem): the call raises as PyTorch does, and a 4-D call of the same bucket, which PyTorch
    serves there, is served; after the context, the 3-D call runs PyTorch's default again."""
    ours = Dispatcher(kernels=["sdpa_default"])
    q3, q4 = torch.randn(2, 3, 8), torch.randn(1, 2, 3, 8)
    sdpa = torch._C._nn.scaled_dot_product_attention
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        with pytest.raises(RuntimeError):
            sdpa(q3, q3, q3)
        with pytest.raises(RuntimeError):
            ours.attention(q3, q3, q3)
        assert torch.equal(ours.attention(q4, q4, q4), sdpa(q4, q4, q4))
    assert torch.equal(ours.attention(q3, q3, q3), sdpa(q3, q3, q3))
    assert ours.stats() == {"sdpa_default": 2}


@pytest.mark.filterwarnings("ignore:.*kernel not used because")
@pytest.mark.filterwarnings("ignore:All fused kernels requires")
def test_under_switches_our_own_kernel_serves_the_call_and_the_default_comes_back(restrictions_ignored):
    ours = Dispatcher(kernels=["sdpa_default", "math"])
    q3 = torch.randn(2, 3, 8, dtype=torch.float64)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = ours.attention(q3, q3, q3)
    assert max(relative_errors(out, reference_attention(q3, q3, q3))) < 1e-12
    assert ours.stats() == {"math": 1}
    ours.attention(q3, q3, q3)
    assert ours.stats() == {"math": 1, "sdpa_default": 1}


def test_meta_tensors_give_meta_output_without_warnings():
    q = torch.empty(2, 4, 16, 8, device="meta")
    ours = Dispatcher()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = ours.attention(q, q, q, is_causal=True)
    assert out.device.type == "meta" and out.shape == (2, 4, 16, 8)
    assert not ours._cold.planners  # no ranking, no table, no memory query


@pytest.mark.parametrize("shapes", [
    ((0, 2, 3, 8), (0, 2, 4, 8), (0, 2, 4, 8)),
    ((1, 2, 3, 0), (1, 2, 4, 0), (1, 2, 4, 5)),
    ((1, 2, 3, 8), (1, 2, 0, 8), (1, 2, 0, 8)),
], ids=["batch_0", "head_dim_0", "kv_len_0"])
def test_empty_shapes_through_the_dispatcher(shapes):
    q, k, v = (torch.randn(shape) for shape in shapes)
    q.requires_grad_()
    out = Dispatcher(kernels="portable").attention(q, k, v)
    torch.testing.assert_close(out.detach(), F.scaled_dot_product_attention(q.detach(), k, v))
    out.sum().backward()
    assert q.grad.shape == q.shape


def test_complex_inputs_raise_not_implemented_error():
    q = torch.randn(1, 2, 3, 8, dtype=torch.complex64)
    with pytest.raises(NotImplementedError):
        Dispatcher().attention(q, q, q)


def test_fused_backend_backward_with_mask():
    """R6: the fused backends' dead-row zeroing wrote into the operator's saved output."""
    q = torch.randn(1, 1, 4, 8, requires_grad=True)
    mask = torch.randn(4, 4)
    Dispatcher(kernels=["sdpa_flash"]).attention(q, q, q, attn_mask=mask).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_nested_tensors_run_pytorchs_sdpa(layout):
    """Variable-length batches as `torch.nested` tensors: PyTorch's SDPA has kernels for them, ours
    take one shape; the dispatcher hands them over (under `patched()` too)."""
    generator = torch.Generator().manual_seed(0)
    parts = [torch.randn(length, 4, 32, generator=generator) for length in (5, 7)]
    nested = torch.nested.nested_tensor(parts, layout=layout).transpose(1, 2)
    if layout == torch.strided:  # PyTorch's strided nested SDPA takes contiguous components only
        nested = torch.nested.nested_tensor([p.transpose(0, 1).contiguous() for p in parts], layout=layout)
    expected = F.scaled_dot_product_attention(nested, nested, nested)
    ours = Dispatcher()
    out = ours.attention(nested, nested, nested)
    with patched(ours):
        patched_out = F.scaled_dot_product_attention(nested, nested, nested)
    for got in (out, patched_out):
        for a, b in zip(got.unbind(), expected.unbind(), strict=True):
            torch.testing.assert_close(a, b)
    assert ours.stats() == {}
    with pytest.raises(NotImplementedError, match="nested tensors"):
        ours.explain(nested, nested, nested)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_a_dense_query_with_nested_key_and_value_raises_pytorchs_error(layout):
    query = torch.randn(2, 2, 3, 8)
    nested = torch.nested.nested_tensor([torch.randn(2, 3, 8), torch.randn(2, 3, 8)], layout=layout)
    with pytest.raises(Exception) as theirs:
        F.scaled_dot_product_attention(query, nested, nested)
    with pytest.raises(type(theirs.value)) as ours:
        Dispatcher().attention(query, nested, nested)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("flag", ["is_causal", "enable_gqa"])
@pytest.mark.parametrize("value", [1, 0, None, "yes", torch.tensor(True)])
def test_a_flag_that_is_not_a_bool_raises_pytorchs_type_error_even_when_warm(flag, value):
    q, k, v = qkv()
    ours = Dispatcher(kernels=["math"])
    for _ in range(3):  # planned, then warm and hot with True/False
        ours.attention(q, k, v, **{flag: False})
    with pytest.raises(TypeError, match=f"argument '{flag}'.* must be bool"):
        F.scaled_dot_product_attention(q, k, v, **{flag: value})
    with pytest.raises(TypeError, match=f"argument '{flag}'.* must be bool"):  # PyTorch's own message
        ours.attention(q, k, v, **{flag: value})
    assert ours.stats() == {"math": 3}


@pytest.mark.parametrize("which", ["query", "key", "mask"])
def test_a_sparse_tensor_gets_pytorchs_error_and_leaves_the_bucket_untouched(which):
    q, k, v = qkv(6, 6)
    mask = torch.ones(6, 6, dtype=torch.bool) if which == "mask" else None
    args = {"query": q.to_sparse() if which == "query" else q, "key": k.to_sparse() if which == "key" else k,
            "value": v, "attn_mask": mask.to_sparse() if which == "mask" else mask}
    ours = Dispatcher()
    with pytest.raises(Exception) as theirs:
        F.scaled_dot_product_attention(**args)
    with pytest.raises(type(theirs.value)):
        ours.attention(**args)
    torch.testing.assert_close(ours.attention(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert not ours._cold.state(q.device).failures, "a sparse call was remembered against the bucket's kernels"
