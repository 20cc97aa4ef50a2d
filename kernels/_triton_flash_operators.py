"""`triton_flash`'s forward and backward as PyTorch operators (`_triton_flash_ops`), built the way
PyTorch documents for user-defined Triton kernels where it has `torch.library.triton_op` (torch >=
2.6): `torch.compile` traces them with no graph break and Inductor sees the kernels; the forward's
autograd formula is registered with `register_autograd`. On an older torch the same functions run
as plain calls under a `torch.autograd.Function`. Imported only where a call is traced or
differentiated (registering costs about a second).
"""

from __future__ import annotations

import torch

from attn_dispatch.kernels._triton_flash_ops import backward, backward_launch, forward, setup_context
from attn_dispatch.kernels._triton_ops import TORCH_HAS_TRITON_OP

FORWARD_OP = "attn_dispatch::triton_flash_forward"
BACKWARD_OP = "attn_dispatch::triton_flash_backward"

if TORCH_HAS_TRITON_OP:
    forward_op = torch.library.triton_op(FORWARD_OP, forward, mutates_args=())
    backward_op = torch.library.triton_op(BACKWARD_OP, backward_launch, mutates_args=())
    forward_op.register_autograd(backward, setup_context=setup_context)
    differentiable_forward = forward_op
else:  # torch < 2.6: plain calls

    class _FlashAttention(torch.autograd.Function):
        @staticmethod
        def forward(*inputs):
            return forward(*inputs)

        setup_context = staticmethod(setup_context)
        backward = staticmethod(backward)

    forward_op = forward
    backward_op = backward_launch
    differentiable_forward = _FlashAttention.apply
