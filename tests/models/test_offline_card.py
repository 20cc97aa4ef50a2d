"""A card's recorded answers off the card (`bench.offline_card`, `assume_backends_available(card)`)."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.kernels.assumed_backends import assume_backends_available
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_backends import FORCED_BACKENDS
from attn_dispatch.kernels.sdpa_default import SdpaDefaultKernel, default_backend_choice
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.priors import kernel_named
from bench.offline_card import H200_TORCH_2_11, offline_card_for

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="off the card only: a GPU answers for itself")

BUNDLED_H200 = "models/tables/nvidia-h200-140gb.json"


def cuda_problem(**overrides) -> Problem:
    fields = dict(batch=2, q_heads=32, kv_heads=8, q_len=16, kv_len=4096, head_dim=128, value_dim=128,
                  dtype="bfloat16", causal=False, device_type="cuda")
    fields.update(overrides)
    return Problem(**fields)


def h200_identity(torch_version: str = "2.11.0+cu130") -> DeviceIdentity:
    return DeviceIdentity(device_type="cuda", name="NVIDIA H200", vendor="NVIDIA", arch="sm_90", compute_units=132,
                          memory_bytes=150109880320, torch_version=torch_version, cuda_version="13.0",
                          driver="580.159.04")


def test_the_recorded_card_answers_pytorchs_backend_choice():
    with assume_backends_available(H200_TORCH_2_11):
        assert default_backend_choice(cuda_problem()) == "sdpa_cudnn"
        assert default_backend_choice(cuda_problem(dtype="float16", mask_kind="bool", mask_shape=(1, 1, 16, 4096))) == "sdpa_cudnn"
        assert default_backend_choice(cuda_problem(dtype="float32")) == "sdpa_math"  # GQA: efficient takes none
        assert default_backend_choice(cuda_problem(dtype="float32", kv_heads=32)) == "sdpa_efficient"
    with assume_backends_available():
        assert default_backend_choice(cuda_problem()) == "sdpa_math"  # nobody to ask


def test_a_kind_the_card_did_not_record_falls_back_to_the_unasked_answer():
    with assume_backends_available(H200_TORCH_2_11):
        assert default_backend_choice(cuda_problem(value_dim=64)) == "sdpa_math"


def test_sdpa_defaults_workspace_follows_the_recorded_backend():
    problem = cuda_problem(kv_heads=32)
    with assume_backends_available():
        unasked = SdpaDefaultKernel().workspace_bytes(problem)
    with assume_backends_available(H200_TORCH_2_11):
        recorded = SdpaDefaultKernel().workspace_bytes(problem)
        assert recorded == FORCED_BACKENDS["sdpa_cudnn"]().workspace_bytes(problem)
    assert recorded < unasked  # the math backend's score matrix is gone


def test_a_probe_that_failed_on_the_card_bars_the_kernel_off_the_card():
    flash = kernel_named("sdpa_flash")
    rectangle, square = cuda_problem(causal=True), cuda_problem(causal=True, q_len=4096)
    with assume_backends_available(H200_TORCH_2_11):
        assert flash.reasons(rectangle)
        assert not flash.reasons(square)
    with assume_backends_available():
        assert not flash.reasons(rectangle)


def test_an_inner_block_without_a_card_keeps_the_outer_card():
    with assume_backends_available(H200_TORCH_2_11):
        with assume_backends_available():
            assert default_backend_choice(cuda_problem()) == "sdpa_cudnn"
        assert default_backend_choice(cuda_problem()) == "sdpa_cudnn"
    with assume_backends_available():
        assert default_backend_choice(cuda_problem()) == "sdpa_math"


def test_the_card_is_found_by_device_and_torch_version():
    assert offline_card_for(h200_identity()) is H200_TORCH_2_11
    assert offline_card_for(h200_identity("2.12.0+cu130")) is None
    assert offline_card_for(DeviceIdentity.cpu()) is None
