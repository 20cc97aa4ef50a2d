"""Under `torch.autocast` the dispatcher's kernels see what PyTorch's SDPA sees: floating inputs
(not float64) cast to autocast's dtype, the output in that dtype (`dispatcher.sdpa_context`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher.hot_path import HOT_AFTER


def _inputs(dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 4, n, 16, generator=generator).to(dtype) for n in (6, 10, 10))


@pytest.mark.parametrize("kernels", [["math"], ["chunked[q=4,kv=4]"], "portable", "all"])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
def test_under_autocast_the_output_is_pytorchs(kernels, mask):
    q, k, v = _inputs()
    attn_mask = {None: None, "bool": torch.rand(6, 10, generator=torch.Generator().manual_seed(1)) > 0.3,
                 "float": torch.randn(6, 10, generator=torch.Generator().manual_seed(2))}[mask]
    ours = Dispatcher(kernels=kernels)
    with torch.no_grad():
        for _ in range(HOT_AFTER + 1):  # plans of the float32 call go hot outside autocast first
            ours.attention(q, k, v, attn_mask=attn_mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            outs = [ours.attention(q, k, v, attn_mask=attn_mask) for _ in range(HOT_AFTER + 2)]
        after = ours.attention(q, k, v, attn_mask=attn_mask)
    assert expected.dtype == torch.bfloat16
    for out in outs:
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
    assert after.dtype == torch.float32  # outside autocast again: the float32 plan


def test_float64_inputs_are_not_cast_and_a_mixed_call_raises_pytorchs_error():
    q, k, v = _inputs(torch.float64)
    ours = Dispatcher(kernels=["math"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ours.attention(q, k, v).dtype == torch.float64
        with pytest.raises(RuntimeError, match="same dtype"):
            F.scaled_dot_product_attention(q.float(), k, v)
        with pytest.raises(RuntimeError, match="same dtype"):
            ours.attention(q.float(), k, v)


def test_training_under_autocast_gives_gradients_in_the_leaves_dtype():
    q, k, v = (t.requires_grad_() for t in _inputs())
    ours = Dispatcher(kernels=["math"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ours.attention(q, k, v)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.float32


def test_explain_under_autocast_explains_the_call_attention_runs():
    q, k, v = _inputs()
    ours = Dispatcher(kernels=["math", "sdpa_default"])
    assert ours.explain(q, k, v).problem.dtype == "float32"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ours.explain(q, k, v).problem.dtype == "bfloat16"
