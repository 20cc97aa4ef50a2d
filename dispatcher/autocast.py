"""SDPA's behaviour under `torch.autocast`, for the dispatcher's own kernels.

Autocast casts `F.scaled_dot_product_attention`'s floating inputs to its lower precision (CUDA:
float16 by default; CPU: bfloat16) before the call: query, key, value and a float mask, each on
the autocast's device type and not float64 (autocast's `is_eligible`), and the result comes out in
that dtype. The dispatcher is a Python function autocast never sees, so without this a
`Dispatcher` limited to our kernels would compute and return float32 under a bfloat16 autocast
where PyTorch returns bfloat16. The inputs are cast the same way and
the call runs with that device's autocast off, as autocast itself runs the operator: our kernels
then compute exactly as on inputs of that dtype.
"""

from __future__ import annotations

import torch

from attn_dispatch.kernels._layout import is_causal_bias

any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: False)
"""``() -> bool``: some device's autocast is on (one C call; the warm path reads it only where the
hot path missed)."""


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast casts SDPA's inputs to on `device_type` now, or None where it is off."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except (TypeError, RuntimeError, AttributeError):  # a device type autocast does not know
        return None


def autocast_inputs(query, key, value, attn_mask) -> tuple | None:
    """``(query, key, value, attn_mask)`` as autocast hands them to SDPA (a `CausalBias` mask as
    given), or None where autocast is off for the query's device type (or the arguments are not
    tensors: validation speaks then)."""
    try:
        device_type = query.device.type
    except AttributeError:
        return None
    dtype = autocast_dtype(device_type)
    if dtype is None:
        return None

    def cast(tensor):
        if (isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.dtype != torch.float64
                and tensor.device.type == device_type and tensor.dtype != dtype
                and not is_causal_bias(tensor)):  # a lower-right `CausalBias`: no values, nothing to cast
            return tensor.to(dtype)
        return tensor

    return cast(query), cast(key), cast(value), cast(attn_mask)


def attention_under_autocast(attention, inputs: tuple, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:
    """`attention` (a dispatcher's) on the cast `inputs`, with their device's autocast off."""
    query, key, value, attn_mask = inputs
    with torch.autocast(query.device.type, enabled=False):
        return attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
