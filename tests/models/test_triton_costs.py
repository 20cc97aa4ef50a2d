"""The analytic prior of the Triton kernels (`models.triton_costs`): FlashAttention-2's and
flash-decoding's costs per card, the H200 from placeholders, gfx906 from its spec sheet."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attn_dispatch.kernels import Problem, kernel_from_name
from attn_dispatch.models import triton_costs
from attn_dispatch.models.identity import H200, MI50_32GB, MI60, RADEON_VII
from attn_dispatch.models.priors import FORCED_BACKEND_FACTOR, fused_seconds, prior_seconds

FLASH = kernel_from_name("triton_flash[bm=128,bn=64,w=8,s=3]")
DECODE = kernel_from_name("triton_decode[splits=16,bn=64,w=4,s=2]")


def problem(**overrides) -> Problem:
    fields = dict(batch=1, q_heads=40, kv_heads=40, q_len=32760, kv_len=32760, head_dim=128, value_dim=128,
                  dtype="float16", causal=False, device_type="cuda")
    return Problem(**{**fields, **overrides})


def test_matrix_cores_are_read_off_the_spec_sheet():
    assert triton_costs.has_matrix_cores(H200)
    for gfx906 in (MI50_32GB, MI60, RADEON_VII):
        assert not triton_costs.has_matrix_cores(gfx906) and triton_costs.is_gfx906_class(gfx906)


def test_gfx906_rates_dot2_for_fp16_bf16_slower_fp32_on_the_vector_alus():
    assert triton_costs.triton_matrix_flops(MI50_32GB, "float16") == pytest.approx(26.5e12)
    assert triton_costs.triton_matrix_flops(MI50_32GB, "bfloat16") == pytest.approx(26.5e12 / 2.69)
    assert triton_costs.triton_matrix_flops(MI50_32GB, "float32") == pytest.approx(13.3e12)
    assert triton_costs.triton_matrix_flops(H200, "bfloat16") == H200.flops("bfloat16")


def test_flash_on_gfx906_is_compute_bound_and_bf16_costs_the_dot2_slowdown():
    fp16 = triton_costs.triton_flash_seconds(problem(), FLASH, MI50_32GB)
    bf16 = triton_costs.triton_flash_seconds(problem(dtype="bfloat16"), FLASH, MI50_32GB)
    assert 0.9 * triton_costs.NO_MATRIX_BF16_SLOWDOWN < bf16 / fp16 <= triton_costs.NO_MATRIX_BF16_SLOWDOWN
    products = problem().flops / (26.5e12 * 0.8 * triton_costs.VECTOR_DOT_EFFICIENCY)
    assert products < fp16 < 1.2 * products  # the softmax adds its few percent on the same ALUs


def test_causal_flash_skips_the_blocks_above_the_diagonal():
    for spec in (H200, MI50_32GB):
        full = triton_costs.triton_flash_seconds(problem(), FLASH, spec)
        causal = triton_costs.triton_flash_seconds(problem(causal=True), FLASH, spec)
        assert 0.45 < causal / full < 0.55


def test_the_h200_placeholder_is_the_published_ratio_to_pytorchs_flash():
    ours = triton_costs.triton_flash_seconds(problem(), FLASH, H200)
    flash = fused_seconds(problem(), "sdpa_flash", H200)
    assert ours / flash == pytest.approx(triton_costs.TRITON_FLASH_TIME_VS_FLASH, rel=0.05)


def test_fp32_flash_products_run_off_the_matrix_cores_where_a_card_has_them():
    """IEEE-precision fp32 products: on the H200 a compute-bound fp32 forward costs the measured
    slowdown over its fp32 rate; on gfx906 (no matrix cores) fp32 stays at the vector rate."""
    fp32 = problem(dtype="float32")
    h200 = triton_costs.triton_flash_seconds(fp32, FLASH, H200)
    at_fp32_rate = fp32.flops / (H200.flops("float32") * 0.8 * triton_costs.TRITON_FLASH_EFFICIENCY)
    assert h200 == pytest.approx(triton_costs.IEEE_FP32_FLASH_SLOWDOWN * at_fp32_rate, rel=0.05)
    assert triton_costs.flash_product_slowdown(MI50_32GB, "float32") == 1.0
    assert triton_costs.flash_product_slowdown(H200, "bfloat16") == 1.0


def test_padded_head_dims_cost_their_padding():
    d80 = triton_costs.triton_flash_seconds(problem(head_dim=80, value_dim=80), FLASH, MI50_32GB)
    d128 = triton_costs.triton_flash_seconds(problem(), FLASH, MI50_32GB)
    assert d80 == pytest.approx(d128, rel=0.05)  # 80 runs in 128-wide tiles


def test_decode_reads_kv_once_per_group_at_the_cards_measured_bandwidth():
    step = problem(batch=8, q_heads=32, kv_heads=8, q_len=1, kv_len=131072, dtype="bfloat16")
    seconds = triton_costs.triton_decode_seconds(step, DECODE, H200)
    copy = step.kv_bytes / (H200.bandwidth * 0.9)
    assert copy < seconds < 1.2 * copy
    gfx906_copy = step.kv_bytes / triton_costs.GFX906_MEASURED_BANDWIDTH
    assert triton_costs.triton_decode_seconds(replace(step, dtype="float16"), DECODE, MI50_32GB) > gfx906_copy


def test_decode_splits_fill_the_card_and_the_combine_costs_its_launch():
    short = problem(q_heads=32, kv_heads=8, q_len=1, kv_len=32768)
    one = triton_costs.triton_decode_seconds(short, kernel_from_name("triton_decode[splits=1,bn=64,w=4,s=2]"), H200)
    many = triton_costs.triton_decode_seconds(short, kernel_from_name("triton_decode[splits=64,bn=64,w=4,s=2]"), H200)
    assert many < one / 2  # 8 programs leave 124 of 132 units idle; 512 programs do not
    tiny = problem(q_heads=32, kv_heads=8, q_len=1, kv_len=64)
    direct = triton_costs.triton_decode_seconds(tiny, kernel_from_name("triton_decode[splits=1,bn=16,w=4,s=2]"), H200)
    merged = triton_costs.triton_decode_seconds(tiny, kernel_from_name("triton_decode[splits=4,bn=16,w=4,s=2]"), H200)
    launch = triton_costs.TRITON_LAUNCH_OPS * H200.launch_overhead_s
    assert merged - direct == pytest.approx(launch, rel=0.05)


def test_the_prior_keeps_pytorchs_fused_choice_unless_triton_is_clearly_faster():
    p = problem()
    assert prior_seconds(p, FLASH, H200) == pytest.approx(
        FORCED_BACKEND_FACTOR * triton_costs.triton_flash_seconds(p, FLASH, H200))
    assert prior_seconds(p, FLASH, MI50_32GB) == triton_costs.triton_flash_seconds(p, FLASH, MI50_32GB)


def test_a_strided_cache_slice_is_read_in_place_not_priced_a_copy():
    """K/V slices of a longer cache are strided 4-D views: canonicalising them allocates nothing and the Triton
    kernels read them through their strides, so the prior prices them as contiguous inputs; broadcast inputs are
    materialised and priced."""
    import torch

    from attn_dispatch.kernels._layout import canonicalise, describe_inputs

    cache = torch.zeros(2, 2, 40, 16)
    query, key = torch.zeros(2, 4, 1, 16), cache[:, :, :33]
    sliced = describe_inputs(Problem, query, key, key, None, False, True)
    views = canonicalise(query, key, key, None, sliced, True)
    assert sliced.strided and views.key.data_ptr() == key.data_ptr() and views.key.stride() == key.stride()
    step = problem(batch=8, q_heads=32, kv_heads=8, q_len=1, kv_len=32768, dtype="bfloat16")
    for kernel, seconds in ((DECODE, triton_costs.triton_decode_seconds), (FLASH, triton_costs.triton_flash_seconds)):
        assert seconds(replace(step, strided=True), kernel, H200) == seconds(step, kernel, H200)
        assert seconds(replace(step, broadcast_inputs=True), kernel, H200) > seconds(step, kernel, H200)
