"""`sdpa_gqa_fold`: PyTorch's own SDPA with each GQA group's query heads folded into rows: query ``[B, Hq, L, E]``
viewed as ``[B, Hkv, G * L, E]`` is plain multi-head attention against K/V, so SDPA never repeats K/V. Exact where
every row keeps its own keys: one query row, or no causality (a mask is folded along)."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_backends import BareCall, aten_binding, pytorch_sdpa
from attn_dispatch.kernels.sdpa_default import SdpaDefaultKernel


def fold_mask(mask: torch.Tensor, problem: Problem) -> torch.Tensor:
    """Canonical mask -> the folded rows' ``[B|1, Hkv|1, G * L|1, S|1]``: itself, a view, or a copy."""
    mask_b, mask_h, mask_l, mask_s = mask.shape
    if mask_h == 1 and mask_l == 1:
        return mask  # the same for every folded row
    group, q_len = problem.gqa_ratio, problem.q_len
    if mask_h == 1:  # varies over positions only: repeated for each head of the group
        return mask.expand(mask_b, group, q_len, mask_s).reshape(mask_b, 1, group * q_len, mask_s)
    return mask.expand(mask_b, problem.q_heads, q_len, mask_s).reshape(mask_b, problem.kv_heads, group * q_len, mask_s)


def fold_mask_bytes(problem: Problem) -> int:
    """Upper bound of `fold_mask`'s copy."""
    if not problem.mask_shape or problem.q_len == 1:
        return 0
    mask_b, mask_h, mask_l, mask_s = problem.mask_shape
    if mask_h == 1 and mask_l == 1:
        return 0
    heads = problem.kv_heads if mask_h > 1 else 1
    element = problem.mask_bytes // max(math.prod(problem.mask_shape), 1)
    return mask_b * heads * problem.gqa_ratio * problem.q_len * mask_s * element


def folded_problem(problem: Problem) -> Problem:
    """The plain multi-head problem the fold hands PyTorch: ``Hkv`` heads of ``G * L`` rows, no causality."""
    mask_shape = problem.mask_shape
    if mask_shape:
        mask_b, mask_h, mask_l, mask_s = mask_shape
        if mask_h > 1 or mask_l > 1:
            mask_shape = (mask_b, problem.kv_heads if mask_h > 1 else 1, problem.gqa_ratio * problem.q_len, mask_s)
    return replace(problem, q_heads=problem.kv_heads, q_len=problem.gqa_ratio * problem.q_len, causal=False,
                   causal_alignment="top_left", mask_shape=mask_shape)


class SdpaGqaFoldKernel(SdpaDefaultKernel):
    """PyTorch's SDPA (its own backend choice) on GQA inputs folded into rows: no K/V repeat."""

    family = "sdpa_gqa_fold"

    def _own_reasons(self, problem: Problem) -> list[str]:
        why = []
        if problem.gqa_ratio == 1:
            why.append("no grouped-query attention (as many query heads as K/V heads): nothing to fold; "
                       "sdpa_default makes the same call")
        if problem.causal and not _causality_hides_nothing(problem):
            why.append("causal with rows that see different keys: folded rows would take each other's diagonal "
                       "(the fold is exact for one query row against a cache, or without causality)")
        if why:
            return why
        return super()._own_reasons(folded_problem(problem))

    def workspace_bytes(self, problem: Problem) -> int:
        """PyTorch's default call on the folded problem, plus copies of folded query, output and mask."""
        if problem.gqa_ratio == 1:
            return super().workspace_bytes(problem)
        folded = folded_problem(problem)
        return (super().workspace_bytes(folded) + self.input_copy_bytes(problem) + problem.q_bytes
                + problem.out_bytes + fold_mask_bytes(problem))

    # ------------------------------------------------------------------ running
    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem: Problem) -> torch.Tensor:
        """Canonicalise, then fold (never `sdpa_default`'s unfolded shortcut)."""
        return Kernel.run(self, query, key, value, attn_mask, scale, enable_gqa, problem)

    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        folded = folded_problem(problem)
        rows = query.reshape(problem.batch, problem.kv_heads, folded.q_len, problem.head_dim)
        folded_mask = None if mask is None else fold_mask(mask, problem)
        out = super()._forward(rows, key, value, folded_mask, folded, scale)
        return out.reshape(problem.batch, problem.q_heads, problem.q_len, problem.value_dim)

    def runner(self, problem: Problem):
        """Without a mask, on non-broadcast 4-D inputs: the folded SDPA call with only two reshapes around it, or on
        a CPU the fused CPU kernel's operator itself (`_cpu_flash_takes`, `bare_call`); else `run`."""
        if problem.mask_kind != "none" or problem.broadcast_inputs or problem.is_degenerate or problem.gqa_ratio == 1:
            return self.run
        rows = (problem.batch, problem.kv_heads, problem.gqa_ratio * problem.q_len, problem.head_dim)
        out_shape = (problem.batch, problem.q_heads, problem.q_len, problem.value_dim)
        run, strided = self.run, problem.strided
        if _cpu_flash_takes(problem):
            cpu_flash = aten_binding(CPU_FLASH_OPERATOR)

            def folded_cpu(query, key, value, mask, scale, enable_gqa, problem):
                if query.dim() != 4 or strided and not (query.stride(-1) == key.stride(-1) == value.stride(-1) == 1):
                    return run(query, key, value, mask, scale, enable_gqa, problem)
                return cpu_flash(query.reshape(rows), key, value, 0.0, False, scale=scale)[0].reshape(out_shape)

            return folded_cpu

        def folded(query, key, value, mask, scale, enable_gqa, problem):
            if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
                return run(query, key, value, mask, scale, enable_gqa, problem)
            return pytorch_sdpa(query.reshape(rows), key, value, scale=scale).reshape(out_shape)

        return folded

    def sdpa_call(self, problem: Problem) -> None:
        """None: PyTorch gets the folded call (`runner`), never the caller's as given."""
        return None

    def bare_call(self, problem: Problem) -> BareCall | None:
        """The fused CPU kernel's operator on the folded rows where `runner` calls it; else None."""
        if (problem.mask_kind != "none" or problem.broadcast_inputs or problem.is_degenerate
                or problem.gqa_ratio == 1 or not _cpu_flash_takes(problem)):
            return None
        return BareCall("flash_cpu", (problem.batch, problem.kv_heads, problem.gqa_ratio * problem.q_len, problem.head_dim),
                        (problem.batch, problem.q_heads, problem.q_len, problem.value_dim))


CPU_FLASH_OPERATOR = "_scaled_dot_product_flash_attention_for_cpu"
CPU_FLASH_DTYPES = ("float32", "float64", "bfloat16", "float16")


def _cpu_flash_takes(problem: Problem) -> bool:
    """Whether PyTorch's SDPA runs the folded call (no mask, 4-D, last dimension dense) on its fused CPU kernel (one
    head dim for Q, K and V; `use_flash_attention_cpp`). `sdpa_kernel` restrictions never reach a runner
    (`dispatcher.sdpa_context`)."""
    return (problem.device_type == "cpu" and problem.dtype in CPU_FLASH_DTYPES
            and problem.value_dim == problem.head_dim)


def _causality_hides_nothing(problem: Problem) -> bool:
    """Whether causality leaves every row every key: one query row whose diagonal reaches the last key."""
    return problem.q_len == 1 and problem.causal_offset >= problem.kv_len - 1
