"""`triton_flash`'s backward: FlashAttention-2's, in Triton (imported on the kernel's first run).

With ``P = exp(S - lse)`` recomputed tile by tile from the forward's saved log-sum-exp,

    delta = rowsum(dO * O),   dV = P^T dO,   dS = P * (dO V^T - delta),
    dQ = scale * dS K,        dK = scale * dS^T Q.

Three kernels: `delta_kernel` (one program per block of rows); `key_grad_kernel` (one program
per key block of one (batch, key/value head): its dK and dV stay in fp32 registers while it walks
every query head of its GQA group and every query block that sees its keys, so the group's
gradients are summed without atomics); `query_grad_kernel` (one program per query block of one
(batch, query head), dQ in fp32 registers). Rows whose every key is blocked carry ``lse = +inf``:
``P = 0`` there and their gradients are zero, as SDPA's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attn_dispatch.kernels._triton_flash_config import BackwardBlocks
from attn_dispatch.kernels._triton_flash_tiles import (
    FLOAT_MASK,
    LOG2E,
    ONE,
    key_range,
    load_tile,
    query_block_of_program,
    score_tile,
)
from attn_dispatch.kernels._triton_ops import broadcast_strides, dot_precision, mask_kind, mask_operand
from attn_dispatch.kernels.triton_flash import padded_dim

DELTA_ROWS = 64
"""Rows per program of `delta_kernel`: a ``64 x 256`` fp32 product of two tiles at most."""


@triton.jit
def delta_kernel(Out, GradOut, Delta,
                 stride_ob, stride_oh, stride_om, stride_od,
                 stride_gb, stride_gh, stride_gm, stride_gd,
                 q_heads, q_len, row_blocks,
                 VALUE_DIM: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr):
    """``Delta [B, Hq, L]`` (fp32, contiguous) = ``rowsum(dO * O)``; grid ``row_blocks * B * Hq``."""
    pid = tl.program_id(0)
    head_row = pid // row_blocks
    m_start = (pid % row_blocks) * BLOCK_M
    batch = tl.cast(head_row // q_heads, tl.int64)
    head = tl.cast(head_row % q_heads, tl.int64)
    rows = tl.arange(0, BLOCK_M)
    vdims = tl.arange(0, BLOCK_DV)
    in_range = (m_start + rows[:, None] < q_len) & (vdims[None, :] < VALUE_DIM)
    m_offset = tl.cast(m_start, tl.int64)
    out = tl.load(Out + batch * stride_ob + head * stride_oh + m_offset * stride_om
                  + rows[:, None] * stride_om + vdims[None, :] * stride_od, mask=in_range, other=0.0)
    grad = tl.load(GradOut + batch * stride_gb + head * stride_gh + m_offset * stride_gm
                   + rows[:, None] * stride_gm + vdims[None, :] * stride_gd, mask=in_range, other=0.0)
    delta = tl.sum(out.to(tl.float32) * grad.to(tl.float32), 1)
    tl.store(Delta + tl.cast(head_row, tl.int64) * q_len + m_offset + rows, delta, mask=m_start + rows < q_len)


@triton.jit
def _key_grad_step(d_key, d_value, k, v, q_rows, g_rows, lse_rows, delta_rows, mask_rows, q_offsets, g_offsets,
                   mask_offsets, q_dims_ok, v_dims_ok, key_ok, rows, diagonal, diagonal_limit, rows_left, scale, unit,
                   lse_unit, PAD_D: tl.constexpr, PAD_DV: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
                   EDGE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One query block's contribution to a key block's dK and dV (tiles transposed: keys x queries).
    The ``*_rows`` pointers are at the query block's first row; `rows_left` rows remain."""
    row_ok = rows < rows_left
    q = load_tile(q_rows + q_offsets, row_ok[:, None], q_dims_ok, True, PAD_D)
    grad = load_tile(g_rows + g_offsets, row_ok[:, None], v_dims_ok, True, PAD_DV)
    lse = tl.load(lse_rows + rows, mask=row_ok, other=float("inf"))  # rows past L: P = 0
    delta = tl.load(delta_rows + rows, mask=row_ok, other=0.0)
    qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)  # [keys, queries]
    scores_t = score_tile(qk_t, mask_rows + mask_offsets, key_ok & row_ok[None, :], key_ok, diagonal, diagonal_limit,
                          scale, MASK_KIND, CAUSAL, EDGE)
    probs_t = tl.math.exp2((scores_t - (lse * lse_unit)[None, :]) * unit)
    d_value = tl.dot(probs_t.to(grad.dtype), grad, d_value, input_precision=DOT_PRECISION)
    d_probs_t = tl.dot(v, tl.trans(grad), input_precision=DOT_PRECISION)
    d_scores_t = probs_t * (d_probs_t - delta[None, :])
    d_key = tl.dot(d_scores_t.to(q.dtype), q, d_key, input_precision=DOT_PRECISION)
    return d_key, d_value


@triton.jit
def key_grad_kernel(
    Q, K, V, Mask, GradOut, Lse, Delta, DK, DV,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_gb, stride_gh, stride_gm, stride_gd,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    q_heads, kv_heads, group, q_len, kv_len, causal_offset, scale, key_blocks,
    HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid ``key_blocks * B * Hkv``: dK and dV of `BLOCK_N` keys of one (batch, key/value head),
    summed over the query heads of its group, `BLOCK_M` query rows per step."""
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64
    pid = tl.program_id(0)
    kv_row = pid // key_blocks
    n_start = (pid % key_blocks) * BLOCK_N
    batch = tl.cast(kv_row // kv_heads, tl.int64)
    kv_head = tl.cast(kv_row % kv_heads, tl.int64)
    n_offset = tl.cast(n_start, tl.int64)
    rows = tl.arange(0, BLOCK_M)
    keys = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)
    key_ok = (n_start + keys < kv_len)[:, None]
    q_dims_ok = dims[None, :] < HEAD_DIM
    v_dims_ok = vdims[None, :] < VALUE_DIM
    k = load_tile(K + batch * stride_kb + kv_head * stride_kh + n_offset * stride_kn
                  + keys[:, None] * stride_kn + dims[None, :] * stride_kd, key_ok, q_dims_ok, True, BLOCK_D != HEAD_DIM)
    v = load_tile(V + batch * stride_vb + kv_head * stride_vh + n_offset * stride_vn
                  + keys[:, None] * stride_vn + vdims[None, :] * stride_vd, key_ok, v_dims_ok, True,
                  BLOCK_DV != VALUE_DIM)
    q_offsets = rows[:, None] * stride_qm + dims[None, :] * stride_qd
    g_offsets = rows[:, None] * stride_gm + vdims[None, :] * stride_gd
    if MASK_KIND != 0:
        mask_offsets = keys[:, None] * stride_mn + rows[None, :] * stride_mm
    else:
        mask_offsets = 0
    if CAUSAL:  # rows before `first` see none of these keys; rows from `all_seen` see all of them
        diagonal = keys[:, None] - rows[None, :]
        first = (tl.maximum(n_start - causal_offset, 0) // BLOCK_M) * BLOCK_M
        all_seen = tl.maximum(n_start + BLOCK_N - 1 - causal_offset, first)
        diagonal_end = tl.minimum(first + tl.cdiv(all_seen - first, BLOCK_M) * BLOCK_M, q_len)
        full_start = tl.maximum(diagonal_end, first)
    else:
        diagonal = 0
        first = 0
        diagonal_end = 0
        full_start = 0
    unit = LOG2E if MASK_KIND == FLOAT_MASK else ONE  # the exponent's factor (module docstring of the tiles)
    lse_unit = ONE if MASK_KIND == FLOAT_MASK else LOG2E
    d_key = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    d_value = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    for member in range(0, group):
        head = tl.cast(kv_head * group + member, tl.int64)
        head_row = batch * q_heads + head
        q_head = Q + batch * stride_qb + head * stride_qh
        g_head = GradOut + batch * stride_gb + head * stride_gh
        lse_head = Lse + head_row * q_len
        delta_head = Delta + head_row * q_len
        mask_head = Mask + batch * stride_mb + head * stride_mh + n_offset * stride_mn
        if CAUSAL:
            for m_start in range(first, diagonal_end, BLOCK_M):
                m_offset = tl.cast(m_start, tl.int64)
                d_key, d_value = _key_grad_step(
                    d_key, d_value, k, v, q_head + m_offset * stride_qm, g_head + m_offset * stride_gm,
                    lse_head + m_offset, delta_head + m_offset, mask_head + m_offset * stride_mm, q_offsets, g_offsets,
                    mask_offsets, q_dims_ok, v_dims_ok, key_ok, rows, diagonal, m_start - n_start + causal_offset,
                    q_len - m_start, scale, unit, lse_unit, BLOCK_D != HEAD_DIM, BLOCK_DV != VALUE_DIM, MASK_KIND,
                    CAUSAL, True, DOT_PRECISION)
        for m_start in range(full_start, q_len, BLOCK_M):
            m_offset = tl.cast(m_start, tl.int64)
            d_key, d_value = _key_grad_step(
                d_key, d_value, k, v, q_head + m_offset * stride_qm, g_head + m_offset * stride_gm,
                lse_head + m_offset, delta_head + m_offset, mask_head + m_offset * stride_mm, q_offsets, g_offsets,
                mask_offsets, q_dims_ok, v_dims_ok, key_ok, rows, diagonal, m_start - n_start + causal_offset,
                q_len - m_start, scale, unit, lse_unit, BLOCK_D != HEAD_DIM, BLOCK_DV != VALUE_DIM, MASK_KIND,
                CAUSAL, False, DOT_PRECISION)
    d_key = d_key * scale
    tl.store(DK + batch * stride_dkb + kv_head * stride_dkh + n_offset * stride_dkn
             + keys[:, None] * stride_dkn + dims[None, :] * stride_dkd, d_key.to(DK.dtype.element_ty),
             mask=key_ok & q_dims_ok)
    tl.store(DV + batch * stride_dvb + kv_head * stride_dvh + n_offset * stride_dvn
             + keys[:, None] * stride_dvn + vdims[None, :] * stride_dvd, d_value.to(DV.dtype.element_ty),
             mask=key_ok & v_dims_ok)


@triton.jit
def _query_grad_step(d_query, q, grad, lse, delta, k_block, v_block, mask_block, k_offsets, v_offsets, mask_offsets,
                     k_dims_ok, v_dims_ok, q_ok, cols, diagonal, diagonal_limit, keys_left, scale, unit,
                     PAD_D: tl.constexpr, PAD_DV: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
                     EDGE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One key block's contribution to a query block's dQ (`lse` in the score tiles' units)."""
    key_ok = cols < keys_left
    k = load_tile(k_block + k_offsets, key_ok[:, None], k_dims_ok, EDGE, PAD_D)  # [BLOCK_N, BLOCK_D]
    v = load_tile(v_block + v_offsets, key_ok[:, None], v_dims_ok, EDGE, PAD_DV)  # [BLOCK_N, BLOCK_DV]
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    scores = score_tile(qk, mask_block + mask_offsets, q_ok & key_ok[None, :], key_ok[None, :], diagonal,
                        diagonal_limit, scale, MASK_KIND, CAUSAL, EDGE)
    probs = tl.math.exp2((scores - lse[:, None]) * unit)
    d_probs = tl.dot(grad, tl.trans(v), input_precision=DOT_PRECISION)
    d_scores = probs * (d_probs - delta[:, None])
    return tl.dot(d_scores.to(k.dtype), k, d_query, input_precision=DOT_PRECISION)


@triton.jit
def query_grad_kernel(
    Q, K, V, Mask, GradOut, Lse, Delta, DQ,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_gb, stride_gh, stride_gm, stride_gd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    q_heads, group, q_len, kv_len, causal_offset, scale, query_blocks,
    HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid ``query_blocks * B * Hq``: dQ of `BLOCK_M` query rows of one (batch, query head),
    `BLOCK_N` keys per step over the keys the rows see (as the forward)."""
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64
    head_row, m_start, batch, head, kv_head = query_block_of_program(query_blocks, q_heads, group, BLOCK_M, CAUSAL)
    m_offset = tl.cast(m_start, tl.int64)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)
    row_ok = m_start + rows < q_len
    q_ok = row_ok[:, None]
    q_dims_ok = dims[None, :] < HEAD_DIM
    v_dims_ok = vdims[None, :] < VALUE_DIM
    q = load_tile(Q + batch * stride_qb + head * stride_qh + m_offset * stride_qm
                  + rows[:, None] * stride_qm + dims[None, :] * stride_qd, q_ok, q_dims_ok, True, BLOCK_D != HEAD_DIM)
    grad = load_tile(GradOut + batch * stride_gb + head * stride_gh + m_offset * stride_gm
                     + rows[:, None] * stride_gm + vdims[None, :] * stride_gd, q_ok, v_dims_ok, True,
                     BLOCK_DV != VALUE_DIM)
    row_offset = tl.cast(head_row, tl.int64) * q_len + m_offset
    lse = tl.load(Lse + row_offset + rows, mask=row_ok, other=float("inf")) * (ONE if MASK_KIND == FLOAT_MASK else LOG2E)
    delta = tl.load(Delta + row_offset + rows, mask=row_ok, other=0.0)
    k_head = K + batch * stride_kb + kv_head * stride_kh
    v_head = V + batch * stride_vb + kv_head * stride_vh
    mask_rows = Mask + batch * stride_mb + head * stride_mh + m_offset * stride_mm
    k_offsets = cols[:, None] * stride_kn + dims[None, :] * stride_kd
    v_offsets = cols[:, None] * stride_vn + vdims[None, :] * stride_vd
    if MASK_KIND != 0:
        mask_offsets = rows[:, None] * stride_mm + cols[None, :] * stride_mn
    else:
        mask_offsets = 0
    if CAUSAL:
        diagonal = cols[None, :] - rows[:, None]
    else:
        diagonal = 0
    unit = LOG2E if MASK_KIND == FLOAT_MASK else ONE  # the exponent's factor (module docstring of the tiles)
    d_query = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full_end, end = key_range(m_start, q_len, kv_len, causal_offset, BLOCK_M, BLOCK_N, CAUSAL)
    for n_start in range(0, full_end, BLOCK_N):
        n_offset = tl.cast(n_start, tl.int64)
        d_query = _query_grad_step(
            d_query, q, grad, lse, delta, k_head + n_offset * stride_kn, v_head + n_offset * stride_vn,
            mask_rows + n_offset * stride_mn, k_offsets, v_offsets, mask_offsets, q_dims_ok, v_dims_ok, q_ok, cols,
            diagonal, m_start - n_start + causal_offset, kv_len - n_start, scale, unit,
            BLOCK_D != HEAD_DIM, BLOCK_DV != VALUE_DIM, MASK_KIND, CAUSAL, False, DOT_PRECISION)
    for n_start in range(full_end, end, BLOCK_N):
        n_offset = tl.cast(n_start, tl.int64)
        d_query = _query_grad_step(
            d_query, q, grad, lse, delta, k_head + n_offset * stride_kn, v_head + n_offset * stride_vn,
            mask_rows + n_offset * stride_mn, k_offsets, v_offsets, mask_offsets, q_dims_ok, v_dims_ok, q_ok, cols,
            diagonal, m_start - n_start + causal_offset, kv_len - n_start, scale, unit,
            BLOCK_D != HEAD_DIM, BLOCK_DV != VALUE_DIM, MASK_KIND, CAUSAL, True, DOT_PRECISION)
    d_query = d_query * scale
    tl.store(DQ + batch * stride_dqb + head * stride_dqh + m_offset * stride_dqm
             + rows[:, None] * stride_dqm + dims[None, :] * stride_dqd, d_query.to(DQ.dtype.element_ty),
             mask=q_ok & q_dims_ok)


def launch_backward(launch, grad_out, query, key, value, mask, out, lse, delta, d_query, d_key, d_value,
                    scale: float, causal: bool, causal_offset: int, blocks: BackwardBlocks, warps: int) -> None:
    """Fill `delta` ``[B, Hq, L]`` (fp32) and the gradients `d_query`, `d_key`, `d_value` (shapes of
    the canonical inputs). `launch` wraps each kernel for the caller's context (see
    `_triton_flash_forward.launch_forward`)."""
    batch, q_heads, q_len, _ = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    head_dim, value_dim = int(query.shape[3]), int(value.shape[3])  # compile-time constants of the kernels
    group = q_heads // kv_heads
    block_d, block_dv = padded_dim(head_dim), padded_dim(value_dim)
    row_blocks = triton.cdiv(q_len, DELTA_ROWS)
    launch(delta_kernel)[(row_blocks * batch * q_heads,)](
        out, grad_out, delta, *out.stride(), *grad_out.stride(), q_heads, q_len, row_blocks,
        VALUE_DIM=value_dim, BLOCK_DV=block_dv, BLOCK_M=DELTA_ROWS,
    )
    shared = dict(HEAD_DIM=head_dim, VALUE_DIM=value_dim, BLOCK_D=block_d, BLOCK_DV=block_dv,
                  MASK_KIND=mask_kind(mask), CAUSAL=causal, DOT_PRECISION=dot_precision(query.dtype),
                  num_warps=warps, num_stages=blocks.stages)
    strides = (*query.stride(), *key.stride(), *value.stride(), *broadcast_strides(mask), *grad_out.stride())
    mask_arg = mask_operand(mask, query)
    key_blocks = triton.cdiv(kv_len, blocks.resident)
    launch(key_grad_kernel)[(key_blocks * batch * kv_heads,)](
        query, key, value, mask_arg, grad_out, lse, delta, d_key, d_value, *strides,
        *d_key.stride(), *d_value.stride(), q_heads, kv_heads, group, q_len, kv_len, causal_offset, scale, key_blocks,
        BLOCK_M=blocks.streamed, BLOCK_N=blocks.resident, **shared,
    )
    query_blocks = triton.cdiv(q_len, blocks.resident)
    launch(query_grad_kernel)[(query_blocks * batch * q_heads,)](
        query, key, value, mask_arg, grad_out, lse, delta, d_query, *strides, *d_query.stride(),
        q_heads, group, q_len, kv_len, causal_offset, scale, query_blocks,
        BLOCK_M=blocks.resident, BLOCK_N=blocks.streamed, **shared,
    )
