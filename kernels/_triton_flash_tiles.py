"""Triton building blocks shared by `triton_flash`'s forward and backward kernels.

Imported only when a Triton kernel first runs (importing Triton costs a CPU process ~0.5 s).

Units. Without a float mask a score tile is kept in log2 units, ``qk * scale * log2(e)``, so the
softmax's exponentials are single `exp2` calls (FlashAttention-2's trick). With a float mask it is
kept in natural units, ``qk * scale + mask``, and converted inside the exponent: a mask entry of
fp32's or bf16's lowest value (-3.4e38, what padding masks hold) times log2(e) would overflow to
-inf and block a key SDPA attends to. The saved log-sum-exp is always in natural units. Kernels
pick the exponent's factor (LOG2E or ONE, compiled away) and the log-sum-exp's (ONE or LOG2E) by
the mask kind.

Tiles of offsets. A program computes its pointer offsets, in-range tests and diagonal distances
once, shaped for its tiles (``[query, key]``, or ``[key, query]`` in the dK/dV kernel), and each
step adds a scalar (int64) block start: fewer operations per step, and one helper serves both
orientations.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attn_dispatch.kernels import _triton_flash_config as config

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)
ONE = tl.constexpr(1.0)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): log(x) = log2(x) * LN2
BOOL_MASK = tl.constexpr(config.BOOL_MASK)
FLOAT_MASK = tl.constexpr(config.FLOAT_MASK)


@triton.jit
def query_block_of_program(query_blocks, q_heads, group, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """This program's block of query rows on a grid of ``query_blocks * B * Hq`` programs:
    ``(head_row, m_start, batch, head, kv_head)``, the last three int64 (pointer arithmetic).
    Program ``p`` takes block ``p % query_blocks`` (causal: counted from the last, the longest
    rows first) of head row ``p // query_blocks``; key/value head = query head // group."""
    pid = tl.program_id(0)
    head_row = pid // query_blocks
    block = pid % query_blocks
    if CAUSAL:
        block = query_blocks - 1 - block
    head = head_row % q_heads
    return (head_row, block * BLOCK_M, tl.cast(head_row // q_heads, tl.int64), tl.cast(head, tl.int64),
            tl.cast(head // group, tl.int64))


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
def score_tile(qk, mask_ptrs, mask_ok, key_ok, diagonal, diagonal_limit, scale,
               MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, EDGE: tl.constexpr):
    """Scores of a tile from its fp32 product ``qk``, masked to -inf where SDPA blocks a key.

    Parameters
    ----------
    mask_ptrs: the mask's elements for the tile (stride 0 on broadcast dims); read where `mask_ok`.
    key_ok: the tile's keys that exist (shaped for the tile; used when EDGE).
    diagonal, diagonal_limit: key position minus query position within the tile, and its largest
        visible value (``query start - key start + causal offset``: key j is visible to query i
        when ``j <= i + causal_offset``).
    EDGE: the tile may hold keys past the last one or, when causal, keys after some row's
        diagonal; other tiles skip those tests.
    """
    if MASK_KIND == FLOAT_MASK:
        bias = tl.load(mask_ptrs, mask=mask_ok, other=0.0)
        scores = qk * scale + bias.to(tl.float32)
    else:
        scores = qk * (scale * LOG2E)
    if MASK_KIND == BOOL_MASK:
        keep = tl.load(mask_ptrs, mask=mask_ok, other=0)
        scores = tl.where(keep != 0, scores, float("-inf"))
    if EDGE:
        visible = key_ok
        if CAUSAL:
            visible = visible & (diagonal <= diagonal_limit)
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
