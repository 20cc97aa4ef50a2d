"""A sparse or mkldnn tensor whose shape, dtype and device match a warm plan's (the plan's key
reads no layout) gets PyTorch's outcome and leaves the plan's bucket untouched: before the fix,
each kernel of the set failed on it in turn and was remembered as failing for the size, so every
later dense call of that size raised NoKernelError."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher.hot_path import HOT_AFTER

CONVERSIONS = {"coo": torch.Tensor.to_sparse, "mkldnn": torch.Tensor.to_mkldnn}


def _outcome(call):
    """``("ok", output)`` or ``("raised", exception type)``."""
    try:
        return ("ok", call())
    except Exception as error:  # noqa: BLE001 - the outcome is what is compared
        return ("raised", type(error))


@pytest.mark.parametrize("calls_before", [1, HOT_AFTER + 1])  # warm (dict path) and hot
@pytest.mark.parametrize("position", ["query", "key", "value", "mask"])
@pytest.mark.parametrize("conversion", sorted(CONVERSIONS))
def test_a_non_strided_tensor_of_a_warm_shape_gets_pytorchs_outcome_and_keeps_the_bucket(
        conversion, position, calls_before):
    generator = torch.Generator().manual_seed(0)
    arguments = {name: torch.randn(2, 2, 5, 8, generator=generator) for name in ("query", "key", "value")}
    arguments["attn_mask"] = torch.zeros(5, 5) if position == "mask" else None
    ours = Dispatcher(kernels=["math", "sdpa_default"])
    with torch.no_grad():
        for _ in range(calls_before):
            ours.attention(**arguments)
        odd = dict(arguments)
        name = "attn_mask" if position == "mask" else position
        odd[name] = CONVERSIONS[conversion](arguments[name])
        theirs, mine = _outcome(lambda: F.scaled_dot_product_attention(**odd)), _outcome(lambda: ours.attention(**odd))
        assert mine[0] == theirs[0]
        if theirs[0] == "raised":
            assert mine[1] is theirs[1]
        else:
            torch.testing.assert_close(mine[1].to_dense(), theirs[1].to_dense())
        assert not ours._cold.state(torch.device("cpu")).failures, "a non-strided call was remembered against the bucket"
        torch.testing.assert_close(ours.attention(**arguments), F.scaled_dot_product_attention(**arguments))
