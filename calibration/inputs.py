"""Random inputs for a `Problem` (never zeros), rotated so timings don't come from cache, and the
numerics gate of one point: a kernel's output against the float64 reference on two slices of
the output rows (the head and the tail).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.reference import reference_attention, relative_errors

MASK_KEEP_PROBABILITY = 0.9  # fraction of keys a random bool mask lets each query attend
# Rotate among input sets whose total size is at least this multiple of the last-level cache.
CACHE_MULTIPLE = 2
MAX_INPUT_SETS = 8
# Last-level cache sizes used when the device does not report one.
DEFAULT_GPU_CACHE_BYTES = 60 * 2**20
DEFAULT_CPU_CACHE_BYTES = 32 * 2**20


@dataclass
class AttentionInputs:
    """Keyword arguments of one SDPA call."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    is_causal: bool
    enable_gqa: bool


def make_inputs(problem: Problem, device: torch.device | str, seed: int = 0) -> AttentionInputs:
    """Random inputs matching `problem` on `device` (strided problems get transposed tensors)."""
    device = torch.device(device)
    generator = torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(seed)
    dtype = problem.torch_dtype
    B, L, S = problem.batch, problem.q_len, problem.kv_len

    def tensor(heads: int, length: int, dim: int) -> torch.Tensor:
        if problem.strided:  # [B, length, heads, dim] viewed as [B, heads, length, dim]
            raw = torch.randn(B, length, heads, dim, generator=generator, device=device, dtype=dtype)
            return raw.transpose(1, 2)
        return torch.randn(B, heads, length, dim, generator=generator, device=device, dtype=dtype)

    query = tensor(problem.q_heads, L, problem.head_dim)
    key = tensor(problem.kv_heads, S, problem.head_dim)
    value = tensor(problem.kv_heads, S, problem.value_dim)
    mask = None
    if problem.mask_kind == "bool":
        mask = torch.rand(problem.mask_shape, generator=generator, device=device) < MASK_KEEP_PROBABILITY
    elif problem.mask_kind == "float":
        mask = torch.randn(problem.mask_shape, generator=generator, device=device, dtype=dtype)
    return AttentionInputs(query, key, value, mask, problem.causal, problem.q_heads != problem.kv_heads)


def cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return int(getattr(props, "L2_cache_size", 0) or DEFAULT_GPU_CACHE_BYTES)
    return DEFAULT_CPU_CACHE_BYTES


def rotation_count(problem: Problem, device: torch.device, memory_cap_bytes: int | None = None) -> int:
    """How many input sets to rotate among: enough to exceed the cache `CACHE_MULTIPLE` times,
    at most `MAX_INPUT_SETS`, and no more than fit in `memory_cap_bytes`."""
    one_set = max(problem.input_bytes, 1)
    wanted = -(-CACHE_MULTIPLE * cache_bytes(device) // one_set)
    if memory_cap_bytes is not None:
        wanted = min(wanted, max(1, memory_cap_bytes // one_set))
    return int(max(1, min(MAX_INPUT_SETS, wanted)))


class InputCache:
    """Input sets (and the numerics gate's references) of the one problem measured last, built
    once per problem rather than per kernel; asking for another problem frees the previous one."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._sets: list[AttentionInputs] = []
        self._references: list | None = None

    def input_sets(self, problem: Problem, device: torch.device, seed: int, count: int) -> list[AttentionInputs]:
        """`count` input sets for `problem` (set ``i`` drawn with seed ``seed + i``)."""
        key = (problem, str(device), seed)
        if key != self._key:
            self.clear()
            self._key = key
        while len(self._sets) < count:
            self._sets.append(make_inputs(problem, device, seed + len(self._sets)))
        return self._sets[:count]

    def references(self, problem: Problem, device: torch.device, seed: int) -> list:
        """The gate's float64 reference slices for input set 0 (`reference_slices`)."""
        first = self.input_sets(problem, device, seed, 1)[0]
        if self._references is None:
            self._references = reference_slices(first)
        return self._references

    def clear(self) -> None:
        """Drop every tensor held (call before emptying the allocator after an OOM)."""
        self._key, self._sets, self._references = None, [], None


# Query rows compared in each slice (the tail slice lands in a tiled kernel's last block).
GATE_ROWS = 64


def _row_slices(q_len: int) -> list[slice]:
    head = slice(0, min(GATE_ROWS, q_len))
    if q_len <= GATE_ROWS:
        return [head]
    return [head, slice(q_len - GATE_ROWS, q_len)]


def _slice_mask(inputs: AttentionInputs, batch: slice, rows: slice) -> torch.Tensor | None:
    """The mask for output rows `rows` of batch elements `batch`, with top-left causality folded
    in (the reference's own `is_causal` assumes rows start at 0)."""
    mask = inputs.attn_mask
    if mask is not None:
        mask = mask[batch] if mask.shape[0] > 1 else mask
        if mask.dim() >= 2 and mask.shape[-2] > 1:
            mask = mask[..., rows, :]
    if not inputs.is_causal:
        return mask
    kv_len = inputs.key.shape[-2]
    device = inputs.query.device
    allowed = torch.arange(kv_len, device=device)[None, :] <= torch.arange(rows.start, rows.stop, device=device)[:, None]
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


def reference_slices(inputs: AttentionInputs) -> list[tuple[slice, slice, torch.Tensor]]:
    """(batch slice, row slice, float64 reference ``[1, Hq, rows, Ev]``) for each gated slice."""
    batch_size = inputs.query.shape[0]
    out = []
    for index, rows in enumerate(_row_slices(inputs.query.shape[-2])):
        batch = slice(0, 1) if index == 0 else slice(batch_size - 1, batch_size)
        reference = reference_attention(inputs.query[batch, :, rows], inputs.key[batch], inputs.value[batch],
                                        _slice_mask(inputs, batch, rows), False, enable_gqa=inputs.enable_gqa)
        out.append((batch, rows, reference))
    return out


def gate_errors(out: torch.Tensor, references: list[tuple[slice, slice, torch.Tensor]]) -> tuple[float, float]:
    """Worst (relative L2, relative max) error of ``out [B, Hq, L, Ev]`` over the gated slices."""
    worst_l2, worst_max = 0.0, 0.0
    for batch, rows, reference in references:
        l2, biggest = relative_errors(out[batch, :, rows], reference)
        worst_l2, worst_max = max(worst_l2, l2), max(worst_max, biggest)
    return worst_l2, worst_max
