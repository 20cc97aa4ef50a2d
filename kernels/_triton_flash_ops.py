"""`triton_flash`'s forward and backward on canonical inputs (imported on the first run), and
`flash_attention`, which runs an eager inference call's forward directly and anything traced or
differentiated through the operators of `_triton_flash_operators`. Each launch goes through
`torch.library.wrap_triton` while PyTorch traces. Nothing on the launch path synchronises with
the device, so the calls can be captured in CUDA (HIP) graphs.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_dispatch.kernels._triton_flash_backward import launch_backward
from attn_dispatch.kernels._triton_flash_config import FlashConfig, backward_blocks, mask_element_bytes
from attn_dispatch.kernels._triton_flash_forward import launch_forward
from attn_dispatch.kernels._triton_ops import eager_tensors, on_device, wrap_triton
from attn_dispatch.kernels._triton_support import shared_memory_limit


def _mask_bytes(mask: torch.Tensor | None, query: torch.Tensor) -> int:
    """`mask_element_bytes` of the mask a kernel reads (None: no mask)."""
    if mask is None:
        return 0
    return mask_element_bytes("bool" if mask.dtype == torch.bool else "float", query.element_size())


def forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: Optional[torch.Tensor],  # noqa: UP045 - torch.library's schema inference reads this annotation
    scale: float,
    causal: bool,
    causal_offset: int,
    block_m: int,
    block_n: int,
    warps: int,
    stages: int,
    store_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical inputs (``[B, Hq, L, E]``, ``[B, Hkv, S, E]``, ``[B, Hkv, S, Ev]``, mask
    ``[B|1, Hq|1, L|1, S|1]`` or None) -> (output ``[B, Hq, L, Ev]`` in the input dtype,
    log-sum-exp ``[B, Hq, L]`` fp32 when `store_lse`, else a 1-element placeholder)."""
    batch, q_heads, q_len, _ = query.shape
    out = query.new_empty(batch, q_heads, q_len, value.shape[-1])
    lse = query.new_empty((batch, q_heads, q_len) if store_lse else (1,), dtype=torch.float32)
    with on_device(query):
        launch_forward(wrap_triton, query, key, value, mask, out, lse, scale, causal, causal_offset,
                       FlashConfig(block_m, block_n, warps, stages), store_lse)
    return out, lse


def backward_launch(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: Optional[torch.Tensor],  # noqa: UP045 - torch.library's schema inference reads this annotation
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    causal: bool,
    causal_offset: int,
    block_m: int,
    block_n: int,
    warps: int,
    stages: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of the canonical query, key and value (their shapes, the input dtype)."""
    delta = torch.empty_like(lse)
    d_query = query.new_empty(query.shape)
    d_key = key.new_empty(key.shape)
    d_value = value.new_empty(value.shape)
    limit = shared_memory_limit(query.device.index) if query.device.type == "cuda" else None
    blocks = backward_blocks(FlashConfig(block_m, block_n, warps, stages), query.shape[-1], value.shape[-1],
                             query.element_size(), limit, _mask_bytes(mask, query))
    with on_device(query):
        launch_backward(wrap_triton, grad_out, query, key, value, mask, out, lse, delta, d_query, d_key, d_value,
                        scale, causal, causal_offset, blocks, warps)
    return d_query, d_key, d_value


def setup_context(ctx, inputs, output) -> None:
    query, key, value, mask, scale, causal, causal_offset, block_m, block_n, warps, stages, _ = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, mask, out, lse)
    ctx.settings = (scale, causal, causal_offset, block_m, block_n, warps, stages)


def backward(ctx, grad_out, _grad_lse):
    """The forward's autograd formula: the backward operator on what `setup_context` saved."""
    from attn_dispatch.kernels._triton_flash_operators import backward_op

    query, key, value, mask, out, lse = ctx.saved_tensors
    d_query, d_key, d_value = backward_op(grad_out, query, key, value, mask, out, lse, *ctx.settings)
    return (d_query, d_key, d_value) + (None,) * 9


def flash_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                    scale: float, causal: bool, causal_offset: int, config: FlashConfig,
                    with_backward: bool) -> torch.Tensor:
    """`triton_flash` on canonical inputs -> ``[B, Hq, L, Ev]`` in the input dtype; differentiable
    in query, key and value when `with_backward` (the log-sum-exp is then kept for the backward).
    An inference call on eager tensors runs the forward directly, without the operator's dispatch
    (or its registration)."""
    if not with_backward and eager_tensors(query, key, value, mask):
        run = forward
    else:
        from attn_dispatch.kernels import _triton_flash_operators as operators

        run = operators.differentiable_forward if with_backward else operators.forward_op
    out, _ = run(query, key, value, mask, float(scale), bool(causal), int(causal_offset), *config, with_backward)
    return out
