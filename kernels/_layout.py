"""SDPA input validation and the canonical 4-D views kernels compute on: query ``[B, Hq, L, E]``, key ``[B, Hkv, S,
E]``, value ``[B, Hkv, S, Ev]``, mask ``[B|1, Hq|1, L|1, S|1]``, ``B`` folding every leading dimension. Copies only
where inputs broadcast or leading dimensions cannot merge (`canonicalisation_bytes`)."""

from __future__ import annotations

import math
import sys
from typing import NamedTuple

import torch

from attn_dispatch.kernels._blocks import causal_blocked
from attn_dispatch.kernels.problem import DTYPE_NAMES, Problem

CAUSAL_BIAS_MODULE = "torch.nn.attention.bias"
"""Where `CausalBias` lives; looked up in `sys.modules`, never imported (it imports `torch._dynamo`)."""


def is_causal_bias(attn_mask: object) -> bool:
    """Whether `attn_mask` is a `CausalBias` (a tensor subclass with uninitialised storage: never read it as a mask)."""
    module = sys.modules.get(CAUSAL_BIAS_MODULE)
    return module is not None and isinstance(attn_mask, module.CausalBias)


def causal_bias_alignment(bias, is_causal: bool, q_len: int, kv_len: int) -> str:
    """The causal alignment a `CausalBias` means for an ``L x S`` problem, as PyTorch's `CausalBias._dispatch`:
    ``"top_left"`` for upper-left or L == S biases whatever the inputs' lengths, else ``"bottom_right"``. Raises
    ValueError with ``is_causal=True`` and RuntimeError for a lower-right bias made for other lengths."""
    if is_causal:
        raise ValueError("CausalBias should not be used with causal=True: pass the bias or is_causal, not both")
    if bias.seq_len_q == bias.seq_len_kv or bias.variant != sys.modules[CAUSAL_BIAS_MODULE].CausalVariant.LOWER_RIGHT:
        return "top_left"  # PyTorch passes is_causal=True on, whatever the lengths
    if (bias.seq_len_q, bias.seq_len_kv) != (q_len, kv_len):
        raise RuntimeError(f"attn_mask is a CausalBias for seq_len_q={bias.seq_len_q}, "
                           f"seq_len_kv={bias.seq_len_kv} but the query and key have lengths {q_len} and "
                           f"{kv_len}; build it with causal_lower_right({q_len}, {kv_len})")
    return "bottom_right"


class CanonicalInputs(NamedTuple):
    """Inputs in canonical 4-D form plus the shape the output must be given back in."""

    query: torch.Tensor  # [B, Hq, L, E]
    key: torch.Tensor  # [B, Hkv, S, E]
    value: torch.Tensor  # [B, Hkv, S, Ev]
    mask: torch.Tensor | None  # [B|1, Hq|1, L|1, S|1], bool or float
    out_shape: tuple[int, ...]  # [..., Hq, L, Ev] as SDPA returns it


def _check_tensors(query: object, key: object, value: object) -> None:
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if query.is_nested or key.is_nested or value.is_nested:
        raise NotImplementedError("nested tensors (torch.nested) are not described by one Problem: call "
                                  "attn_dispatch.attention (or F.scaled_dot_product_attention), which runs "
                                  "PyTorch's SDPA for them")
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError("Expected query, key and value to be at least 2-D ([..., L, E]), got "
                           f"query.dim()={query.dim()}, key.dim()={key.dim()}, value.dim()={value.dim()}")
    if query.dtype.is_complex:
        raise NotImplementedError("attention is not implemented for complex inputs (query dtype "
                                  f"{query.dtype}); pass float16, bfloat16, float32 or float64 tensors")
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError("Expected query, key and value to have the same dtype, got "
                           f"query.dtype={query.dtype}, key.dtype={key.dtype}, value.dtype={value.dtype}; "
                           "cast them to one dtype first")
    if query.dtype not in DTYPE_NAMES:
        raise RuntimeError(f"query dtype {query.dtype} is not supported: attention needs float16, bfloat16, "
                           "float32 or float64 inputs")
    if not (query.device == key.device == value.device):
        raise RuntimeError("Expected query, key and value on the same device, got "
                           f"query.device={query.device}, key.device={key.device}, "
                           f"value.device={value.device}")
    if key.shape[-1] != query.shape[-1]:
        raise RuntimeError(f"key's head dim (last dimension, {key.shape[-1]}) must equal query's ({query.shape[-1]})")
    if value.shape[-2] != key.shape[-2]:
        raise RuntimeError(f"value's sequence length (dimension -2, {value.shape[-2]}) must equal key's "
                           f"({key.shape[-2]})")


def broadcast_sizes(*shapes) -> tuple[int, ...]:
    """`torch.broadcast_shapes` of integer sizes, computed here (faster); symbolic sizes go to torch's."""
    if not all(type(size) is int for shape in shapes for size in shape):
        return tuple(torch.broadcast_shapes(*shapes))
    ndim = max((len(shape) for shape in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for dim, size in enumerate(shape, ndim - len(shape)):
            if size == out[dim] or size == 1:
                continue
            if out[dim] != 1:
                raise RuntimeError(f"shape {list(shape)} does not broadcast at dimension {dim} (size {out[dim]})")
            out[dim] = size
    return tuple(out)


def _broadcast(shapes: dict[str, tuple[int, ...]], what: str, hint: str = "") -> tuple[int, ...]:
    try:
        return broadcast_sizes(*shapes.values())
    except RuntimeError:
        listed = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
        raise RuntimeError(f"{what} do not broadcast: {listed}{hint}") from None


def _lead_shapes(query, key, value, enable_gqa):
    """(batch_shape, q_heads, kv_heads, broadcast_inputs)."""
    if enable_gqa:
        if min(query.dim(), key.dim(), value.dim()) < 3:
            raise RuntimeError("enable_gqa=True needs a heads dimension: query, key and value must be at "
                               "least 3-D ([..., H, L, E])")
        hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
        if hq % hk or hq % hv:
            raise RuntimeError("Number of heads in key and value must divide the number of heads in query "
                               f"(enable_gqa=True): query has {hq}, key {hk}, value {hv}")
        shapes = {"query": query.shape[:-3], "key": key.shape[:-3], "value": value.shape[:-3]}
        batch_shape = _broadcast(shapes, "batch dimensions (before heads) of query, key and value")
        broadcast = any(s != batch_shape for s in shapes.values()) or hk != hv
        return batch_shape, hq, (hk if hk == hv else hq), broadcast
    shapes = {"query": query.shape[:-2], "key": key.shape[:-2], "value": value.shape[:-2]}
    hint = ""
    if min(query.dim(), key.dim(), value.dim()) >= 3 and query.shape[-3] != key.shape[-3]:
        hint = "; for grouped-query attention (fewer key/value heads) pass enable_gqa=True"
    lead = _broadcast(shapes, "leading dimensions of query, key and value", hint)
    broadcast = any(s != lead for s in shapes.values())
    heads = lead[-1] if lead else 1
    return lead[:-1], heads, heads, broadcast


def _mask_shape(attn_mask, query, batch_shape, heads, q_len, kv_len) -> tuple[str, tuple[int, ...]]:
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype == torch.bool:
        kind = "bool"
    elif attn_mask.dtype in (query.dtype, torch.float32):
        kind = "float"
    else:
        raise RuntimeError("Expected attn_mask dtype to be bool, float32 or the query's dtype "
                           f"({query.dtype}), got {attn_mask.dtype}")
    if attn_mask.device != query.device:
        raise RuntimeError(f"attn_mask is on {attn_mask.device} but query is on {query.device}; move it there")
    full = (*batch_shape, heads, q_len, kv_len)
    try:
        fits = broadcast_sizes(attn_mask.shape, full) == full
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(f"attn_mask of shape {list(attn_mask.shape)} is not broadcastable to the "
                           f"attention shape [..., H, L, S] = {list(full)}")
    padded = (1,) * (len(full) - attn_mask.dim()) + tuple(attn_mask.shape)
    mask_batch = padded[: len(batch_shape)]
    batch = math.prod(batch_shape)
    mask_b = 1 if all(d == 1 for d in mask_batch) else batch
    return kind, (mask_b, *padded[len(batch_shape):])


def describe_inputs(cls, query, key, value, attn_mask, is_causal, enable_gqa) -> Problem:
    """Validate SDPA inputs (SDPA's exception types) and build their `Problem`."""
    _check_tensors(query, key, value)
    batch_shape, q_heads, kv_heads, broadcast = _lead_shapes(query, key, value, enable_gqa)
    q_len, kv_len = query.shape[-2], key.shape[-2]
    mask_kind, mask_shape, alignment = "none", (), "top_left"
    if is_causal_bias(attn_mask):  # causality as an object: no mask is read
        alignment = causal_bias_alignment(attn_mask, is_causal, q_len, kv_len)
        is_causal = True
    elif attn_mask is not None:
        mask_kind, mask_shape = _mask_shape(attn_mask, query, batch_shape, q_heads, q_len, kv_len)
    strided = not (query.is_contiguous() and key.is_contiguous() and value.is_contiguous())
    return cls(batch=math.prod(batch_shape), q_heads=q_heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len,
               head_dim=query.shape[-1], value_dim=value.shape[-1], dtype=DTYPE_NAMES[query.dtype],
               causal=bool(is_causal), mask_kind=mask_kind, mask_shape=mask_shape,
               device_type=query.device.type, strided=strided, broadcast_inputs=broadcast,
               causal_alignment=alignment)


def canonicalisation_bytes(problem: Problem) -> int:
    """Upper bound of the extra bytes `canonicalise` may allocate: `materialised_bytes` and one copy of unmergeable
    strided inputs (only inputs of another rank than 4 whose leading dimensions cannot merge are copied)."""
    extra = materialised_bytes(problem)
    if problem.strided and not problem.broadcast_inputs:
        extra += problem.q_bytes + problem.kv_bytes
    return extra


def materialised_bytes(problem: Problem) -> int:
    """The extra bytes `canonicalise` allocates whatever the inputs' strides: a batch-wide mask, a rebased float
    mask (`rebase_bytes`) and materialised broadcast inputs. Kernels reading the canonical views through their strides
    copy nothing more on 4-D inputs, strided or not."""
    extra = problem.mask_bytes if problem.mask_shape and problem.mask_shape[0] > 1 else 0
    extra += rebase_bytes(problem)
    if problem.broadcast_inputs:
        extra += problem.q_bytes + problem.kv_bytes
    return extra


def _to_4d(tensor: torch.Tensor, batch: int, heads: int) -> torch.Tensor:
    return tensor.reshape(batch, heads, tensor.shape[-2], tensor.shape[-1])


def canonicalise(query, key, value, attn_mask, problem: Problem, enable_gqa: bool) -> CanonicalInputs:
    """Canonical 4-D views of validated inputs (module docstring)."""
    B, Hq, Hkv = problem.batch, problem.q_heads, problem.kv_heads
    if query.dim() == 4 and not problem.broadcast_inputs:
        q4, k4, v4 = query, key, value
        out_shape = (*query.shape[:-1], problem.value_dim)
    else:
        if problem.broadcast_inputs:
            query, key, value = _materialise_broadcast(query, key, value, problem, enable_gqa)
        q4 = _to_4d(query, B, Hq)
        k4 = _to_4d(key, B, Hkv)
        v4 = _to_4d(value, B, Hkv)
        lead = query.shape[:-2]
        out_shape = (*lead, problem.q_len, problem.value_dim)
    mask4 = None
    if attn_mask is not None and problem.mask_kind != "none":  # a CausalBias is in `problem` already
        mask4 = _mask_to_4d(attn_mask, problem, tuple(out_shape[:-3]))
        if needs_rebase(problem):
            mask4 = rebased_float_mask(mask4, problem)
    return CanonicalInputs(q4, k4, v4, mask4, tuple(out_shape))


def _materialise_broadcast(query, key, value, problem: Problem, enable_gqa: bool):
    if enable_gqa:
        batch_shape = broadcast_sizes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
        hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
        if hk != hv:
            key = key.repeat_interleave(hq // hk, dim=-3)
            value = value.repeat_interleave(hq // hv, dim=-3)
        query = query.expand(*batch_shape, *query.shape[-3:])
        key = key.expand(*batch_shape, *key.shape[-3:])
        value = value.expand(*batch_shape, *value.shape[-3:])
    else:
        lead = broadcast_sizes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
        query = query.expand(*lead, *query.shape[-2:])
        key = key.expand(*lead, *key.shape[-2:])
        value = value.expand(*lead, *value.shape[-2:])
    if query.dim() == 2:
        return query, key, value
    return query.contiguous(), key.contiguous(), value.contiguous()


def _mask_to_4d(attn_mask: torch.Tensor, problem: Problem, batch_shape: tuple[int, ...]) -> torch.Tensor:
    """``[..., L|1, S|1]`` mask -> ``[B|1, H|1, L|1, S|1]`` (a view unless batch dims broadcast partially)."""
    mask_b = problem.mask_shape[0]
    if attn_mask.dim() == 4 and attn_mask.shape[0] == mask_b:
        return attn_mask
    n_full = len(batch_shape) + 3
    padded = attn_mask.reshape((1,) * (n_full - attn_mask.dim()) + tuple(attn_mask.shape))
    tail = tuple(padded.shape[len(batch_shape):])
    lead = tuple(padded.shape[: len(batch_shape)])
    if mask_b == 1 or lead == tuple(batch_shape):
        return padded.reshape(mask_b, *tail)
    return padded.expand(*batch_shape, *tail).reshape(mask_b, *tail)


# float masks on half inputs rebased so each row's largest visible entry is zero (softmax ignores the shift,
# a half-precision sum does not); rows with no finite largest entry, or one beyond `REBASE_LIMIT`, stay

REBASE_LIMIT = 2.0**40
"""Largest row shift removed: up to it float64 keeps the scores after adding the shift; fp16's -65504 is far inside,
bf16's and fp32's lowest values far outside."""


def needs_rebase(problem: Problem) -> bool:
    """Float masks on half-precision inputs with keys and queries (an empty row has no max)."""
    return problem.mask_kind == "float" and problem.itemsize < 4 and problem.q_len > 0 and problem.kv_len > 0


def rebased_float_mask(mask: torch.Tensor, problem: Problem) -> torch.Tensor:
    """``mask`` minus each row's largest visible entry: a new ``[B|1, H|1, L|1 (L when causal), S]`` tensor."""
    visible = mask
    if problem.causal:
        blocked = causal_blocked(slice(0, problem.q_len), slice(0, problem.kv_len), mask.device, problem.causal_offset)
        if blocked is not None:
            visible = mask.expand(*mask.shape[:2], problem.q_len, problem.kv_len).masked_fill(blocked, -math.inf)
    top = visible.amax(dim=-1, keepdim=True)
    removable = torch.isfinite(top) & (top.abs() <= REBASE_LIMIT)
    return mask - torch.where(removable, top, torch.zeros_like(top))


FUSED_PENALTY_FLOOR = 2.0**100
"""Most negative finite mask entry a fused GPU backend is given. Fused kernels scale scores by log2(e) before exp2,
so bf16's or fp32's lowest value (transformers' padding) overflows to -inf and fully penalised rows come out zero
where SDPA attends uniformly; -2^100 gives SDPA's answer. -inf stays -inf."""


def floor_penalties_(bias: torch.Tensor) -> torch.Tensor:
    """``bias`` with finite entries below `-FUSED_PENALTY_FLOOR` raised to it, in place (fp16 returned unchanged)."""
    if bias.dtype == torch.float16:
        return bias
    return bias.masked_fill_((bias < -FUSED_PENALTY_FLOOR) & (bias > -math.inf), -FUSED_PENALTY_FLOOR)


PER_ROW_TEMPORARY_BYTES = 32
"""`rebased_float_mask`'s per-row temporaries (row max, tests, zeros, shift; rounded up)."""


def rebase_bytes(problem: Problem) -> int:
    """Upper bound of what `rebased_float_mask` allocates (with causality also the visible copy and causal block)."""
    if not needs_rebase(problem):
        return 0
    batch_heads = math.prod(problem.mask_shape[:2])
    rows = batch_heads * (problem.q_len if problem.causal else problem.mask_shape[2])
    dense = rows * problem.kv_len * 4
    extra = dense + rows * PER_ROW_TEMPORARY_BYTES
    if problem.causal:
        extra += dense + problem.q_len * problem.kv_len + 8 * (problem.q_len + problem.kv_len)
    return extra
