"""`triton_flash`'s kernels as PyTorch operators with a backward (imported on the first run).

Where PyTorch has `torch.library.triton_op` (torch >= 2.6), the forward and the backward are
custom operators built the way PyTorch documents for user-defined Triton kernels: each launch is
wrapped by `torch.library.wrap_triton`, so `torch.compile` traces them with no graph break and
Inductor sees the kernels, and the forward's autograd formula is registered with
`register_autograd`. On an older torch the same functions run as plain calls under a
`torch.autograd.Function`. Nothing on the launch path synchronises with the device, so the
calls can be captured in CUDA (HIP) graphs.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_dispatch.kernels._triton_flash_backward import launch_backward
from attn_dispatch.kernels._triton_flash_config import FlashConfig, backward_blocks, mask_element_bytes
from attn_dispatch.kernels._triton_flash_forward import launch_forward
from attn_dispatch.kernels._triton_ops import TORCH_HAS_TRITON_OP as HAS_TRITON_OP
from attn_dispatch.kernels._triton_ops import eager_tensors, on_device, wrap_triton
from attn_dispatch.kernels._triton_support import shared_memory_limit

FORWARD_OP = "attn_dispatch::triton_flash_forward"
BACKWARD_OP = "attn_dispatch::triton_flash_backward"


def _mask_bytes(mask: torch.Tensor | None, query: torch.Tensor) -> int:
    """`mask_element_bytes` of the mask a kernel reads (None: no mask)."""
    if mask is None:
        return 0
    return mask_element_bytes("bool" if mask.dtype == torch.bool else "float", query.element_size())


def _forward(
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


def _backward_op(
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


def _setup_context(ctx, inputs, output) -> None:
    query, key, value, mask, scale, causal, causal_offset, block_m, block_n, warps, stages, _ = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, mask, out, lse)
    ctx.settings = (scale, causal, causal_offset, block_m, block_n, warps, stages)


def _backward(ctx, grad_out, _grad_lse):
    query, key, value, mask, out, lse = ctx.saved_tensors
    d_query, d_key, d_value = backward_op(grad_out, query, key, value, mask, out, lse, *ctx.settings)
    return (d_query, d_key, d_value) + (None,) * 9


if HAS_TRITON_OP:
    forward_op = torch.library.triton_op(FORWARD_OP, _forward, mutates_args=())
    backward_op = torch.library.triton_op(BACKWARD_OP, _backward_op, mutates_args=())
    forward_op.register_autograd(_backward, setup_context=_setup_context)
    differentiable_forward = forward_op
else:  # torch < 2.6: plain calls

    class _FlashAttention(torch.autograd.Function):
        @staticmethod
        def forward(*inputs):
            return _forward(*inputs)

        setup_context = staticmethod(_setup_context)
        backward = staticmethod(_backward)

    forward_op = _forward
    backward_op = _backward_op
    differentiable_forward = _FlashAttention.apply


def flash_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                    scale: float, causal: bool, causal_offset: int, config: FlashConfig,
                    with_backward: bool) -> torch.Tensor:
    """`triton_flash` on canonical inputs -> ``[B, Hq, L, Ev]`` in the input dtype; differentiable
    in query, key and value when `with_backward` (the log-sum-exp is then kept for the backward).
    An inference call on eager tensors runs the forward directly, without the operator's dispatch."""
    if with_backward:
        run = differentiable_forward
    else:
        run = _forward if eager_tensors(query, key, value, mask) else forward_op
    out, _ = run(query, key, value, mask, float(scale), bool(causal), int(causal_offset), *config, with_backward)
    return out
