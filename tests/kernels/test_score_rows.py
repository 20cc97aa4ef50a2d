"""Padded score rows (`_blocks.SCORE_ROW_ALIGNMENT`): the layout, and our portable kernels'
results with it (forced on here: rows are unpadded by default until measured on a GPU, and the
CPU never pads, `_blocks.pads_rows`)."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.kernels import Problem, _blocks, kernel_from_name
from attn_dispatch.kernels.reference import reference_attention, relative_errors
from attn_dispatch.kernels.tolerances import TOLERANCES

PORTABLE = ("small_q[splits=1]", "small_q[splits=8]", "chunked[q=128,kv=1024]", "chunked[q=2048,kv=16384]", "math")
PADDED_IN_BF16 = ("small_q[splits=1]", "chunked[q=128,kv=1024]", "chunked[q=2048,kv=16384]", "math")
"""The kernels whose bf16 rows are padded here: split-K (`small_q[splits=8]`) reads rows exactly
`splits` blocks long, and on a CPU the scores of the blocked path come unpadded (no fp32-result
product: `_blocks.block_scores`), only its probabilities."""


@pytest.fixture
def padded(monkeypatch):
    """Rows padded to `KEY_COUNT_MULTIPLE` on every device, the CPU included."""
    monkeypatch.setattr(_blocks, "SCORE_ROW_ALIGNMENT", _blocks.KEY_COUNT_MULTIPLE)
    monkeypatch.setattr(_blocks, "pads_rows", lambda device: True)


def test_nothing_is_padded_as_shipped():
    assert _blocks.SCORE_ROW_ALIGNMENT == 1 and _blocks.aligned_width(4731) == 4731


def test_rows_start_aligned_and_the_padding_is_a_view(padded):
    rows = _blocks.aligned_rows((2, 3, 4731), torch.float32, torch.device("cpu"))
    assert rows.shape == (2, 3, 4731) and rows.stride() == (3 * 4736, 4736, 1)
    assert _blocks.aligned_rows((2, 3, 64), torch.float32, torch.device("cpu")).is_contiguous()
    assert _blocks.aligned_width(4731) == 4736 and _blocks.aligned_width(64) == 64


def test_the_cpu_does_not_pad_by_default():
    assert not _blocks.pads_rows(torch.device("cpu"))
    assert _blocks.aligned_rows((1, 2, 37), torch.float32, torch.device("cpu")).is_contiguous()


@pytest.mark.parametrize("name", PORTABLE)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", ["plain", "causal", "mask"])
def test_kernels_with_padded_rows_match_the_reference(monkeypatch, padded, name, dtype, case):
    """Odd key counts (37, 301), GQA, causal with Lq != Lk, a bool mask with a fully masked row."""
    from attn_dispatch.kernels import _single_pass

    widened = []
    aligned_rows, row_major_scores = _blocks.aligned_rows, _single_pass.row_major_scores

    def spy_rows(shape, *args):
        widened.append(_blocks.aligned_width(shape[-1]) > shape[-1])
        return aligned_rows(shape, *args)

    def spy_scores(rows, key, score_scale=1.0, width=None):
        widened.append(width is not None and width > key.shape[-2])
        return row_major_scores(rows, key, score_scale, width)

    monkeypatch.setattr(_blocks, "aligned_rows", spy_rows)
    monkeypatch.setattr(_single_pass, "row_major_scores", spy_scores)
    generator = torch.Generator().manual_seed(0)
    torch_dtype = getattr(torch, dtype)
    for q_len, kv_len in ((3, 37), (5, 301)):
        q, k, v = (torch.randn(2, h, n, 24, generator=generator).to(torch_dtype)
                   for h, n in ((6, q_len), (2, kv_len), (2, kv_len)))
        mask = None
        if case == "mask":
            mask = torch.rand(2, 1, q_len, kv_len, generator=generator) > 0.4
            mask[0, 0, 1] = False
        causal = case == "causal"
        problem = Problem.from_tensors(q, k, v, mask, causal, enable_gqa=True)
        out = kernel_from_name(name).run(q, k, v, mask, None, True, problem)
        reference = reference_attention(q, k, v, mask, causal, enable_gqa=True)
        rel_l2, rel_max = relative_errors(out, reference)
        assert TOLERANCES[dtype].accepts(rel_l2, rel_max), (name, dtype, case, q_len, kv_len, rel_l2, rel_max)
    if dtype == "bfloat16" and name in PADDED_IN_BF16:
        assert any(widened), name  # the padded layout was exercised, not only the plain one
