"""`sdpa_default`: `F.scaled_dot_product_attention` as PyTorch dispatches it by itself (the baseline
the dispatcher must never be slower than), with the repairs PyTorch's backends needed."""

from __future__ import annotations

import math

import torch

from attn_dispatch.kernels._blocks import causal_blocked
from attn_dispatch.kernels._float_mask import floor_penalties_
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_backends import (
    FORCED_BACKENDS,
    TORCH_HAS_ENABLE_GQA,
    SdpaBackendKernel,
    pytorch_sdpa,
)
from attn_dispatch.kernels.sdpa_probe import default_backend_choice, default_zeroes_dead_rows


class SdpaDefaultKernel(SdpaBackendKernel):
    """`F.scaled_dot_product_attention` as PyTorch dispatches it by itself (the baseline)."""

    family = "sdpa_default"
    backend = "default"

    def _own_reasons(self, problem: Problem) -> list[str]:
        if problem.gqa_ratio > 1 and not TORCH_HAS_ENABLE_GQA:
            return ["PyTorch < 2.5 has no enable_gqa in scaled_dot_product_attention"]
        default_backend_choice(problem)  # ask PyTorch now which backend it would take
        return []

    def workspace_bytes(self, problem: Problem) -> int:
        """The workspace of the backend PyTorch picks for problems of this kind on this device
        (asked once per kind of problem with tiny inputs, then cached: see
        `default_backend_choice`; on gfx906, which has no fused kernel, that is the math path's).
        PyTorch repeats K/V for GQA on backends without native support. With a mask, add what
        `_call_pytorch` builds around the call: the mask stored out over keys (when broadcast
        there) and the blocked-key test of the fully-masked-row repair (one byte per element)."""
        family = default_backend_choice(problem)
        chosen = FORCED_BACKENDS[family]()
        extra = chosen.workspace_bytes(problem)
        if family in ("sdpa_efficient", "sdpa_cudnn") and problem.gqa_ratio > 1 and chosen._gqa_mode(problem) != "repeat":
            extra += problem.kv_bytes * problem.gqa_ratio  # counted once: `chosen` may repeat already
        if problem.mask_shape:
            dense_elements = math.prod(problem.mask_shape[:-1]) * problem.kv_len
            if problem.mask_shape[-1] != problem.kv_len:
                extra += dense_elements * (problem.mask_bytes // math.prod(problem.mask_shape))
            extra += dense_elements
        if problem.mask_kind == "float" and problem.device_type != "cpu":  # narrowed or copied to floor penalties
            extra += math.prod(problem.mask_shape[:-1]) * problem.kv_len * 4
        if problem.causal_offset:  # bottom-right causality as a bool mask: ones, causal block, combined
            extra += 3 * problem.q_len * problem.kv_len
        return extra

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem: Problem) -> torch.Tensor:
        """PyTorch's SDPA on the caller's own tensors, with no canonicalisation (it would cost
        several microseconds of host time per call). The cases PyTorch does not take as given (a
        mask together with causality, a 1-D mask (PyTorch raises IndexError on it; SDPA's
        broadcasting allows it), broadcast inputs, a size of 0 (PyTorch's CUDA efficient backward
        asserts on zero heads) go through the base class."""
        if (
            attn_mask is not None and (problem.causal or attn_mask.dim() < 2)
            or problem.broadcast_inputs
            or problem.is_degenerate
            or _mask_needs_query_dtype(problem)
        ):
            return super().run(query, key, value, attn_mask, scale, enable_gqa, problem)
        return self._call_pytorch(query, key, value, attn_mask, problem.causal, scale, enable_gqa)

    def runner(self, problem: Problem):
        """Without a mask, on inputs PyTorch takes as given, the bare
        ``torch._C._nn.scaled_dot_product_attention`` call with the flags bound: the warm path of a
        20 us call then adds no Python frame of ours around PyTorch's (`run` adds three). With a
        mask, on a CPU whose SDPA zeroes fully masked rows itself: the bare call too (`run` would
        add its own checks to every masked call)."""
        if problem.mask_kind != "none":
            return self._masked_runner(problem)
        if problem.broadcast_inputs or problem.causal_offset or problem.is_degenerate:
            return self.run
        causal = problem.causal  # flags by keyword, dropout left out: PyTorch parses a positional 0.0 on every call
        if problem.gqa_ratio > 1:
            if not TORCH_HAS_ENABLE_GQA:
                return self.run
            return lambda q, k, v, mask, scale, gqa, problem: pytorch_sdpa(q, k, v, is_causal=causal, scale=scale,
                                                                           enable_gqa=True)
        return lambda q, k, v, mask, scale, gqa, problem: pytorch_sdpa(q, k, v, is_causal=causal, scale=scale)

    def sdpa_call(self, problem: Problem) -> tuple[bool, bool, bool] | None:
        """Where `runner` is the bare call (see there), the flags of that call (`Kernel.sdpa_call`).
        PyTorch < 2.5 has no ``enable_gqa``: None. A problem's mask is 4-D whatever the caller's
        was: a plan made for a 1-D mask, which PyTorch refuses, makes no bare call
        (`dispatcher.plans.Plan`: ``mask_ndim``); a decode step's (B, 1, 1, S) mask does, which
        keeps a masked CPU decode loop level with SDPA (docs/RESULTS.md#decode-loop)."""
        if (not TORCH_HAS_ENABLE_GQA or problem.broadcast_inputs or problem.causal_offset or problem.is_degenerate
                or problem.causal_alignment != "top_left"):
            return None
        takes_mask = problem.mask_kind != "none"
        if takes_mask and not self._masked_call_is_bare(problem):
            return None
        return takes_mask, problem.causal, problem.gqa_ratio > 1

    @staticmethod
    def _masked_call_is_bare(problem: Problem) -> bool:
        """Whether `run` on a masked `problem` only calls PyTorch: a CPU, no causality, inputs
        PyTorch takes as given, rows PyTorch zeroes itself (a 1-D mask aside)."""
        return not (problem.device_type != "cpu" or problem.causal or problem.broadcast_inputs
                    or problem.is_degenerate or not TORCH_HAS_ENABLE_GQA
                    or not default_zeroes_dead_rows(torch.device("cpu"), problem.torch_dtype,
                                                    problem.mask_kind == "bool"))

    def _masked_runner(self, problem: Problem):
        """`run`, or where `run` would only call PyTorch (`_masked_call_is_bare`) the bare call; a
        1-D mask still goes through `run`."""
        if not self._masked_call_is_bare(problem):
            return self.run
        run = self.run

        def masked(query, key, value, mask, scale, enable_gqa, problem):
            if mask.dim() < 2:
                return run(query, key, value, mask, scale, enable_gqa, problem)
            return pytorch_sdpa(query, key, value, mask, scale=scale, enable_gqa=enable_gqa)

        return masked

    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        causal, user_mask = problem.causal, mask
        if causal and (mask is not None or problem.causal_offset):
            if mask is None:  # bottom-right causality alone: PyTorch's is_causal is top-left
                mask = torch.ones(1, 1, problem.q_len, problem.kv_len, dtype=torch.bool, device=query.device)
            mask = combine_mask_and_causal(mask, problem.q_len, problem.kv_len, problem.causal_offset)
            causal = False
        if mask is not None and mask.dtype != torch.bool and problem.device_type != "cpu":
            if mask.dtype != query.dtype and _mask_needs_query_dtype(problem):
                mask = mask.to(query.dtype)  # rebased by `canonicalise`: the row's largest entry is 0
            mask = floor_penalties_(mask.clone() if mask is user_mask else mask)
        return self._call_pytorch(query, key, value, mask, causal, scale, problem.gqa_ratio > 1)

    @staticmethod
    def _call_pytorch(query, key, value, mask, causal: bool, scale: float | None, gqa: bool) -> torch.Tensor:
        """``F.scaled_dot_product_attention`` with two repairs, made only where needed: on a GPU a
        mask whose key dimension is broadcast is stored out in full (the memory-efficient backend
        raises "(*bias): last dimension must be contiguous"), and rows the mask blocks entirely are
        zeroed unless PyTorch does so itself (`default_zeroes_dead_rows`: the fused GPU backends
        return garbage there)."""
        if mask is not None and query.device.type != "cpu" and not key_dim_is_dense(mask, key.shape[-2]):
            mask = mask.expand(*mask.shape[:-1], key.shape[-2]).contiguous()
        kwargs = {"enable_gqa": True} if gqa and TORCH_HAS_ENABLE_GQA else {}
        out = pytorch_sdpa(query, key, value, mask, 0.0, causal, scale=scale, **kwargs)
        if mask is None or default_zeroes_dead_rows(out.device, out.dtype, mask.dtype == torch.bool):
            return out
        if mask.dtype == torch.bool:  # two kernels, not three (`any`, `logical_not_`, `masked_fill_`): every call
            return out.where(mask.any(dim=-1, keepdim=True), 0.0)  # of a static-cache decode makes it
        dead = (mask == float("-inf")).all(dim=-1, keepdim=True)  # [..., L|1, 1]
        return out.masked_fill(dead, 0.0) if out.requires_grad else out.masked_fill_(dead, 0.0)


def _mask_needs_query_dtype(problem: Problem) -> bool:
    """A float mask on half inputs on a GPU: PyTorch's SDPA there takes a float32 mask on bf16 or
    fp16 inputs and its cuDNN backend gives wrong rows (torch 2.11; the memory-efficient backend
    refuses it: "invalid dtype for bias"); a mask in the query's dtype is right. The mask is rebased first (`kernels._float_mask`), so
    narrowing it to fp16 turns only penalties below -65504 into -inf, which block exactly."""
    return problem.mask_kind == "float" and problem.itemsize < 4 and problem.device_type != "cpu"


def key_dim_is_dense(mask: torch.Tensor, S: int) -> bool:
    """Whether a mask's key dimension is stored in full with unit stride (PyTorch's
    memory-efficient CUDA backend takes no other)."""
    return mask.shape[-1] == S and (mask.stride(-1) == 1 or S == 1)


def combine_mask_and_causal(mask: torch.Tensor, L: int, S: int, offset: int = 0) -> torch.Tensor:
    """One mask meaning both `mask` and causality (top-left, or shifted by `offset`). PyTorch's
    math backend refuses a mask with ``is_causal``; its default CPU path combines them, which is
    the semantics we keep (docs/USAGE.md, "Where PyTorch has two answers")."""
    blocked = causal_blocked(slice(0, L), slice(0, S), mask.device, offset)
    if blocked is None:
        return mask
    if mask.dtype == torch.bool:
        return mask & ~blocked
    return mask.masked_fill(blocked, float("-inf"))


SDPA_BACKEND_KERNELS = (*FORCED_BACKENDS.values(), SdpaDefaultKernel)
