"""How the portable kernels form ``scale * Q K^T`` (`_blocks.score_recipe`): always fp32 scores
for half inputs, the scale folded into Q only where that rounds nothing, and no fp32 copy of the
keys where the device multiplies half operands into an fp32 result (issue 13, R5's cost)."""

from __future__ import annotations

import math

import pytest
import torch

from attn_dispatch.kernels import _blocks
from attn_dispatch.kernels._blocks import ScoreRecipe, block_scores, score_recipe
from attn_dispatch.kernels.chunked import row_major_scores
from attn_dispatch.kernels.problem import Problem

CPU = torch.device("cpu")


@pytest.fixture
def fp32_product_on_cpu(monkeypatch):
    """Pretend the CPU multiplies half operands into fp32 (as CUDA builds of torch >= 2.8 do)."""
    monkeypatch.setitem(_blocks._fp32_product, ("cpu", torch.float16), True)
    monkeypatch.setitem(_blocks._fp32_product, ("cpu", torch.bfloat16), True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_full_precision_inputs_fold_the_scale_into_the_query(dtype):
    assert score_recipe(dtype, CPU, 0.125) == ScoreRecipe(dtype, 0.125, 1.0)
    assert score_recipe(dtype, CPU, 1 / math.sqrt(128)) == ScoreRecipe(dtype, 1 / math.sqrt(128), 1.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_without_an_fp32_product_are_upcast(dtype):
    assert not _blocks.has_fp32_output_product(CPU, dtype)  # aten::bmm.dtype is CUDA-only
    assert score_recipe(dtype, CPU, 1 / math.sqrt(128)) == ScoreRecipe(torch.float32, 1 / math.sqrt(128), 1.0)


@pytest.mark.usefixtures("fp32_product_on_cpu")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_with_an_fp32_product_keep_their_dtype(dtype):
    # A power of two <= 1 scales a half query exactly: folded into Q.
    assert score_recipe(dtype, CPU, 0.125) == ScoreRecipe(dtype, 0.125, 1.0)
    # 1/sqrt(128) rounds in half precision, and a scale > 1 could overflow Q: applied to the fp32 scores.
    assert score_recipe(dtype, CPU, 1 / math.sqrt(128)) == ScoreRecipe(dtype, 1.0, 1 / math.sqrt(128))
    assert score_recipe(dtype, CPU, 4.0) == ScoreRecipe(dtype, 1.0, 4.0)


def test_score_scale_multiplies_the_fp32_scores():
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(2, 3, 5, 16, generator=generator)
    keys = torch.randn(2, 3, 7, 16, generator=generator)
    scale = 1 / math.sqrt(16 * 3)
    expected = (rows.double() @ keys.double().transpose(-1, -2)) * scale
    assert torch.allclose(block_scores(rows, keys, scale).double(), expected, rtol=1e-5, atol=1e-5)
    scores = row_major_scores(rows, keys, scale)  # [B*Hkv, R, S]
    assert torch.allclose(scores.double(), expected.reshape(6, 5, 7), rtol=1e-5, atol=1e-5)


def test_query_rows_with_a_unit_scale_copy_the_query():
    query = torch.randn(1, 4, 3, 8, dtype=torch.float16)
    problem = Problem(batch=1, q_heads=4, kv_heads=2, q_len=3, kv_len=5, head_dim=8, value_dim=8, dtype="float16")
    rows = _blocks.query_rows(query, slice(0, 3), problem, 1.0)
    assert rows.shape == (1, 2, 6, 8) and rows.dtype == torch.float16
    assert torch.equal(rows.view(1, 4, 3, 8), query)
    assert rows.data_ptr() != query.data_ptr()
