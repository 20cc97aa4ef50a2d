"""Triton building blocks shared by `triton_flash`'s forward and backward kernels.

Imported only when a Triton kernel first runs (importing Triton costs a CPU process ~0.5 s).

Units. Without a float mask a score tile is kept in log2 units, ``qk * scale * log2(e)``, so the
softmax's exponentials are single `exp2` calls (FlashAttention-2's trick). With a float mask it is
kept in natural units, ``qk * scale + mask``, and converted inside the exponent: a mask entry of
fp32's or bf16's lowest value (-3.4e38, what padding masks hold) times log2(e) would overflow to
-inf and block a key SDPA attends to. The saved log-sum-exp is always in natural units.

Index tensors. Helpers take query and key indices already shaped for the tile (``rows[:, None]``
and ``cols[None, :]`` for a ``[query, key]`` tile, the other way round for a transposed one), so
one helper serves both orientations.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attn_dispatch.kernels import _triton_flash_config as config

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): log(x) = log2(x) * LN2
BOOL_MASK = tl.constexpr(config.BOOL_MASK)
FLOAT_MASK = tl.constexpr(config.FLOAT_MASK)


@triton.jit
def load_tile(ptrs, first_ok, second_ok, CHECK_FIRST: tl.constexpr, CHECK_SECOND: tl.constexpr):
    """Load a 2-D tile; out-of-range elements (where a checked index test is False) read 0."""
    if CHECK_FIRST and CHECK_SECOND:
        tile = tl.load(ptrs, mask=first_ok & second_ok, other=0.0)
    elif CHECK_FIRST:
        tile = tl.load(ptrs, mask=first_ok, other=0.0)
    elif CHECK_SECOND:
        tile = tl.load(ptrs, mask=second_ok, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def exp_of(x, NATURAL: tl.constexpr):
    """``e**x`` for natural units, ``2**x`` for log2 units (see the module docstring)."""
    if NATURAL:
        result = tl.math.exp2(x * LOG2E)
    else:
        result = tl.math.exp2(x)
    return result


@triton.jit
def lse_in_units(lse, NATURAL: tl.constexpr):
    """A natural-unit log-sum-exp in the units of the score tiles (+inf stays +inf)."""
    if NATURAL:
        result = lse
    else:
        result = lse * LOG2E
    return result


@triton.jit
def score_tile(qk, q_local, k_local, q_start, k_start, mask_block, stride_mask_q, stride_mask_k, q_len, kv_len,
               causal_offset, scale, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, EDGE: tl.constexpr):
    """Scores of a tile from its fp32 product ``qk``, masked to -inf where SDPA blocks a key.

    Parameters
    ----------
    q_local, k_local: query / key positions within the tile (from 0), shaped for the tile.
    q_start, k_start: the tile's first query and key positions.
    mask_block: the mask's pointer at the tile's first query and key (stride 0 on broadcast dims).
    EDGE: the tile may hold keys past `kv_len` or, when causal, keys after some row's diagonal
        (key j is visible to query i when ``j <= i + causal_offset``); other tiles skip the tests.
    """
    if MASK_KIND == FLOAT_MASK:
        in_range = (q_start + q_local < q_len) & (k_start + k_local < kv_len)
        bias = tl.load(mask_block + q_local * stride_mask_q + k_local * stride_mask_k, mask=in_range, other=0.0)
        scores = qk * scale + bias.to(tl.float32)
    else:
        scores = qk * (scale * LOG2E)
    if MASK_KIND == BOOL_MASK:
        in_range = (q_start + q_local < q_len) & (k_start + k_local < kv_len)
        keep = tl.load(mask_block + q_local * stride_mask_q + k_local * stride_mask_k, mask=in_range, other=0)
        scores = tl.where(keep != 0, scores, float("-inf"))
    if EDGE:
        visible = k_start + k_local < kv_len
        if CAUSAL:
            visible = visible & (k_start + k_local <= q_start + q_local + causal_offset)
        scores = tl.where(visible, scores, float("-inf"))
    return scores


@triton.jit
def key_range(m_start, q_len, kv_len, causal_offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr):
    """Keys a query block starting at `m_start` reads: ``(full_end, end)``. Key blocks before
    `full_end` need no causal or range test; blocks from there to `end` do (`score_tile`'s EDGE).
    Causal: keys after the block's last row's diagonal are skipped, and so are key blocks that
    only rows past `q_len` would see."""
    if CAUSAL:
        last_row = tl.minimum(m_start + BLOCK_M, q_len) - 1
        end = tl.minimum(tl.maximum(last_row + causal_offset + 1, 0), kv_len)
        seen_by_all = tl.minimum(tl.maximum(m_start + causal_offset + 1, 0), kv_len)
        full_end = (seen_by_all // BLOCK_N) * BLOCK_N
    else:
        end = kv_len
        full_end = (kv_len // BLOCK_N) * BLOCK_N
    return full_end, end
