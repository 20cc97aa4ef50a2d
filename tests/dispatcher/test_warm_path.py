"""The warm path's shortcuts: a plan that is one call of PyTorch's SDPA is called in place (same
result as PyTorch, counted, and a failure there still falls back), and the compile check reads
what `torch.compiler.is_compiling()` reads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attn_dispatch.dispatcher import Dispatcher, core
from attn_dispatch.dispatcher.compiled import compiling_readers
from attn_dispatch.kernels.sdpa_backends import TORCH_HAS_ENABLE_GQA
from tests.dispatcher.helpers import FixedRanker, qkv, use_ranking


@pytest.mark.parametrize("arguments", [{}, {"is_causal": True}, {"scale": 0.25}, {"mask": True}])
def test_the_in_place_call_gives_pytorchs_result_and_is_counted(arguments):
    inputs = qkv(q_len=8, kv_len=8)
    if arguments.pop("mask", False):
        inputs["attn_mask"] = torch.rand(8, 8, generator=torch.Generator().manual_seed(4)) > 0.3
    ours = Dispatcher(kernels=["sdpa_default"])
    with torch.inference_mode():
        outs = [ours.attention(**inputs, **arguments) for _ in range(3)]  # cold, then warm
    expected = F.scaled_dot_product_attention(**inputs, **arguments)
    for out in outs:
        torch.testing.assert_close(out, expected)
    assert ours.stats() == {"sdpa_default": 3}
    if "attn_mask" not in inputs and TORCH_HAS_ENABLE_GQA:  # no mask: always the one call
        assert next(iter(ours._plans.values())).sdpa_call is not None


def test_a_failure_of_the_in_place_call_falls_back(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["sdpa_default", "math"]))
    inputs = qkv()
    ours = Dispatcher(kernels=["sdpa_default", "math"])
    ours.attention(**inputs)  # planned: sdpa_default, called in place
    assert next(iter(ours._plans.values())).sdpa_call is not None

    def failing(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(core, "_sdpa", failing)
    torch.testing.assert_close(ours.attention(**inputs), F.scaled_dot_product_attention(**inputs))
    assert "injected failure" in ours.explain(**inputs).reason_dropped("sdpa_default")
    assert ours.stats() == {"sdpa_default": 1, "math": 1}


def test_the_compile_check_reads_what_is_compiling_reads(monkeypatch):
    dynamo_compiling, flags = compiling_readers()
    assert (dynamo_compiling() or flags._is_compiling_flag) is torch.compiler.is_compiling() is False
    if flags is torch.compiler:  # non-strict export sets the flag: both see it
        monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
        assert (dynamo_compiling() or flags._is_compiling_flag) is torch.compiler.is_compiling() is True
