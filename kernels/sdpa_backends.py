"""`sdpa_flash`, `sdpa_efficient`, `sdpa_cudnn`, `sdpa_math`: PyTorch's attention backends as candidates, called
through their ATen operators (not `sdpa_kernel`, which costs host time per call). This module therefore does SDPA's
input preparation: GQA (native, query heads folded into rows, or K/V repeated), masks and bottom-right causality as
aligned additive biases, fully masked rows zeroed. Backends are probed before use (`sdpa_default.probe_backend`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from attn_dispatch.kernels._blocks import causal_blocked
from attn_dispatch.kernels._layout import floor_penalties_
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem

# PyTorch's SDPA itself; `F.scaled_dot_product_attention` may be patched by the dispatcher.
pytorch_sdpa = torch._C._nn.scaled_dot_product_attention
TORCH_HAS_ENABLE_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)

# Memory-efficient attention reads its bias with 16-element aligned rows (PyTorch pads it the
# same way in `preprocess_mask`, aten/src/ATen/native/transformers/attention.cpp).
BIAS_ALIGNMENT = 16
# The head-dim limit of PyTorch's fused flash / cuDNN kernels (sdp_utils.cpp checks).
FUSED_MAX_HEAD_DIM = 256
FUSED_HEAD_DIM_MULTIPLE = 8


def additive_bias(mask: torch.Tensor | None, causal: bool, dtype: torch.dtype, L: int, S: int, align: int = 1,
                  offset: int = 0, device: torch.device | None = None) -> torch.Tensor | None:
    """``[B|1, H|1, L|1, S|1]`` mask (+ causality, diagonal shifted by `offset`) -> additive float bias ``[B|1, H|1,
    L, S]`` in `dtype` on `device` (the mask's when given), rows padded to a multiple of `align` elements."""
    if mask is None and not causal:
        return None
    shape = (mask.shape[0], mask.shape[1]) if mask is not None else (1, 1)
    padded_s = -(-S // align) * align
    bias = torch.zeros(*shape, L, padded_s, dtype=dtype, device=(mask.device if mask is not None else device))[..., :S]
    if mask is not None:
        if mask.dtype == torch.bool:
            bias.masked_fill_(~mask, float("-inf"))
        else:
            floor_penalties_(bias.add_(mask.to(dtype)))
    blocked = causal_blocked(slice(0, L), slice(0, S), bias.device, offset) if causal else None
    if blocked is not None:
        bias.masked_fill_(blocked, float("-inf"))
    return bias


def zero_fully_masked_rows_(out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Zero rows of ``out`` whose every key ``bias`` blocks: in place unless autograd saved `out`."""
    dead = (bias == float("-inf")).all(dim=-1, keepdim=True)  # [B|1, H|1, L, 1]
    if out.requires_grad:
        return out.masked_fill(dead, 0.0)
    return out.masked_fill_(dead, 0.0)  # unconditionally: testing dead.any() would sync the GPU


def _backward_needs_logsumexp(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether the operator must keep each row's logsumexp for a backward (the efficient backward needs it)."""
    return torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)


class SdpaBackendKernel(Kernel):
    """One PyTorch SDPA backend, called directly."""

    backend: ClassVar[str]
    supports_backward = True
    devices: ClassVar[dict[str, tuple[str, ...]]] = {}  # device type -> dtypes the backend takes

    @property
    def name(self) -> str:
        return self.family

    # ------------------------------------------------------------------ capabilities
    def _own_reasons(self, problem: Problem) -> list[str]:
        dtypes = self.devices.get(problem.device_type)
        if dtypes is None:
            return [f"PyTorch has no {self.backend} attention backend for {problem.device_type} devices"]
        reasons = []
        if problem.dtype not in dtypes:
            reasons.append(f"{self.backend} takes {'/'.join(dtypes)} on {problem.device_type}, not {problem.dtype}")
        reasons += self._shape_reasons(problem)
        if not self._takes_mask(problem) and problem.mask_kind != "none":
            reasons.append(f"{self.backend} takes no attention mask")
        elif not self._takes_mask(problem) and self._bias_needed(problem):
            reasons.append(f"{self.backend} takes no attention mask, and bottom-right causality travels as one")
        if reasons:
            return reasons
        from attn_dispatch.kernels.sdpa_default import probe_backend  # sdpa_default imports this module

        for feature in self._features(problem):
            failure = probe_backend(self, problem.device_type, problem.dtype, feature)
            if failure:
                reasons.append(failure)
        if not reasons and problem.gqa_ratio > 1:
            self._gqa_mode(problem)  # probe native GQA now, not inside the first timed call
        return reasons

    def _shape_reasons(self, problem: Problem) -> list[str]:
        reasons = []
        if problem.head_dim != problem.value_dim:
            reasons.append(f"{self.backend} needs value head dim == query head dim ({problem.value_dim} != {problem.head_dim})")
        if problem.head_dim > FUSED_MAX_HEAD_DIM:
            reasons.append(f"{self.backend} takes head dims up to {FUSED_MAX_HEAD_DIM}, not {problem.head_dim}")
        if problem.head_dim % FUSED_HEAD_DIM_MULTIPLE:
            reasons.append(f"{self.backend} needs a head dim that is a multiple of {FUSED_HEAD_DIM_MULTIPLE}, not {problem.head_dim}")
        return reasons

    def _takes_mask(self, problem: Problem) -> bool:
        return True

    def _features(self, problem: Problem) -> list[str]:
        """The probes this problem relies on: 'base', and 'causal_square' / 'causal_rect' (L == S / L != S: a kernel
        may align the diagonal bottom-right) or 'mask'."""
        features = ["base"]
        if self._bias_needed(problem):
            features.append("mask")
        elif problem.causal:
            features.append("causal_square" if problem.q_len == problem.kv_len else "causal_rect")
        return features

    def _bias_needed(self, problem: Problem) -> bool:
        """Masks and bottom-right causality (the operators' ``is_causal`` is top-left) travel as an additive bias."""
        return problem.mask_kind != "none" or problem.causal_offset != 0

    # only FlashAttention checks K/V head counts itself: others are never handed fewer K/V heads
    may_take_fewer_kv_heads: ClassVar[bool] = False

    def native_gqa(self, device_type: str, dtype: str) -> bool:
        if not self.may_take_fewer_kv_heads:
            return False
        from attn_dispatch.kernels.sdpa_default import probe_backend  # sdpa_default imports this module
        return probe_backend(self, device_type, dtype, "gqa") is None

    def _gqa_mode(self, problem: Problem) -> str:
        """'none' | 'native' | 'fold' (query heads become rows) | 'repeat' (K/V copied per group)."""
        if problem.gqa_ratio == 1:
            return "none"
        if self.native_gqa(problem.device_type, problem.dtype):
            return "native"
        if not problem.causal and problem.mask_kind == "none":
            return "fold"
        return "repeat"

    def workspace_bytes(self, problem: Problem) -> int:
        """Output, fp32 log-sum-exp per row, an aligned bias with its masked-row test, K/V repeated when GQA is
        neither native nor folded, and one copy of strided inputs."""
        extra = problem.out_bytes + self.input_copy_bytes(problem)
        extra += problem.batch * problem.q_heads * problem.q_len * 4
        if self._bias_needed(problem):
            b, h = (problem.mask_shape[:2] if problem.mask_shape else (1, 1))
            padded_s = -(-problem.kv_len // BIAS_ALIGNMENT) * BIAS_ALIGNMENT
            bias_elements = b * h * problem.q_len
            extra += bias_elements * padded_s * problem.itemsize  # the bias itself
            extra += bias_elements * problem.kv_len  # the fully-masked-row test (bool)
            extra += problem.mask_bytes + problem.q_len * problem.kv_len  # inverted mask, causal block
        mode = self._gqa_mode(problem) if problem.gqa_ratio > 1 else "none"
        if mode == "repeat":
            extra += problem.kv_bytes * problem.gqa_ratio
        elif mode == "fold":
            extra += problem.q_bytes + problem.out_bytes  # folded rows and the reshaped output
        return extra

    # ------------------------------------------------------------------ running
    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        causal = problem.causal
        bias = None
        if self._bias_needed(problem):
            bias = additive_bias(mask, causal, query.dtype, problem.q_len, problem.kv_len, BIAS_ALIGNMENT,
                                 problem.causal_offset, query.device)
            causal = False
        query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
        mode = self._gqa_mode(problem)
        if mode == "fold":
            rows = query.reshape(problem.batch, problem.kv_heads, -1, problem.head_dim)
            out = self._call_op(rows, key, value, None, False, scale)  # may come back [B, R, H, Ev]-strided
            return out.reshape(problem.batch, problem.q_heads, problem.q_len, problem.value_dim)
        if mode == "repeat":
            key = key.repeat_interleave(problem.gqa_ratio, dim=1)
            value = value.repeat_interleave(problem.gqa_ratio, dim=1)
        full_bias = None
        if bias is not None:
            full_bias = bias.expand(problem.batch, problem.q_heads, problem.q_len, problem.kv_len)
        out = self._call_op(query, key, value, full_bias, causal, scale)
        if bias is not None:
            out = zero_fully_masked_rows_(out, bias)
        return out

    def _call_op(self, query, key, value, bias, causal: bool, scale: float) -> torch.Tensor:
        raise NotImplementedError

    # ------------------------------------------------------------------ the warm path's shortcut
    bare_ops: ClassVar[dict[str, str]] = {}
    """Device type -> the ATen operator `runner` calls bare there (`BareCall.op`)."""

    def _bare_op(self, device_type: str = "cuda"):
        """``(query, key, value, causal, scale) -> output`` calling the bare operator on `device_type`, or None."""
        return None

    def bare_call(self, problem: Problem) -> BareCall | None:
        """What `runner` calls in place of `run`, or None: only without a mask, broadcasting or bottom-right
        causality, with GQA native or folded. The C++ fast path (`dispatcher.fast_path`) makes the same call."""
        op = self.bare_ops.get(problem.device_type)
        if (op is None or problem.mask_kind != "none" or problem.broadcast_inputs
                or problem.causal_offset or problem.is_degenerate):
            return None
        mode = self._gqa_mode(problem)
        if mode == "fold":
            return BareCall(op, (problem.batch, problem.kv_heads, problem.gqa_ratio * problem.q_len, problem.head_dim),
                            (problem.batch, problem.q_heads, problem.q_len, problem.value_dim))
        return BareCall(op) if mode in ("none", "native") else None

    def runner(self, problem: Problem):
        """Where `bare_call` names one, the backend's ATen operator called directly on 4-D inputs, also strided ones
        with a dense last dimension; else `run`, which canonicalises on every call (docs/RESULTS.md#warm-parity)."""
        bare_call = self.bare_call(problem)
        op = None if bare_call is None else self._bare_op(problem.device_type)
        if op is None:
            return self.run
        causal, run, strided = problem.causal, self.run, problem.strided
        if bare_call.rows is not None:
            rows, out_shape = bare_call.rows, bare_call.out_shape

            def call(query, key, value, scale):
                return op(query.reshape(rows), key, value, False, scale).reshape(out_shape)
        else:
            def call(query, key, value, scale):
                return op(query, key, value, causal, scale)

        def bare(query, key, value, mask, scale, enable_gqa, problem):
            if query.dim() != 4 or strided and not (query.stride(-1) == key.stride(-1) == value.stride(-1) == 1):
                return run(query, key, value, mask, scale, enable_gqa, problem)
            return call(query, key, value, scale)

        return bare


class SdpaFlashKernel(SdpaBackendKernel):
    """FlashAttention-2 (CUDA/ROCm builds that ship it; PyTorch's fused CPU kernel on CPU)."""

    family = "sdpa_flash"
    backend = "flash"
    may_take_fewer_kv_heads = True
    devices = {"cuda": ("float16", "bfloat16"), "cpu": ("float32", "bfloat16", "float16", "float64")}

    def _takes_mask(self, problem: Problem) -> bool:
        return problem.device_type == "cpu"

    def _shape_reasons(self, problem: Problem) -> list[str]:
        if problem.device_type == "cpu" and problem.head_dim == problem.value_dim:
            return []
        return super()._shape_reasons(problem)

    def _call_op(self, query, key, value, bias, causal, scale):
        if query.device.type == "cpu":
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, causal,
                                                                              attn_mask=bias, scale=scale)[0]
        if bias is not None:
            raise RuntimeError("sdpa_flash on CUDA takes no attention mask")
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, causal, False, scale=scale)[0]

    bare_ops: ClassVar[dict[str, str]] = {"cuda": "flash", "cpu": "flash_cpu"}

    def _bare_op(self, device_type: str = "cuda"):
        if device_type == "cpu":
            cpu_op = aten_binding("_scaled_dot_product_flash_attention_for_cpu")
            return lambda query, key, value, causal, scale: cpu_op(query, key, value, 0.0, causal, scale=scale)[0]
        op = aten_binding("_scaled_dot_product_flash_attention")
        return lambda query, key, value, causal, scale: op(query, key, value, 0.0, causal, False, scale=scale)[0]


class SdpaEfficientKernel(SdpaBackendKernel):
    """Memory-efficient attention (xformers' CUTLASS kernel inside PyTorch)."""

    family = "sdpa_efficient"
    backend = "efficient"
    devices = {"cuda": ("float16", "bfloat16", "float32")}

    def _shape_reasons(self, problem: Problem) -> list[str]:
        reasons = []
        if problem.head_dim % FUSED_HEAD_DIM_MULTIPLE or problem.value_dim % FUSED_HEAD_DIM_MULTIPLE:
            reasons.append(f"efficient needs head dims that are multiples of {FUSED_HEAD_DIM_MULTIPLE}")
        return reasons

    def _call_op(self, query, key, value, bias, causal, scale):
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, _backward_needs_logsumexp(query, key, value), 0.0, causal, scale=scale
        )[0]

    bare_ops: ClassVar[dict[str, str]] = {"cuda": "efficient"}

    def _bare_op(self, device_type: str = "cuda"):
        op = aten_binding("_scaled_dot_product_efficient_attention")
        return lambda query, key, value, causal, scale: op(
            query, key, value, None, _backward_needs_logsumexp(query, key, value), 0.0, causal, scale=scale)[0]


class SdpaCudnnKernel(SdpaBackendKernel):
    """cuDNN's fused attention (NVIDIA only)."""

    family = "sdpa_cudnn"
    backend = "cudnn"
    devices = {"cuda": ("float16", "bfloat16")}

    def _call_op(self, query, key, value, bias, causal, scale):
        return torch.ops.aten._scaled_dot_product_cudnn_attention(
            query, key, value, bias, _backward_needs_logsumexp(query, key, value), 0.0, causal, False, scale=scale
        )[0]

    bare_ops: ClassVar[dict[str, str]] = {"cuda": "cudnn"}

    def _bare_op(self, device_type: str = "cuda"):
        op = aten_binding("_scaled_dot_product_cudnn_attention")
        return lambda query, key, value, causal, scale: op(
            query, key, value, None, _backward_needs_logsumexp(query, key, value), 0.0, causal, False, scale=scale)[0]


class SdpaMathKernel(SdpaBackendKernel):
    """PyTorch's math backend (runs everywhere; upcasts half inputs on some builds)."""

    family = "sdpa_math"
    backend = "math"

    def _own_reasons(self, problem: Problem) -> list[str]:
        from attn_dispatch.kernels.sdpa_default import probe_backend  # sdpa_default imports this module
        return [failure for failure in [probe_backend(self, problem.device_type, problem.dtype, "base")] if failure]

    def _gqa_mode(self, problem: Problem) -> str:
        return "none" if problem.gqa_ratio == 1 else "native"

    def workspace_bytes(self, problem: Problem) -> int:
        """ATen's math backend materialises scores and softmax (12 bytes per score element with a bias), upcasts half
        inputs to fp32, scales Q and K in copies, and repeats K/V for GQA after the upcast."""
        widen = 4 // problem.itemsize if problem.itemsize < 4 else 1  # fp32 copies of half inputs
        upcast = (problem.q_bytes + problem.kv_bytes) * widen if widen > 1 else 0
        repeated_kv = problem.kv_bytes * widen * problem.gqa_ratio if problem.gqa_ratio > 1 else 0
        scaled_q_and_k = problem.q_bytes * widen + problem.kv_bytes * widen * problem.gqa_ratio
        return (
            problem.out_bytes * 3
            + self.input_copy_bytes(problem)
            + upcast
            + repeated_kv
            + scaled_q_and_k
            + problem.score_elements * 12
            + problem.mask_bytes * 4
            + (problem.q_len * problem.kv_len * (problem.itemsize + 1) if problem.causal_offset else 0)
        )

    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        # The operator takes masks as additive biases (public SDPA converts bool masks first).
        bias = None
        if self._bias_needed(problem):
            bias = additive_bias(mask, problem.causal, query.dtype, problem.q_len, problem.kv_len,
                                 offset=problem.causal_offset, device=query.device)
        causal = problem.causal and bias is None
        kwargs = {"enable_gqa": True} if problem.gqa_ratio > 1 else {}
        out = torch.ops.aten._scaled_dot_product_attention_math(query, key, value, bias, 0.0, causal, None, scale=scale, **kwargs)[0]
        return zero_fully_masked_rows_(out, bias) if bias is not None else out


FORCED_BACKENDS = {cls.family: cls for cls in (SdpaFlashKernel, SdpaEfficientKernel, SdpaCudnnKernel, SdpaMathKernel)}
"""The backends a kernel can force, by family."""


# the bare ATen operator call a fused backend's plan makes (`dispatcher.fast_path` makes it in C++)

@dataclass(frozen=True)
class BareCall:
    """The one ATen operator call `SdpaBackendKernel.runner` makes for a problem.

    `op`: ``"flash"``, ``"flash_cpu"``, ``"efficient"`` or ``"cudnn"``, called with no mask or dropout; `rows`,
    `out_shape`: with GQA folded, the query reshaped to ``[B, Hkv, R * L, E]`` and the output to ``[B, Hq, L, Ev]``
    (None: as given)."""

    op: str
    rows: tuple[int, ...] | None = None
    out_shape: tuple[int, ...] | None = None


def aten_binding(name: str):
    """ATen operator `name` through its C++-parsed ``torch._C._VariableFunctions`` binding if any, else the overload."""
    return getattr(torch._C._VariableFunctions, name, None) or getattr(torch.ops.aten, name).default
