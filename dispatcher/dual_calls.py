"""Calls with a forward-mode AD dual tensor (``torch.autograd.forward_ad.make_dual``): PyTorch's SDPA
serves them, never a failure remembered against the bucket.

A dual input makes some kernels raise (PyTorch's CPU flash: NotImplementedError "Trying to use
forward AD with _scaled_dot_product_flash_attention_for_cpu"); the dispatcher's recovery used to
remember that failure for the size bucket and fall back, so one dual call moved every later plain
call of the bucket to ``sdpa_math`` and returned a result where PyTorch raises (a new user's
trial). Tangents are looked for only once a kernel has raised (`cold_path.ColdPath.recover`,
`TrainingCalls._training`) and where a bucket is decided on the call's inputs (`DevicePlanner.plan`:
no timing on duals): a warm call, or a new exact shape in a decided bucket, pays nothing. A dual call whose kernel ran without raising
keeps that kernel's result (its forward-AD tangent follows the kernel's own ops).
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad

from attn_dispatch.dispatcher import sdpa_context


def carries_tangent(*tensors: torch.Tensor | None) -> bool:
    """Whether any plain tensor given is a forward-AD dual at the current dual level
    (``forward_ad.unpack_dual(t).tangent``; outside ``forward_ad.dual_level()`` none is; torch 1.9+).
    A tensor subclass (a `CausalBias`, whose storage is never read) counts as no dual."""
    return any(t.__class__ is torch.Tensor and forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def pytorch_dual_call(key_: tuple, query, key, value, attn_mask, scale, enable_gqa) -> torch.Tensor:
    """PyTorch's SDPA on an inference-route call (no dropout) planned under `key_`
    (`_plan.cache_key`, whose second-to-last field is the call's ``is_causal``): its result or its
    exception."""
    is_causal = key_[-2]
    return sdpa_context.pytorch_attention(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa)
