"""Random inputs for a `Problem` (never zeros), rotated so timings don't come from cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.problem import Problem

# Fraction of keys a random bool mask lets each query attend.
MASK_KEEP_PROBABILITY = 0.9
# Rotate among input sets whose total size is at least this multiple of the last-level cache
# (METHOD.md: "If the inputs fit in the cache ... rotate among several input sets").
CACHE_MULTIPLE = 2
MAX_INPUT_SETS = 8
# Last-level cache sizes used when the device does not report one: H200 L2 is 60 MB (measured
# through torch on the H200, device/KINDS.md); 32 MiB covers common server CPU L3 slices.
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

    def kwargs(self) -> dict:
        return {"attn_mask": self.attn_mask, "is_causal": self.is_causal, "enable_gqa": self.enable_gqa}


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
    one_set = max(problem.q_bytes + problem.kv_bytes + problem.mask_bytes, 1)
    wanted = -(-CACHE_MULTIPLE * cache_bytes(device) // one_set)
    if memory_cap_bytes is not None:
        wanted = min(wanted, max(1, memory_cap_bytes // one_set))
    return int(max(1, min(MAX_INPUT_SETS, wanted)))
