"""Under `torch.autocast` a `CausalBias` mask (`causal_lower_right`, `causal_upper_left`) is no
tensor to cast: PyTorch's SDPA gives a result in autocast's dtype, and so must the dispatcher
(before the fix, casting the bias made a `CausalBias` without its lengths: AttributeError)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from attn_dispatch.dispatcher import Dispatcher


@pytest.mark.parametrize("kernels", [["math"], "all"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("make_bias", [causal_lower_right, causal_upper_left])
def test_a_causal_bias_under_autocast_gets_pytorchs_result(kernels, dtype, make_bias):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=generator) for n in (3, 7, 7))
    ours = Dispatcher(kernels=kernels)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        expected = F.scaled_dot_product_attention(q, k, v, make_bias(3, 7))
        out = ours.attention(q, k, v, make_bias(3, 7))
    assert out.dtype == expected.dtype == dtype
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
