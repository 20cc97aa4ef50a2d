"""The Triton programs of `triton_decode` (flash-decoding): a split-KV pass and the exact merge of
its splits. Imported only when a `triton_decode` kernel first runs (importing Triton is slow).

Split pass: one program per (batch x K/V head, split of the keys, block of packed rows). The
packed rows of a K/V head are its GQA group's query heads times their query positions: row
``r = g * L + i`` is query head ``h * G + g`` at position ``i``, so K and V are read once for the
whole group. The program reduces its keys in blocks of ``BLOCK_N`` with an online softmax in fp32
(FlashAttention-2's recurrence, in natural-log units so that finite mask penalties as low as
fp32's lowest value stay finite) and writes either the normalised output directly (one split) or
the split's normalised partial output, row maximum and row sum (fp32), which the merge program
combines.

Semantics: bool masks (nonzero = attend) and float masks (added), broadcast through stride-0
dimensions; causality with the diagonal shifted by ``causal_offset`` (query ``i`` sees keys
``0 .. i + causal_offset``); rows that see no key give zeros. Mask and causal code is compiled
only where the flags ask for it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attn_dispatch.kernels import _triton_ops

NO_MASK = tl.constexpr(_triton_ops.NO_MASK)
BOOL_MASK = tl.constexpr(_triton_ops.BOOL_MASK)
FLOAT_MASK = tl.constexpr(_triton_ops.FLOAT_MASK)
LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)


@triton.jit
def split_kernel(
    Q, K, V, Mask, PartOut, PartMax, PartSum, Out,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_mb, stride_mh, stride_ml, stride_ms,
    stride_ob, stride_oh, stride_ol, stride_od,
    kv_heads, group, q_len, kv_len, rows,
    scale, causal_offset, keys_per_split,
    HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Grid ``(B * Hkv, splits, row blocks)``; ``kv_len`` is the count of keys any row can see
    (`_triton_decode_layout.visible_key_count`). ``DIRECT`` (one split): writes ``Out`` in its dtype;
    else ``PartOut [B * Hkv, splits, rows, Ev]`` (normalised), ``PartMax`` and ``PartSum``
    ``[B * Hkv, splits, rows]`` (the row's largest score and its sum of exp(score - max), fp32)."""
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64
    bh = tl.program_id(0).to(tl.int64)  # every offset below that grows with a size is int64
    split = tl.program_id(1)
    b = bh // kv_heads
    h = bh % kv_heads
    offs_r = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_r < rows
    positions = offs_r % q_len
    heads = h * group + offs_r // q_len
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM  # head dims padded to powers of two: constant-folded when they are
    dv_ok = offs_dv < VALUE_DIM

    q_ptrs = Q + b * stride_qb + heads[:, None] * stride_qh + positions[:, None] * stride_ql + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    start = split * keys_per_split  # key indices fit int32 (S < 2^31); their offsets need not
    end = tl.minimum(start + keys_per_split, kv_len)
    first_key = start.to(tl.int64) + offs_n
    k_ptrs = K + b * stride_kb + h * stride_kh + first_key[:, None] * stride_ks + offs_d[None, :] * stride_kd
    v_ptrs = V + b * stride_vb + h * stride_vh + first_key[:, None] * stride_vs + offs_dv[None, :] * stride_vd
    mask_ptrs = Mask + b * stride_mb + (heads * stride_mh + positions * stride_ml)[:, None] + first_key[None, :] * stride_ms

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        key_ok = offs_n < end - n0
        k = tl.load(k_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [BLOCK_M, BLOCK_N], fp32
        if MASK_KIND == BOOL_MASK:
            allowed = tl.load(mask_ptrs, mask=row_ok[:, None] & key_ok[None, :], other=0)
            scores = tl.where(allowed != 0, scores, float("-inf"))
        if MASK_KIND == FLOAT_MASK:
            scores += tl.load(mask_ptrs, mask=row_ok[:, None] & key_ok[None, :], other=0.0).to(tl.float32)
        visible = key_ok[None, :]
        if CAUSAL:  # query i sees keys up to i + causal_offset
            visible = visible & (n0 + offs_n[None, :] <= positions[:, None] + causal_offset)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet: no NaN
        alpha = tl.exp2((m_i - m_safe) * LOG2E)
        p = tl.exp2((scores - m_safe[:, None]) * LOG2E)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs, mask=key_ok[:, None] & dv_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs
        if MASK_KIND != NO_MASK:
            mask_ptrs += BLOCK_N * stride_ms

    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]  # rows that saw no key: zeros
    out_ok = row_ok[:, None] & dv_ok[None, :]
    if DIRECT:
        out_ptrs = (Out + b * stride_ob + heads[:, None] * stride_oh + positions[:, None] * stride_ol
                    + offs_dv[None, :] * stride_od)
        tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=out_ok)
    else:
        part = (bh * tl.num_programs(1) + split) * rows + offs_r  # [BLOCK_M]
        tl.store(PartOut + part[:, None] * VALUE_DIM + offs_dv[None, :], out, mask=out_ok)
        tl.store(PartMax + part, m_i, mask=row_ok)  # kept apart from the sum: max + log(sum) loses the
        tl.store(PartSum + part, l_i, mask=row_ok)  # sum next to fp32's largest finite mask penalties


@triton.jit
def merge_kernel(
    PartOut, PartMax, PartSum, Out,
    stride_ob, stride_oh, stride_ol, stride_od,
    kv_heads, group, q_len, rows, splits,
    VALUE_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """Grid ``(B * Hkv, row blocks of BLOCK_R)``: each row's splits weighted by their share of its
    softmax, ``sum * exp(max - overall max)`` (exactly the softmax over all keys), ``BLOCK_S``
    splits at a time; a row no split saw gives zeros."""
    bh = tl.program_id(0).to(tl.int64)
    b = bh // kv_heads
    h = bh % kv_heads
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_r < rows
    dv_ok = offs_dv < VALUE_DIM

    overall = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    for s0 in range(0, splits, BLOCK_S):
        part = (bh * splits + s0 + offs_s[None, :]) * rows + offs_r[:, None]  # [BLOCK_R, BLOCK_S]
        ok = row_ok[:, None] & (s0 + offs_s[None, :] < splits)
        overall = tl.maximum(overall, tl.max(tl.load(PartMax + part, mask=ok, other=float("-inf")), 1))
    overall = tl.where(overall == float("-inf"), 0.0, overall)  # a row no split saw: weights of 0

    acc = tl.zeros([BLOCK_R, BLOCK_DV], dtype=tl.float32)
    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    for s0 in range(0, splits, BLOCK_S):
        part = (bh * splits + s0 + offs_s[None, :]) * rows + offs_r[:, None]
        ok = row_ok[:, None] & (s0 + offs_s[None, :] < splits)
        weight = (tl.exp2((tl.load(PartMax + part, mask=ok, other=float("-inf")) - overall[:, None]) * LOG2E)
                  * tl.load(PartSum + part, mask=ok, other=0.0))  # [BLOCK_R, BLOCK_S]
        partial = tl.load(PartOut + part[:, :, None] * VALUE_DIM + offs_dv[None, None, :],
                          mask=ok[:, :, None] & dv_ok[None, None, :], other=0.0)  # [BLOCK_R, BLOCK_S, BLOCK_DV]
        acc += tl.sum(weight[:, :, None] * partial, 1)
        total += tl.sum(weight, 1)
    out = acc / tl.where(total > 0.0, total, 1.0)[:, None]
    positions = offs_r % q_len
    heads = h * group + offs_r // q_len
    out_ptrs = (Out + b * stride_ob + heads[:, None] * stride_oh + positions[:, None] * stride_ol
                + offs_dv[None, :] * stride_od)
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
