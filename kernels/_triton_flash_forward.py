"""`triton_flash`'s forward: FlashAttention-2 in Triton (imported on the kernel's first run).

One program computes one block of query rows of one (batch, query head): a single pass over the
key/value blocks it can see with an online softmax (running row maximum and sum, fp32 output
accumulator), then the normalised output and, when a backward will follow, each row's
log-sum-exp. Key/value head = query head // group (GQA without repeating K/V). Every tensor is
read through its strides (no copies); batch, head and block starts enter pointers as int64, so
tensors past 2**31 elements are addressed correctly.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attn_dispatch.kernels._triton_flash_config import FlashConfig
from attn_dispatch.kernels._triton_flash_tiles import (
    FLOAT_MASK,
    LN2,
    LOG2E,
    ONE,
    key_range,
    load_tile,
    query_block_of_program,
    score_tile,
)
from attn_dispatch.kernels._triton_ops import broadcast_strides, dot_precision, mask_kind, mask_operand
from attn_dispatch.kernels.triton_flash import padded_dim


@triton.jit
def _attend(acc, row_sum, row_max, q, k_block, v_block, mask_block, k_offsets, v_offsets, mask_offsets, k_dims_ok,
            v_dims_ok, q_ok, cols, diagonal, diagonal_limit, keys_left, scale, unit,
            PAD_D: tl.constexpr, PAD_DV: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
            EDGE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One key/value block of the online softmax: returns the updated (acc, row_sum, row_max).
    `k_block`, `v_block`, `mask_block` point at the block's first key; `keys_left` keys remain."""
    key_ok = cols < keys_left
    k = load_tile(k_block + k_offsets, k_dims_ok, key_ok[None, :], PAD_D, EDGE)  # [BLOCK_D, BLOCK_N]
    qk = tl.dot(q, k, input_precision=DOT_PRECISION)
    scores = score_tile(qk, mask_block + mask_offsets, q_ok & key_ok[None, :], key_ok[None, :], diagonal,
                        diagonal_limit, scale, MASK_KIND, CAUSAL, EDGE)
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row with no visible key yet stays at zero
    probs = tl.math.exp2((scores - shift[:, None]) * unit)
    rescale = tl.math.exp2((row_max - shift) * unit)
    row_sum = row_sum * rescale + tl.sum(probs, 1)
    v = load_tile(v_block + v_offsets, key_ok[:, None], v_dims_ok, EDGE, PAD_DV)  # [BLOCK_N, BLOCK_DV]
    acc = acc * rescale[:, None]
    acc = tl.dot(probs.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, row_sum, new_max


@triton.jit
def flash_forward_kernel(
    Q, K, V, Mask, Out, Lse,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_ob, stride_oh, stride_om, stride_od,
    q_heads, group, q_len, kv_len, causal_offset, scale, query_blocks,
    HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
    STORE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Grid ``query_blocks * B * Hq`` (`query_block_of_program`): the output of `BLOCK_M` query rows
    of one (batch, query head), and their log-sum-exp when `STORE_LSE`."""
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64
    head_row, m_start, batch, head, kv_head = query_block_of_program(query_blocks, q_heads, group, BLOCK_M, CAUSAL)
    m_offset = tl.cast(m_start, tl.int64)

    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_DV)
    q_ok = (m_start + rows < q_len)[:, None]
    q_dims_ok = dims[None, :] < HEAD_DIM
    v_dims_ok = vdims[None, :] < VALUE_DIM
    q = load_tile(Q + batch * stride_qb + head * stride_qh + m_offset * stride_qm
                  + rows[:, None] * stride_qm + dims[None, :] * stride_qd, q_ok, q_dims_ok, True, BLOCK_D != HEAD_DIM)
    k_head = K + batch * stride_kb + kv_head * stride_kh
    v_head = V + batch * stride_vb + kv_head * stride_vh
    mask_rows = Mask + batch * stride_mb + head * stride_mh + m_offset * stride_mm
    k_offsets = cols[None, :] * stride_kn + dims[:, None] * stride_kd
    v_offsets = cols[:, None] * stride_vn + vdims[None, :] * stride_vd
    k_dims_ok = dims[:, None] < HEAD_DIM
    if MASK_KIND != 0:
        mask_offsets = rows[:, None] * stride_mm + cols[None, :] * stride_mn
    else:
        mask_offsets = 0
    if CAUSAL:
        diagonal = cols[None, :] - rows[:, None]
    else:
        diagonal = 0
    unit = LOG2E if MASK_KIND == FLOAT_MASK else ONE  # the exponent's factor (module docstring of the tiles)

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    full_end, end = key_range(m_start, q_len, kv_len, causal_offset, BLOCK_M, BLOCK_N, CAUSAL)
    for n_start in range(0, full_end, BLOCK_N):
        n_offset = tl.cast(n_start, tl.int64)
        acc, row_sum, row_max = _attend(
            acc, row_sum, row_max, q, k_head + n_offset * stride_kn, v_head + n_offset * stride_vn,
            mask_rows + n_offset * stride_mn, k_offsets, v_offsets, mask_offsets, k_dims_ok, v_dims_ok, q_ok, cols,
            diagonal, m_start - n_start + causal_offset, kv_len - n_start, scale, unit,
            BLOCK_D != HEAD_DIM, BLOCK_DV != VALUE_DIM, MASK_KIND, CAUSAL, False, DOT_PRECISION)
    for n_start in range(full_end, end, BLOCK_N):
        n_offset = tl.cast(n_start, tl.int64)
        acc, row_sum, row_max = _attend(
            acc, row_sum, row_max, q, k_head + n_offset * stride_kn, v_head + n_offset * stride_vn,
            mask_rows + n_offset * stride_mn, k_offsets, v_offsets, mask_offsets, k_dims_ok, v_dims_ok, q_ok, cols,
            diagonal, m_start - n_start + causal_offset, kv_len - n_start, scale, unit,
            BLOCK_D != HEAD_DIM, BLOCK_DV != VALUE_DIM, MASK_KIND, CAUSAL, True, DOT_PRECISION)

    dead = row_sum == 0.0  # every key blocked: SDPA's zeros
    row_sum = tl.where(dead, 1.0, row_sum)
    out = acc / row_sum[:, None]
    tl.store(Out + batch * stride_ob + head * stride_oh + m_offset * stride_om
             + rows[:, None] * stride_om + vdims[None, :] * stride_od, out.to(Out.dtype.element_ty),
             mask=q_ok & v_dims_ok)
    if STORE_LSE:
        if MASK_KIND == FLOAT_MASK:  # natural units (a maximum of -3.4e38 times log2(e) would overflow)
            lse = row_max + tl.log(row_sum)
        else:
            lse = (row_max + tl.math.log2(row_sum)) * LN2
        lse = tl.where(dead, float("inf"), lse)  # the backward's exp(s - lse) is then 0 on such rows
        tl.store(Lse + tl.cast(head_row, tl.int64) * q_len + m_offset + rows, lse, mask=m_start + rows < q_len)


def launch_forward(launch, query, key, value, mask, out, lse, scale: float, causal: bool, causal_offset: int,
                   config: FlashConfig, store_lse: bool) -> None:
    """Run the forward kernel into `out` ``[B, Hq, L, Ev]`` (and `lse` ``[B, Hq, L]`` fp32 when
    `store_lse`). `launch` wraps the kernel for the caller's context (``torch.library.wrap_triton``
    inside a custom op, or nothing)."""
    batch, q_heads, q_len, _ = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    head_dim, value_dim = int(query.shape[3]), int(value.shape[3])  # compile-time constants of the kernels
    query_blocks = -(-q_len // config.block_m)  # triton.cdiv, without its Python-side call cost
    grid = (query_blocks * batch * q_heads,)
    launch(flash_forward_kernel)[grid](
        query, key, value, mask_operand(mask, query), out, lse,
        *query.stride(), *key.stride(), *value.stride(), *broadcast_strides(mask), *out.stride(),
        q_heads, q_heads // kv_heads, q_len, kv_len, causal_offset, scale, query_blocks,
        HEAD_DIM=head_dim, VALUE_DIM=value_dim, BLOCK_D=padded_dim(head_dim), BLOCK_DV=padded_dim(value_dim),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, MASK_KIND=mask_kind(mask), CAUSAL=causal,
        STORE_LSE=store_lse, DOT_PRECISION=dot_precision(query.dtype),
        num_warps=config.warps, num_stages=config.stages,
    )
