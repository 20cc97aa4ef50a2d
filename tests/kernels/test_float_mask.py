"""`kernels._layout`: rows rebased exactly where that keeps SDPA's result, and the memory it
takes within `rebase_bytes`."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.calibration.measure import StoragePeakTracker
from attn_dispatch.kernels import Problem
from attn_dispatch.kernels._layout import (
    FUSED_PENALTY_FLOOR,
    REBASE_LIMIT,
    floor_penalties_,
    rebase_bytes,
    rebased_float_mask,
)


def _problem(mask: torch.Tensor, q_len: int, kv_len: int, causal: bool) -> Problem:
    query = torch.zeros(2, 4, q_len, 8, dtype=torch.float16)
    key = torch.zeros(2, 4, kv_len, 8, dtype=torch.float16)
    return Problem.from_tensors(query, key, key, mask, causal)


def test_rows_lose_their_common_shift_and_keep_blocks():
    mask = torch.tensor([[[[-1e5, -1e5 - 3.0, float("-inf")],
                           [float("-inf")] * 3,
                           [-3.4e38, -3.4e38, 0.0],
                           [-2 * REBASE_LIMIT, -2 * REBASE_LIMIT, -2 * REBASE_LIMIT]]]])
    out = rebased_float_mask(mask, _problem(mask, 4, 3, causal=False))
    assert out[0, 0, 0].tolist() == [0.0, -3.0, float("-inf")]
    assert out[0, 0, 1].tolist() == [float("-inf")] * 3  # every key blocked: left alone
    assert out[0, 0, 2].tolist() == mask[0, 0, 2].tolist()  # largest entry 0: nothing to remove
    assert out[0, 0, 3].tolist() == mask[0, 0, 3].tolist()  # beyond the limit: left alone


def test_causality_takes_the_largest_visible_entry():
    """Row 0 sees key 0 alone: its penalty is the shift, whatever the hidden keys hold."""
    mask = torch.tensor([[[[-1e5, 0.0, 0.0]]]])  # one row, broadcast over three queries
    out = rebased_float_mask(mask, _problem(mask, 3, 3, causal=True))
    assert out.shape == (1, 1, 3, 3)
    assert out[0, 0, 0, 0] == 0.0 and out[0, 0, 1, 1] == 0.0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 1, 65), (2, 4, 1, 65), (2, 1, 30, 65), (2, 4, 30, 1)], ids=str)
def test_memory_within_rebase_bytes(shape, causal):
    mask = torch.randn(shape)
    problem = _problem(mask, 30, 65, causal)
    with StoragePeakTracker() as tracker:
        rebased_float_mask(mask, problem)
    assert 0 < tracker.peak <= rebase_bytes(problem)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_penalties_past_the_fused_floor_are_raised_to_it_and_blocked_keys_stay_blocked(dtype):
    lowest = torch.finfo(dtype).min
    bias = torch.tensor([[lowest, -1e5, 0.0, float("-inf"), -FUSED_PENALTY_FLOOR]], dtype=dtype)
    floor_penalties_(bias)
    assert bias.tolist() == [[-FUSED_PENALTY_FLOOR, float(torch.tensor(-1e5, dtype=dtype)), 0.0, float("-inf"),
                              -FUSED_PENALTY_FLOOR]]
    # Next to either penalty fp32 loses the scores alike: the row attends uniformly in both.
    scores = torch.tensor([0.5, -2.0, 3.0])
    assert torch.equal(torch.softmax(scores + lowest if dtype == torch.float32 else scores - FUSED_PENALTY_FLOOR, 0),
                       torch.full((3,), 1 / 3))


def test_fp16_biases_cannot_hold_such_penalties_and_are_left_alone():
    bias = torch.tensor([-65504.0, float("-inf")], dtype=torch.float16)
    assert floor_penalties_(bias).tolist() == [-65504.0, float("-inf")]
