"""The warm path's shortcuts: a plan that is one call of PyTorch's SDPA is called in place (same
result as PyTorch, counted, only the keywords that are not defaults, and a failure there still
falls back), the compile check reads what `torch.compiler.is_compiling()` reads, and meta queries,
found where the key misses, keep no plan."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from attn_dispatch.dispatcher import Dispatcher, core
from attn_dispatch.dispatcher.compiled import compiling_readers
from attn_dispatch.dispatcher.plans import mask_ndim_of, sdpa_flags
from attn_dispatch.kernels import Problem
from attn_dispatch.kernels.sdpa_backends import TORCH_HAS_ENABLE_GQA, pytorch_sdpa
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


@pytest.mark.skipif(not TORCH_HAS_ENABLE_GQA, reason="no in-place call on torch < 2.5")
@pytest.mark.parametrize(("heads", "arguments", "keywords"), [
    (2, {}, {}),
    (2, {"scale": 0.25}, {"scale": 0.25}),
    (2, {"is_causal": True}, {"is_causal": True}),
    (4, {"enable_gqa": True}, {"enable_gqa": True}),
    (2, {"enable_gqa": True}, {}),  # equal head counts: PyTorch's call without the flag, as `runner` makes it
])
def test_the_in_place_call_passes_only_the_keywords_that_are_not_defaults(monkeypatch, heads, arguments, keywords):
    inputs = qkv(heads=heads, kv_heads=2)
    inputs.pop("enable_gqa")
    seen = []

    def recording(*args, **kwargs):
        seen.append((len(args), kwargs))
        return pytorch_sdpa(*args, **kwargs)

    ours = Dispatcher(kernels=["sdpa_default"])
    with torch.inference_mode():
        ours.attention(**inputs, **arguments)  # cold: planned
        monkeypatch.setattr(core, "_sdpa", recording)
        out = ours.attention(**inputs, **arguments)  # warm: the in-place call
    assert seen == [(4, keywords)]  # query, key, value and the mask (None) positionally
    torch.testing.assert_close(out, F.scaled_dot_product_attention(**inputs, **arguments))


def test_sdpa_flags_are_the_flags_that_are_on_where_the_mask_is_passed_as_given():
    unmasked = Problem(1, 2, 2, 8, 8, 16, 16, "float32")
    masked = replace(unmasked, mask_kind="bool", mask_shape=(1, 1, 8, 8))
    assert sdpa_flags(None, unmasked) is None
    assert sdpa_flags((False, False, False), unmasked) == {}
    assert sdpa_flags((False, True, True), unmasked) == {"is_causal": True, "enable_gqa": True}
    assert sdpa_flags((True, False, False), masked) == {}
    # a call that drops the problem's mask, or takes one the problem lacks, runs through `run`
    assert sdpa_flags((False, False, False), masked) is None
    assert sdpa_flags((True, False, False), unmasked) is None


@pytest.mark.filterwarnings("ignore:could not identify meta")
def test_meta_calls_go_to_pytorch_even_after_explain_planned_them():
    """`attention` finds a meta query where its key misses, so no meta plan is ever kept (not
    even the one `explain` makes), and every meta call is PyTorch's, uncounted."""
    inputs = {name: tensor.to("meta") for name, tensor in qkv(heads=2).items() if name != "enable_gqa"}
    ours = Dispatcher(kernels=["sdpa_default", "math"])
    assert ours.explain(**inputs).device == "meta"
    for _ in range(2):
        out = ours.attention(**inputs)
        assert out.device.type == "meta" and out.shape == inputs["query"].shape
    prepared = ours.plan(**inputs)
    assert prepared(inputs["query"], inputs["key"], inputs["value"]).device.type == "meta"
    assert len(ours._plans) == 0 and ours.stats() == {}  # a prepared meta call is not counted either
    with torch.enable_grad():  # the training route too
        query = inputs["query"].requires_grad_()
        assert ours.attention(query, inputs["key"], inputs["value"]).device.type == "meta"
    assert len(ours._plans) == 0 and ours.stats() == {}


@pytest.mark.parametrize("mixed", ["key", "value"])
def test_a_warm_plan_still_refuses_mixed_devices_and_dtypes(mixed):
    """A plan warm for CPU inputs is not reached by a call with the key or value on another device
    (meta) or of another dtype: the call raises SDPA's RuntimeError, uncounted, and records no
    kernel failure (the next good call still runs PyTorch's SDPA in place)."""
    inputs = qkv()
    ours = Dispatcher(kernels=["sdpa_default", "math"])
    with torch.inference_mode():
        ours.attention(**inputs)
        for changed in (inputs[mixed].to("meta"), inputs[mixed].double()):
            with pytest.raises(RuntimeError):
                ours.attention(**{**inputs, mixed: changed})
            with pytest.raises(RuntimeError):
                F.scaled_dot_product_attention(**{**inputs, mixed: changed})
        torch.testing.assert_close(ours.attention(**inputs), F.scaled_dot_product_attention(**inputs))
    assert ours.stats() == {"sdpa_default": 2}
    assert ours.explain(**inputs).kernel == "sdpa_default"
    assert not ours.explain(**inputs).reason_dropped("sdpa_default")


@pytest.mark.skipif(not TORCH_HAS_ENABLE_GQA, reason="no in-place call before torch 2.5")
@pytest.mark.parametrize("dtype", ["bool", "float"])
def test_a_decode_steps_mask_is_called_in_place_and_a_1d_mask_is_left_to_run(monkeypatch, dtype):
    """A (B, 1, 1, S) mask (a decode step's padding) is PyTorch's own call; a 1-D mask is the same
    `Problem`, which PyTorch's SDPA refuses (IndexError): its plan makes no in-place call."""
    from attn_dispatch.kernels import sdpa_default

    monkeypatch.setattr(sdpa_default, "default_zeroes_dead_rows", lambda device, dtype, bool_mask: True)
    inputs = qkv(q_len=1, kv_len=40)
    generator = torch.Generator().manual_seed(5)
    row = torch.rand(40, generator=generator) > 0.3 if dtype == "bool" else torch.randn(40, generator=generator)
    ours = Dispatcher(kernels=["sdpa_default"])
    expected = F.scaled_dot_product_attention(**inputs, attn_mask=row.view(1, 1, 1, 40))
    with torch.inference_mode():
        for mask in (row.view(1, 1, 1, 40), row):
            outs = [ours.attention(**inputs, attn_mask=mask) for _ in range(3)]
            for out in outs:
                torch.testing.assert_close(out, expected, rtol=0, atol=0)
    plans = {plan.problem.mask_shape: plan for plan in ours._plans.values()}
    assert len(ours._plans) == 2 and len(plans) == 1  # one problem, two plans (the mask's shape is in the key)
    by_ndim = {mask_ndim_of(key): ours._plans.get(key) for key in ours._plans}
    assert by_ndim[4].sdpa_flags is not None and by_ndim[1].sdpa_flags is None
