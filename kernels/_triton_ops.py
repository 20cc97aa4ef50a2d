"""Helpers every Triton family shares (no Triton import): registering a launch of Triton kernels the way PyTorch documents for user-defined Triton kernels
(`torch.library.triton_op` with each kernel launched through `torch.library.wrap_triton`, torch
>= 2.6), so that `torch.compile(fullgraph=True)` traces the launch with no graph break and CUDA
graphs capture it (on an older torch the launch stays a plain function: eager calls only); the
launch's device, `tl.dot` precision and mask operand; a kernel name's parameter check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

TORCH_HAS_TRITON_OP = hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")
"""torch >= 2.6: `torch.library.triton_op` and `torch.library.wrap_triton` exist."""
NO_MASK, BOOL_MASK, FLOAT_MASK = 0, 1, 2
"""The mask kinds the kernels are specialised for (their `MASK_KIND` constexpr argument)."""


def tracing() -> bool:
    """Whether PyTorch is tracing rather than running: `torch.compile`'s Dynamo, or a dispatch mode
    (fake, functional or proxy tensors: AOTAutograd, `make_fx`, export) is active."""
    return torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None


def wrap_triton(kernel):
    """``kernel`` made traceable (`torch.library.wrap_triton`) while PyTorch traces, else the
    kernel itself (an eager launch through the wrapper's higher-order operator would cost far more
    than the launch). Launch as ``wrap_triton(kernel)[grid](...)``."""
    return torch.library.wrap_triton(kernel) if TORCH_HAS_TRITON_OP and tracing() else kernel


def triton_operator(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` (tensors in, a new tensor out, launching Triton kernels through
    `wrap_triton`) as the operator ``torch.ops.<name>`` with `torch.library.triton_op` and
    return that operator; on a torch without it return `fn` unchanged. Registering reads `fn`'s
    source with Inductor's helpers, whose import takes about a second: the operators live in their
    own modules (`_triton_decode_operator`, `_triton_flash_operators`), imported only where a call
    is traced or differentiated (under `torch.compile`, Dynamo runs an import inside the traced
    code as a plain import), never by an eager inference call."""

    def register(fn: Callable) -> Callable:
        if not TORCH_HAS_TRITON_OP:
            return fn
        return torch.library.triton_op(name, mutates_args=())(fn)

    return register


def eager_tensors(*tensors: torch.Tensor | None) -> bool:
    """Whether a launch on `tensors` may skip the operator layer: plain tensors and nothing tracing.
    There the registered function is called directly, saving the operator's dispatch per call."""
    return not tracing() and all(t is None or type(t) is torch.Tensor for t in tensors)


def on_device(tensor: torch.Tensor):
    """Context in which a Triton launch targets `tensor`'s GPU (Triton launches on the current
    device); a no-op where that is the current one already, and on the CPU."""
    if tensor.device.type == "cuda" and tensor.device.index != torch.cuda.current_device():
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()


def dot_precision(dtype: torch.dtype) -> str | None:
    """``input_precision`` of a kernel's `tl.dot` on `dtype` inputs: "ieee" for fp32 (tf32's ~3e-4
    relative error is past fp32's tolerance), None (Triton's default) for half inputs, where it
    changes nothing."""
    return "ieee" if dtype == torch.float32 else None


def broadcast_strides(tensor: torch.Tensor | None) -> tuple[int, ...]:
    """A canonical mask's strides with 0 along every dimension of size 1 (how a kernel broadcasts
    it); zeros without a mask."""
    if tensor is None:
        return (0, 0, 0, 0)
    return tuple(stride if size > 1 else 0 for size, stride in zip(tensor.shape, tensor.stride(), strict=True))


def mask_kind(mask: torch.Tensor | None) -> int:
    """The kernels' `MASK_KIND` for a canonical mask (bool or float, `kernels._layout`), or none."""
    if mask is None:
        return NO_MASK
    return BOOL_MASK if mask.dtype == torch.bool else FLOAT_MASK


def mask_operand(mask: torch.Tensor | None, fallback: torch.Tensor) -> torch.Tensor:
    """What the kernels read as the mask: a bool mask as bytes (a view), a float mask as given,
    and `fallback` (never read) without one."""
    if mask is None:
        return fallback
    return mask.view(torch.uint8) if mask.dtype == torch.bool else mask
