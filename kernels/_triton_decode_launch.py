"""Launching `triton_decode`'s Triton programs (`_triton_decode_kernels`) on canonical inputs: directly
on eager tensors, else as the operator ``torch.ops.attn_dispatch.triton_decode``
(`_triton_decode_operator`: traced by `torch.compile`). Imported on the kernel's first run: it
imports Triton.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_dispatch.kernels._triton_decode_kernels import merge_kernel, split_kernel
from attn_dispatch.kernels._triton_decode_layout import DecodeLayout, key_limit
from attn_dispatch.kernels._triton_ops import (
    broadcast_strides,
    dot_precision,
    eager_tensors,
    mask_kind,
    mask_operand,
    on_device,
    tracing,
    wrap_triton,
)


def launch_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: Optional[torch.Tensor],  # noqa: UP045 - torch.library's schema inference reads this annotation
    scale: float,
    causal: bool,
    causal_offset: int,
    splits: int,
    block_n: int,
    warps: int,
    stages: int,
) -> torch.Tensor:
    """Split-KV attention of canonical inputs: query ``[B, Hq, L, E]``, key ``[B, Hkv, S, E]``,
    value ``[B, Hkv, S, Ev]`` (any strides), mask ``[B|1, Hq|1, L|1, S|1]`` (bool or float, or
    None), causality with the diagonal shifted by `causal_offset`. Returns a new contiguous
    ``[B, Hq, L, Ev]`` in the query's dtype. `splits` is the most splits of the keys; `block_n`,
    `warps`, `stages`: keys per step, ``num_warps`` and ``num_stages`` of the split program."""
    batch, q_heads, q_len, head_dim = query.shape
    kv_heads, kv_len, value_dim = key.shape[1], key.shape[2], value.shape[3]
    group = q_heads // kv_heads
    layout = DecodeLayout.from_sizes(group * q_len, head_dim, value_dim,
                                     key_limit(kv_len, q_len, causal, causal_offset), splits, block_n)
    out = query.new_empty(batch, q_heads, q_len, value_dim)
    if layout.direct:  # the split program writes `out`; the partial buffers are never touched
        part_out = part_max = part_sum = out
    else:  # one allocation: [B * Hkv, splits, rows] x (Ev outputs, the max, the sum)
        partial_rows = batch * kv_heads * layout.splits * layout.rows
        partials = query.new_empty(partial_rows * (value_dim + 2), dtype=torch.float32)
        part_out = partials[: partial_rows * value_dim]
        part_max = partials[partial_rows * value_dim: partial_rows * (value_dim + 1)]
        part_sum = partials[partial_rows * (value_dim + 1):]
    grid = (batch * kv_heads, layout.splits, layout.row_blocks)
    traced = tracing()
    split, merge = (wrap_triton(split_kernel), wrap_triton(merge_kernel)) if traced else (split_kernel, merge_kernel)
    with on_device(query):
        split[grid](
            query, key, value, mask_operand(mask, query), part_out, part_max, part_sum, out,
            *query.stride(), *key.stride(), *value.stride(), *broadcast_strides(mask), *out.stride(),
            kv_heads, group, q_len, layout.key_count, layout.rows,
            scale, causal_offset, layout.keys_per_split,
            HEAD_DIM=head_dim, VALUE_DIM=value_dim,
            BLOCK_M=layout.block_m, BLOCK_N=layout.block_n, BLOCK_D=layout.block_d, BLOCK_DV=layout.block_dv,
            MASK_KIND=mask_kind(mask), CAUSAL=causal, DIRECT=layout.direct, DOT_PRECISION=dot_precision(query.dtype),
            num_warps=warps, num_stages=stages,
        )
        if not layout.direct:
            merge_grid = (grid[0], -(-layout.rows // layout.merge_block_rows))
            merge[merge_grid](
                part_out, part_max, part_sum, out, *out.stride(),
                kv_heads, group, q_len, layout.rows, layout.splits,
                VALUE_DIM=value_dim, BLOCK_R=layout.merge_block_rows, BLOCK_S=layout.merge_block_splits,
                BLOCK_DV=layout.block_dv,
            )
    return out


def run_decode(query, key, value, mask, scale: float, causal: bool, causal_offset: int, splits: int,
               block_n: int, warps: int, stages: int) -> torch.Tensor:
    """`launch_decode`, called directly on eager tensors and through its operator while PyTorch traces."""
    if eager_tensors(query, key, value, mask):
        launch = launch_decode
    else:
        from attn_dispatch.kernels._triton_decode_operator import triton_decode_operator as launch
    return launch(query, key, value, mask, scale, causal, causal_offset, splits, block_n, warps, stages)
