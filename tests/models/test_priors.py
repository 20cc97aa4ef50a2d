"""Card specs and the analytic prior (the ranker of a card nobody calibrated)."""

from __future__ import annotations

import math

import pytest

from attn_dispatch.kernels import Problem, all_kernels, kernel_from_name, portable_kernels
from attn_dispatch.models.identity import (
    H100_PCIE,
    H100_SXM,
    H200,
    KNOWN_CARDS,
    MI50_16GB,
    MI50_32GB,
    MI60,
    RADEON_VII,
    DeviceIdentity,
    spec_for,
)
from attn_dispatch.models.priors import PriorRanker, Ranker, prior_seconds, roofline_seconds
from attn_dispatch.models.probe_store import FALLBACK_CPU_SPEC, probe_cpu_spec
from tests.models.conftest import fake_identity


def test_spec_for_faked_cards():
    assert spec_for(fake_identity("mi50_16")) is MI50_16GB
    assert spec_for(fake_identity("mi50_32")) is MI50_32GB
    assert spec_for(fake_identity("mi60")) is MI60
    assert spec_for(fake_identity("radeon_vii")) is RADEON_VII
    assert spec_for(fake_identity("h200")).bandwidth == H200.bandwidth


def test_an_h100_is_priced_from_its_datasheet_not_the_generic_guess():
    sxm = DeviceIdentity("cuda", "NVIDIA H100 80GB HBM3", "NVIDIA", "sm_90", 132, 80 * 2**30)
    pcie = DeviceIdentity("cuda", "NVIDIA H100 PCIe", "NVIDIA", "sm_90", 114, 80 * 2**30)
    assert not spec_for(sxm).estimated and spec_for(sxm).bandwidth == H100_SXM.bandwidth
    assert spec_for(pcie).bandwidth == H100_PCIE.bandwidth
    assert spec_for(sxm).flops("bfloat16") == H200.flops("bfloat16")


def test_every_spec_is_sane_and_sourced():
    for spec in (*KNOWN_CARDS.values(), H200, FALLBACK_CPU_SPEC):
        assert spec.source, spec.name
        for value in (*spec.matrix_flops.values(), spec.vector_flops, spec.bandwidth, spec.launch_overhead_s):
            assert math.isfinite(value) and value > 0
    for spec in KNOWN_CARDS.values():  # gfx906: PyTorch ships no fused attention; bf16 is an estimate
        assert not spec.fused_attention and any("bf16" in note for note in spec.notes)
    assert MI60.flops("float16") > MI50_32GB.flops("float16") and MI60.compute_units == 64


def test_unknown_gpu_gets_a_marked_estimate():
    from types import SimpleNamespace

    props = SimpleNamespace(name="Mystery GPU", multi_processor_count=40, total_memory=8 * 2**30, major=7, minor=5)
    spec = spec_for(DeviceIdentity.from_properties(props, cuda_version="12.1"))
    assert spec.estimated and "estimate" in spec.source and spec.compute_units == 40


def test_cpu_probe_measures_positive_rates():
    spec = probe_cpu_spec()
    assert spec.flops("float32") > 1e8 and spec.bandwidth > 1e8 and spec.launch_overhead_s > 0
    assert spec_for(DeviceIdentity.cpu(), probe=False).matrix_flops is FALLBACK_CPU_SPEC.matrix_flops


def test_prior_is_a_ranker_that_skips_unsupported_kernels():
    ranker = PriorRanker(MI50_32GB)
    assert isinstance(ranker, Ranker)
    problem = Problem(1, 32, 8, 1, 8192, 128, 128, "float16", device_type="cuda")
    ranking = ranker.rank(problem, all_kernels())
    names = [name for name, _ in ranking]
    assert names and all(not kernel_from_name(n).reasons(problem) for n in names)
    assert "sdpa_flash" not in names  # no CUDA here: the probe refuses it
    assert [s for _, s in ranking] == sorted(s for _, s in ranking)


def test_prior_shapes():
    decode = Problem(1, 32, 8, 1, 32768, 128, 128, "float16", device_type="cuda")
    prefill = Problem(1, 32, 32, 8192, 8192, 128, 128, "float16", causal=True, device_type="cuda")
    flash, math_k = kernel_from_name("sdpa_flash"), kernel_from_name("math")
    few, many = kernel_from_name("chunked[q=512,kv=4096]"), kernel_from_name("chunked[q=128,kv=1024]")
    # Fused kernels move no scores: far ahead of the full score matrix on long prefill (H200).
    assert prior_seconds(prefill, flash, H200) * 5 < prior_seconds(prefill, math_k, H200)
    # Small blocks pay launches: more blocks, more time.
    assert prior_seconds(prefill, many, MI50_32GB) > prior_seconds(prefill, few, MI50_32GB)
    # Split-KV gives a decode more parallel tiles on a 60-CU card.
    one, eight = kernel_from_name("small_q[splits=1]"), kernel_from_name("small_q[splits=8]")
    assert prior_seconds(decode, eight, MI50_32GB) < prior_seconds(decode, one, MI50_32GB)
    # A conversion adds its copies to the inner kernel's time.
    convert = kernel_from_name("convert[fp16->fp32]+chunked[q=512,kv=4096]")
    assert prior_seconds(prefill, convert, MI50_32GB) > prior_seconds(prefill.with_dtype("float32"), few, MI50_32GB)
    assert roofline_seconds(prefill, H200) < prior_seconds(prefill, flash, H200)


def test_fused_blocks_stream_their_keys_in_waves():
    """cuDNN splits the keys of one query row only; otherwise a block of query rows streams its
    head's keys through one compute unit, a wave of blocks after another (measured on the H200:
    models/priors.py). B4 40/8 heads (160 blocks on 132 units) takes two waves; folded (32 blocks
    of 35 rows) and B4 32/8 (128 blocks) take one."""
    from attn_dispatch.models.priors import fused_seconds

    def call(batch, q_heads, q_len):
        return Problem(batch, q_heads, 8, q_len, 34417, 128, 128, "bfloat16", device_type="cuda")

    one_wave = fused_seconds(call(4, 32, 7), "sdpa_cudnn", H200)
    two_waves = fused_seconds(call(4, 40, 7), "sdpa_cudnn", H200)
    assert two_waves == pytest.approx(2 * one_wave, rel=0.05)
    assert fused_seconds(call(4, 40, 7), "sdpa_cudnn", H200, folded=True) == pytest.approx(one_wave, rel=0.05)
    assert fused_seconds(call(1, 32, 1), "sdpa_cudnn", H200) * 5 < fused_seconds(call(1, 32, 2), "sdpa_cudnn", H200)
    assert fused_seconds(call(1, 32, 2), "sdpa_flash", H200) * 2 < fused_seconds(call(1, 32, 2), "sdpa_cudnn", H200)
    # Our cuDNN kernel folds the groups (no native GQA probed here), PyTorch's default does not.
    cudnn, default = kernel_from_name("sdpa_cudnn"), kernel_from_name("sdpa_default")
    assert prior_seconds(call(4, 40, 7), cudnn, H200) < prior_seconds(call(4, 40, 7), default, H200)


@pytest.mark.parametrize("kernel", portable_kernels() + all_kernels()[-5:], ids=lambda k: k.name)
def test_prior_is_finite_for_every_kernel(kernel):
    problem = Problem(2, 8, 2, 37, 1000, 64, 64, "float32", mask_kind="bool", mask_shape=(1, 1, 37, 1000))
    seconds = prior_seconds(problem, kernel, FALLBACK_CPU_SPEC)
    assert math.isfinite(seconds) and seconds > 0
