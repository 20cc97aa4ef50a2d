"""The warm path's shortcut (`Kernel.runner`): the fused backends' bare ATen call gives what `run`
gives. The CUDA operators are stood in for by PyTorch's SDPA on the CPU, so the shortcut's own
logic (GQA folded into rows or passed natively, causality, the fall-back to `run`) is what runs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from attn_dispatch.kernels import Problem, SdpaDefaultKernel, SdpaEfficientKernel, SdpaFlashKernel


def _stand_in(query, key, value, causal, scale):
    return F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scale,
                                          enable_gqa=query.shape[1] != key.shape[1])


def _inputs(q_heads, kv_heads, q_len, kv_len, dim=16, batch=2):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(batch, heads, length, dim, generator=generator)
            for heads, length in ((q_heads, q_len), (kv_heads, kv_len), (kv_heads, kv_len))]


@pytest.mark.parametrize(("kernel_type", "native"), [(SdpaFlashKernel, True), (SdpaFlashKernel, False),
                                                     (SdpaEfficientKernel, False)])
@pytest.mark.parametrize(("q_heads", "kv_heads", "q_len", "kv_len", "causal"),
                         [(4, 4, 5, 9, True), (8, 2, 1, 33, False), (8, 2, 3, 17, False), (8, 2, 6, 6, True)])
def test_the_bare_call_gives_what_run_gives(monkeypatch, kernel_type, native, q_heads, kv_heads, q_len, kv_len, causal):
    kernel = kernel_type()
    monkeypatch.setattr(kernel, "_bare_op", lambda device_type="cuda": _stand_in)
    monkeypatch.setattr(kernel, "native_gqa", lambda device_type, dtype: native)
    query, key, value = _inputs(q_heads, kv_heads, q_len, kv_len)
    problem = replace(Problem.from_tensors(query, key, value, None, causal, q_heads != kv_heads), device_type="cuda")
    runner = kernel.runner(problem)
    repeats_kv = q_heads != kv_heads and causal and not native  # K/V copied per group: `run` does it
    assert (runner == kernel.run) == repeats_kv
    if repeats_kv:
        return
    out = runner(query, key, value, None, None, q_heads != kv_heads, problem)
    expected = F.scaled_dot_product_attention(query, key, value, is_causal=causal, enable_gqa=q_heads != kv_heads)
    torch.testing.assert_close(out, expected)


def test_masks_and_backends_with_no_operator_on_the_device_keep_run(monkeypatch):
    kernel = SdpaFlashKernel()
    monkeypatch.setattr(kernel, "_bare_op", lambda device_type="cuda": _stand_in)
    query, key, value = _inputs(4, 4, 5, 9)
    plain = replace(Problem.from_tensors(query, key, value), device_type="cuda")
    assert kernel.runner(replace(plain, mask_kind="bool", mask_shape=(1, 1, 5, 9))) == kernel.run
    assert kernel.bare_call(replace(plain, mask_kind="bool", mask_shape=(1, 1, 5, 9))) is None
    efficient = SdpaEfficientKernel()
    assert efficient.bare_call(replace(plain, device_type="cpu")) is None  # no CPU operator
    assert efficient.runner(replace(plain, device_type="cpu")) == efficient.run


@pytest.mark.parametrize(("q_heads", "kv_heads", "q_len", "kv_len", "causal", "scale"),
                         [(4, 4, 5, 9, True, None), (8, 2, 1, 33, False, 0.3), (8, 2, 3, 17, False, None)])
def test_the_cpu_flash_operator_called_bare_gives_what_run_gives(q_heads, kv_heads, q_len, kv_len, causal, scale):
    """PyTorch's fused CPU flash operator, really called (no stand-in), GQA native or folded."""
    kernel = SdpaFlashKernel()
    query, key, value = _inputs(q_heads, kv_heads, q_len, kv_len)
    problem = Problem.from_tensors(query, key, value, None, causal, q_heads != kv_heads)
    bare = kernel.bare_call(problem)
    assert bare is not None and bare.op == "flash_cpu"
    runner = kernel.runner(problem)
    assert runner != kernel.run
    torch.testing.assert_close(runner(query, key, value, None, scale, q_heads != kv_heads, problem),
                               kernel.run(query, key, value, None, scale, q_heads != kv_heads, problem),
                               rtol=0, atol=0)


def test_strided_inputs_take_the_bare_call_where_their_last_dim_is_dense(monkeypatch):
    """A slice of a KV cache (decode) goes straight to the operator; a transposed last dim goes
    through `run`, which makes it dense first."""
    kernel = SdpaFlashKernel()
    calls = []
    monkeypatch.setattr(kernel, "_bare_op", lambda device_type="cuda": lambda *args: calls.append(1) or _stand_in(*args))
    monkeypatch.setattr(kernel, "native_gqa", lambda device_type, dtype: True)
    query, cache_k, cache_v = _inputs(8, 2, 1, 40)
    key, value = cache_k[:, :, :33], cache_v[:, :, :33]  # the first 33 of 40 cached positions
    problem = replace(Problem.from_tensors(query, key, value, None, False, True), device_type="cuda")
    assert problem.strided
    runner = kernel.runner(problem)
    expected = F.scaled_dot_product_attention(query, key, value, enable_gqa=True)
    torch.testing.assert_close(runner(query, key, value, None, None, True, problem), expected)
    assert calls == [1]
    transposed = value.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, last dim strided
    monkeypatch.setattr(kernel, "_call_op", lambda q, k, v, bias, causal, scale: _stand_in(q, k, v, causal, scale))
    torch.testing.assert_close(runner(query, key, transposed, None, None, True, problem), expected)
    assert calls == [1]  # through `run`


def test_sdpa_default_without_a_mask_calls_pytorch_directly():
    query, key, value = _inputs(8, 2, 1, 33)
    problem = Problem.from_tensors(query, key, value, None, False, True)
    kernel = SdpaDefaultKernel()
    runner = kernel.runner(problem)
    assert runner != kernel.run
    torch.testing.assert_close(runner(query, key, value, None, None, True, problem),
                               F.scaled_dot_product_attention(query, key, value, enable_gqa=True))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_default_with_a_mask_on_the_cpu_calls_pytorch_directly_where_pytorch_zeroes_dead_rows(monkeypatch, kind):
    from attn_dispatch.kernels import sdpa_default

    query, key, value = _inputs(8, 2, 5, 33)
    mask = torch.rand(5, 33, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[2] = False  # a fully masked row
    if kind == "float":
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    problem = Problem.from_tensors(query, key, value, mask, False, True)
    kernel = SdpaDefaultKernel()
    monkeypatch.setattr(sdpa_default, "default_zeroes_dead_rows", lambda device, dtype, bool_mask: True)
    runner = kernel.runner(problem)
    assert runner != kernel.run
    torch.testing.assert_close(runner(query, key, value, mask, None, True, problem),
                               kernel.run(query, key, value, mask, None, True, problem))
    monkeypatch.setattr(sdpa_default, "default_zeroes_dead_rows", lambda device, dtype, bool_mask: False)
    assert kernel.runner(problem) == kernel.run  # PyTorch's rows need the repair: `run` makes it
    causal = Problem.from_tensors(query, key, value, mask, True, True)
    assert kernel.runner(causal) == kernel.run  # mask and causality combined by `run`


def _direct(call, query, key, value, mask, scale):
    takes_mask, is_causal, enable_gqa = call
    return torch._C._nn.scaled_dot_product_attention(query, key, value, mask if takes_mask else None,
                                                     is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


@pytest.mark.parametrize(("q_heads", "kv_heads", "q_len", "mask_rows", "causal", "scale"),
                         [(8, 2, 1, None, False, None), (4, 4, 5, None, True, 0.3), (8, 2, 5, 5, False, None),
                          (4, 4, 5, 5, False, 0.7)])
def test_sdpa_default_names_the_one_call_that_runs_it(monkeypatch, q_heads, kv_heads, q_len, mask_rows, causal, scale):
    """`sdpa_call`'s flags, given the call's tensors and scale, give what `run` gives."""
    from attn_dispatch.kernels import sdpa_default

    monkeypatch.setattr(sdpa_default, "default_zeroes_dead_rows", lambda device, dtype, bool_mask: True)
    query, key, value = _inputs(q_heads, kv_heads, q_len, 33)
    mask = None if mask_rows is None else torch.rand(mask_rows, 33, generator=torch.Generator().manual_seed(2)) > 0.3
    problem = Problem.from_tensors(query, key, value, mask, causal, q_heads != kv_heads)
    kernel = SdpaDefaultKernel()
    call = kernel.sdpa_call(problem)
    assert call == (mask is not None, causal, q_heads != kv_heads)
    torch.testing.assert_close(_direct(call, query, key, value, mask, scale),
                               kernel.run(query, key, value, mask, scale, q_heads != kv_heads, problem))


def test_sdpa_call_is_none_where_run_does_more_than_one_call(monkeypatch):
    """A mask PyTorch's rows need repairing for, a mask with causality, broadcast inputs,
    bottom-right causality: `run` (or the runner) handles them. Other kernels never name such a
    call. A mask of one query row (a decode step's) is PyTorch's call; a 1-D mask is the same
    problem, and only its plan knows to leave it to `run` (`dispatcher.plans.Plan`)."""
    from torch.nn.attention.bias import causal_lower_right

    from attn_dispatch.kernels import MathKernel, sdpa_default

    monkeypatch.setattr(sdpa_default, "default_zeroes_dead_rows", lambda device, dtype, bool_mask: True)
    kernel = SdpaDefaultKernel()
    query, key, value = _inputs(4, 4, 5, 9)
    rows = torch.rand(5, 9, generator=torch.Generator().manual_seed(3)) > 0.3
    for one_row in (rows[0], rows[:1]):
        assert kernel.sdpa_call(Problem.from_tensors(query, key, value, one_row)) == (True, False, False)
    cases = {
        "mask and causality": Problem.from_tensors(query, key, value, rows, True),
        "broadcast inputs": Problem.from_tensors(query, key[:1], value[:1]),
        "bottom-right causality": Problem.from_tensors(query, key, value, causal_lower_right(5, 9)),
    }
    assert {name: kernel.sdpa_call(problem) for name, problem in cases.items()} == dict.fromkeys(cases)
    monkeypatch.setattr(sdpa_default, "default_zeroes_dead_rows", lambda device, dtype, bool_mask: False)
    assert kernel.sdpa_call(Problem.from_tensors(query, key, value, rows)) is None
    assert MathKernel().sdpa_call(Problem.from_tensors(query, key, value)) is None
