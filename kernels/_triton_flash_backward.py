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

from attn_dispatch.kernels._triton_flash_config import BackwardBlocks, padded_dim
from attn_dispatch.kernels._triton_flash_forward import dot_precision, mask_kind, mask_operand, mask_strides
from attn_dispatch.kernels._triton_flash_tiles import (
    FLOAT_MASK,
    exp_of,
    key_range,
    load_tile,
    lse_in_units,
    score_tile,
)

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
def _key_grad_step(d_key, d_value, k, v, q_ptrs, g_ptrs, lse_ptrs, delta_ptrs, mask_block, m_start, n_start,
                   rows, keys, dims, vdims, stride_qm, stride_qd, stride_gm, stride_gd, stride_mm, stride_mn,
                   q_len, kv_len, causal_offset, scale,
                   HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, EDGE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One query block's contribution to a key block's dK and dV (tiles transposed: keys x queries)."""
    m_offset = tl.cast(m_start, tl.int64)
    row_ok = m_start + rows < q_len
    q = load_tile(q_ptrs + m_offset * stride_qm + rows[:, None] * stride_qm + dims[None, :] * stride_qd,
                  row_ok[:, None], dims[None, :] < HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    grad = load_tile(g_ptrs + m_offset * stride_gm + rows[:, None] * stride_gm + vdims[None, :] * stride_gd,
                     row_ok[:, None], vdims[None, :] < VALUE_DIM, True, BLOCK_DV != VALUE_DIM)
    lse = tl.load(lse_ptrs + m_offset + rows, mask=row_ok, other=float("inf"))  # rows past L: P = 0
    delta = tl.load(delta_ptrs + m_offset + rows, mask=row_ok, other=0.0)
    qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)  # [keys, queries]
    scores_t = score_tile(qk_t, rows[None, :], keys[:, None], m_start, n_start, mask_block + m_offset * stride_mm,
                          stride_mm, stride_mn, q_len, kv_len, causal_offset, scale, MASK_KIND, CAUSAL, EDGE)
    probs_t = exp_of(scores_t - lse_in_units(lse, MASK_KIND == FLOAT_MASK)[None, :], MASK_KIND == FLOAT_MASK)
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
    key_ok = n_start + keys < kv_len
    k = load_tile(K + batch * stride_kb + kv_head * stride_kh + n_offset * stride_kn
                  + keys[:, None] * stride_kn + dims[None, :] * stride_kd,
                  key_ok[:, None], dims[None, :] < HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    v = load_tile(V + batch * stride_vb + kv_head * stride_vh + n_offset * stride_vn
                  + keys[:, None] * stride_vn + vdims[None, :] * stride_vd,
                  key_ok[:, None], vdims[None, :] < VALUE_DIM, True, BLOCK_DV != VALUE_DIM)
    d_key = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    d_value = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    if CAUSAL:  # rows before `first` see none of these keys; rows from `all_seen` see all of them
        first = (tl.maximum(n_start - causal_offset, 0) // BLOCK_M) * BLOCK_M
        all_seen = tl.maximum(n_start + BLOCK_N - 1 - causal_offset, first)
        diagonal_end = tl.minimum(first + tl.cdiv(all_seen - first, BLOCK_M) * BLOCK_M, q_len)
        full_start = tl.maximum(diagonal_end, first)
    else:
        first = 0
        diagonal_end = 0
        full_start = 0
    for member in range(0, group):
        head = tl.cast(kv_head * group + member, tl.int64)
        head_row = batch * q_heads + head
        q_ptrs = Q + batch * stride_qb + head * stride_qh
        g_ptrs = GradOut + batch * stride_gb + head * stride_gh
        lse_ptrs = Lse + head_row * q_len
        delta_ptrs = Delta + head_row * q_len
        mask_block = Mask + batch * stride_mb + head * stride_mh + n_offset * stride_mn
        if CAUSAL:
            for m_start in range(first, diagonal_end, BLOCK_M):
                d_key, d_value = _key_grad_step(
                    d_key, d_value, k, v, q_ptrs, g_ptrs, lse_ptrs, delta_ptrs, mask_block, m_start, n_start,
                    rows, keys, dims, vdims, stride_qm, stride_qd, stride_gm, stride_gd, stride_mm, stride_mn,
                    q_len, kv_len, causal_offset, scale,
                    HEAD_DIM, VALUE_DIM, BLOCK_D, BLOCK_DV, MASK_KIND, CAUSAL, True, DOT_PRECISION)
        for m_start in range(full_start, q_len, BLOCK_M):
            d_key, d_value = _key_grad_step(
                d_key, d_value, k, v, q_ptrs, g_ptrs, lse_ptrs, delta_ptrs, mask_block, m_start, n_start,
                rows, keys, dims, vdims, stride_qm, stride_qd, stride_gm, stride_gd, stride_mm, stride_mn,
                q_len, kv_len, causal_offset, scale,
                HEAD_DIM, VALUE_DIM, BLOCK_D, BLOCK_DV, MASK_KIND, CAUSAL, False, DOT_PRECISION)
    d_key = d_key * scale
    tl.store(DK + batch * stride_dkb + kv_head * stride_dkh + n_offset * stride_dkn
             + keys[:, None] * stride_dkn + dims[None, :] * stride_dkd, d_key.to(DK.dtype.element_ty),
             mask=key_ok[:, None] & (dims[None, :] < HEAD_DIM))
    tl.store(DV + batch * stride_dvb + kv_head * stride_dvh + n_offset * stride_dvn
             + keys[:, None] * stride_dvn + vdims[None, :] * stride_dvd, d_value.to(DV.dtype.element_ty),
             mask=key_ok[:, None] & (vdims[None, :] < VALUE_DIM))


@triton.jit
def _query_grad_step(d_query, q, grad, lse, delta, k_head, v_head, mask_rows, m_start, n_start, rows, cols, dims,
                     vdims, stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn,
                     q_len, kv_len, causal_offset, scale,
                     HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, EDGE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One key block's contribution to a query block's dQ."""
    n_offset = tl.cast(n_start, tl.int64)
    key_ok = n_start + cols < kv_len
    k = load_tile(k_head + n_offset * stride_kn + cols[:, None] * stride_kn + dims[None, :] * stride_kd,
                  key_ok[:, None], dims[None, :] < HEAD_DIM, EDGE, BLOCK_D != HEAD_DIM)  # [BLOCK_N, BLOCK_D]
    v = load_tile(v_head + n_offset * stride_vn + cols[:, None] * stride_vn + vdims[None, :] * stride_vd,
                  key_ok[:, None], vdims[None, :] < VALUE_DIM, EDGE, BLOCK_DV != VALUE_DIM)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    scores = score_tile(qk, rows[:, None], cols[None, :], m_start, n_start, mask_rows + n_offset * stride_mn,
                        stride_mm, stride_mn, q_len, kv_len, causal_offset, scale, MASK_KIND, CAUSAL, EDGE)
    probs = exp_of(scores - lse[:, None], MASK_KIND == FLOAT_MASK)
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
    pid = tl.program_id(0)
    head_row = pid // query_blocks
    block = pid % query_blocks
    if CAUSAL:
        block = query_blocks - 1 - block
    m_start = block * BLOCK_M
    batch = tl.cast(head_row // q_heads, tl.int64)
    head = head_row % q_heads
    kv_head = tl.cast(head // group, tl.int64)
    head = tl.cast(head, tl.int64)
    m_offset = tl.cast(m_start, tl.int64)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)
    row_ok = m_start + rows < q_len
    q = load_tile(Q + batch * stride_qb + head * stride_qh + m_offset * stride_qm
                  + rows[:, None] * stride_qm + dims[None, :] * stride_qd,
                  row_ok[:, None], dims[None, :] < HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    grad = load_tile(GradOut + batch * stride_gb + head * stride_gh + m_offset * stride_gm
                     + rows[:, None] * stride_gm + vdims[None, :] * stride_gd,
                     row_ok[:, None], vdims[None, :] < VALUE_DIM, True, BLOCK_DV != VALUE_DIM)
    row_offset = tl.cast(head_row, tl.int64) * q_len + m_offset
    lse = lse_in_units(tl.load(Lse + row_offset + rows, mask=row_ok, other=float("inf")), MASK_KIND == FLOAT_MASK)
    delta = tl.load(Delta + row_offset + rows, mask=row_ok, other=0.0)
    k_head = K + batch * stride_kb + kv_head * stride_kh
    v_head = V + batch * stride_vb + kv_head * stride_vh
    mask_rows = Mask + batch * stride_mb + head * stride_mh + m_offset * stride_mm
    d_query = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full_end, end = key_range(m_start, q_len, kv_len, causal_offset, BLOCK_M, BLOCK_N, CAUSAL)
    for n_start in range(0, full_end, BLOCK_N):
        d_query = _query_grad_step(
            d_query, q, grad, lse, delta, k_head, v_head, mask_rows, m_start, n_start, rows, cols, dims, vdims,
            stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, q_len, kv_len, causal_offset, scale,
            HEAD_DIM, VALUE_DIM, BLOCK_D, BLOCK_DV, MASK_KIND, CAUSAL, False, DOT_PRECISION)
    for n_start in range(full_end, end, BLOCK_N):
        d_query = _query_grad_step(
            d_query, q, grad, lse, delta, k_head, v_head, mask_rows, m_start, n_start, rows, cols, dims, vdims,
            stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn, q_len, kv_len, causal_offset, scale,
            HEAD_DIM, VALUE_DIM, BLOCK_D, BLOCK_DV, MASK_KIND, CAUSAL, True, DOT_PRECISION)
    d_query = d_query * scale
    tl.store(DQ + batch * stride_dqb + head * stride_dqh + m_offset * stride_dqm
             + rows[:, None] * stride_dqm + dims[None, :] * stride_dqd, d_query.to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & (dims[None, :] < HEAD_DIM))


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
    strides = (*query.stride(), *key.stride(), *value.stride(), *mask_strides(mask), *grad_out.stride())
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
