"""A short, independent float64 reference for SDPA semantics, and the error metric kernels are
judged by (tests and calibration's numerics gate)."""

from __future__ import annotations

import math

import torch


def reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                        scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """SDPA in float64 on the inputs' device -> ``[..., Hq, L, Ev]``: bool masks True = attend, float masks added,
    ``is_causal`` top-left and combined with a mask, fully blocked rows zero."""
    q, k, v = query.double(), key.double(), value.double()
    if enable_gqa and q.dim() >= 3:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    L, S = q.shape[-2], k.shape[-2]
    allowed = torch.ones(L, S, dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = allowed.tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.double()
    row_max = scores.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0) if S else scores.sum(-1, keepdim=True)
    weights = (scores - row_max).exp()
    total = weights.sum(dim=-1, keepdim=True)
    weights = weights / total.masked_fill(total == 0, 1.0)
    return torch.matmul(weights, v)


def relative_errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(relative L2 error, largest element error / largest reference element) in float64; ``(inf, inf)`` for NaN or
    inf in `out`."""
    out64 = out.detach().double()
    ref64 = ref.detach().double().to(out64.device)
    if out64.shape != ref64.shape:
        raise ValueError(f"output shape {tuple(out64.shape)} != reference shape {tuple(ref64.shape)}")
    if out64.numel() == 0:
        return 0.0, 0.0
    if not torch.isfinite(out64).all():
        return math.inf, math.inf
    diff = out64 - ref64
    ref_norm = ref64.norm().item()
    ref_max = ref64.abs().max().item()
    tiny = torch.finfo(torch.float64).tiny
    return diff.norm().item() / max(ref_norm, tiny), diff.abs().max().item() / max(ref_max, tiny)
