"""`sdpa_default`: `F.scaled_dot_product_attention` as PyTorch dispatches it (the baseline), with the repairs its
backends need; and the backend probes: whether a backend works on this build and device (a tiny problem against the
float64 reference, cached per backend, device type, dtype and feature), and which backend PyTorch would pick."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from attn_dispatch.kernels._blocks import causal_blocked
from attn_dispatch.kernels._layout import floor_penalties_
from attn_dispatch.kernels.accuracy import TOLERANCES
from attn_dispatch.kernels.problem import DTYPES_BY_NAME, Problem
from attn_dispatch.kernels.reference import reference_attention, relative_errors
from attn_dispatch.kernels.sdpa_backends import (
    FORCED_BACKENDS,
    TORCH_HAS_ENABLE_GQA,
    SdpaBackendKernel,
    pytorch_sdpa,
)


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
        """The workspace of the backend PyTorch picks for this kind of problem (`default_backend_choice`), K/V
        repeated for GQA where it has no native support, plus what `_call_pytorch` builds around a masked call (a
        key-broadcast mask stored out, the fully-masked-row test)."""
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
        """PyTorch's SDPA on the caller's tensors; a mask with causality, a 1-D mask, broadcast or empty inputs go
        through the base class."""
        if (
            attn_mask is not None and (problem.causal or attn_mask.dim() < 2)
            or problem.broadcast_inputs
            or problem.is_degenerate
            or _mask_needs_query_dtype(problem)
        ):
            return super().run(query, key, value, attn_mask, scale, enable_gqa, problem)
        return self._call_pytorch(query, key, value, attn_mask, problem.causal, scale, enable_gqa)

    def runner(self, problem: Problem):
        """The bare ``torch._C._nn.scaled_dot_product_attention`` call with flags bound, without a mask on inputs
        PyTorch takes as given, or masked where `_masked_call_is_bare`: no Python frame of ours on the warm path;
        else `run`."""
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
        """The flags of `runner`'s bare call (`Kernel.sdpa_call`); None where it makes none or on PyTorch < 2.5."""
        if (not TORCH_HAS_ENABLE_GQA or problem.broadcast_inputs or problem.causal_offset or problem.is_degenerate
                or problem.causal_alignment != "top_left"):
            return None
        takes_mask = problem.mask_kind != "none"
        if takes_mask and not self._masked_call_is_bare(problem):
            return None
        return takes_mask, problem.causal, problem.gqa_ratio > 1

    @staticmethod
    def _masked_call_is_bare(problem: Problem) -> bool:
        """Whether masked `run` only calls PyTorch: CPU, no causality, plain inputs, rows PyTorch zeroes itself."""
        return not (problem.device_type != "cpu" or problem.causal or problem.broadcast_inputs
                    or problem.is_degenerate or not TORCH_HAS_ENABLE_GQA
                    or not default_zeroes_dead_rows(torch.device("cpu"), problem.torch_dtype,
                                                    problem.mask_kind == "bool"))

    def _masked_runner(self, problem: Problem):
        """`run`, or where it would only call PyTorch the bare call (a 1-D mask still goes through `run`)."""
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
        """``F.scaled_dot_product_attention`` with two repairs where needed: on a GPU a key-broadcast mask is stored
        out in full (the memory-efficient backend needs a contiguous last dimension), and fully blocked rows are
        zeroed unless PyTorch does it (`default_zeroes_dead_rows`)."""
        if mask is not None and query.device.type != "cpu" and not key_dim_is_dense(mask, key.shape[-2]):
            mask = mask.expand(*mask.shape[:-1], key.shape[-2]).contiguous()
        kwargs = {"enable_gqa": True} if gqa and TORCH_HAS_ENABLE_GQA else {}
        out = pytorch_sdpa(query, key, value, mask, 0.0, causal, scale=scale, **kwargs)
        if mask is None or default_zeroes_dead_rows(out.device, out.dtype, mask.dtype == torch.bool):
            return out
        if mask.dtype == torch.bool:  # two kernels, not three: every call
            return out.where(mask.any(dim=-1, keepdim=True), 0.0)  # of a static-cache decode makes it
        dead = (mask == float("-inf")).all(dim=-1, keepdim=True)  # [..., L|1, 1]
        return out.masked_fill(dead, 0.0) if out.requires_grad else out.masked_fill_(dead, 0.0)


def _mask_needs_query_dtype(problem: Problem) -> bool:
    """A float mask on half inputs on a GPU: PyTorch's cuDNN backend gives wrong rows with a float32 mask there (the
    memory-efficient one refuses it), so it is cast to the query's dtype; rebased first (`kernels._layout`),
    narrowing turns only penalties below -65504 into -inf, which block exactly."""
    return problem.mask_kind == "float" and problem.itemsize < 4 and problem.device_type != "cpu"


def key_dim_is_dense(mask: torch.Tensor, S: int) -> bool:
    """Whether a mask's key dimension is full with unit stride (all the memory-efficient CUDA backend takes)."""
    return mask.shape[-1] == S and (mask.stride(-1) == 1 or S == 1)


def combine_mask_and_causal(mask: torch.Tensor, L: int, S: int, offset: int = 0) -> torch.Tensor:
    """One mask meaning both `mask` and causality (top-left, or shifted by `offset`): PyTorch's math backend refuses
    a mask with ``is_causal``; its default CPU path combines them, the semantics we keep (docs/USAGE.md, "Where
    PyTorch has two answers")."""
    blocked = causal_blocked(slice(0, L), slice(0, S), mask.device, offset)
    if blocked is None:
        return mask
    if mask.dtype == torch.bool:
        return mask & ~blocked
    return mask.masked_fill(blocked, float("-inf"))


SDPA_BACKEND_KERNELS = (*FORCED_BACKENDS.values(), SdpaDefaultKernel)


# backend probes: tiny but tiled; L != S catches a bottom-right causal diagonal; every fused kernel takes D=64
PROBE_HEADS, PROBE_Q_LEN, PROBE_KV_LEN, PROBE_HEAD_DIM = 4, 24, 40, 64

_results: dict[tuple[str, str, str, str], str | None] = {}
_lock = threading.Lock()


# set by `assumed_backends.assume_backends_available`
_ASSUME_AVAILABLE = ContextVar("assume_backends_available", default=False)
_ASSUMED_CARD = ContextVar("assumed_card", default=None)
_DEFERRED = ContextVar("probes_deferred", default=False)

DEFERRED_GQA = "native GQA not probed yet (taken as absent while probes are deferred)"
"""A deferred ``gqa`` probe's answer: absent, so a workspace estimated meanwhile counts K/V repeated."""


@contextmanager
def probes_deferred() -> Iterator[None]:
    """Inside: a probe not yet run in this process is not run and answers "works" (``gqa``: `DEFERRED_GQA`); known
    results answer as they are. For ranking a bucket on its first call; whatever then runs a kernel asks
    `Kernel.reasons` outside this block, which probes it."""
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def _device_absent(device_type: str) -> bool:
    return device_type == "cuda" and not torch.cuda.is_available()


def probe_backend(kernel: SdpaBackendKernel, device_type: str, dtype: str, feature: str) -> str | None:
    """None when `kernel` computes `feature` correctly on this device type, else why not."""
    if device_type == "meta":  # shapes only: `Kernel.run` gives meta outputs by the formula, nothing to probe
        return None
    if _ASSUME_AVAILABLE.get() and _device_absent(device_type):
        card = _ASSUMED_CARD.get()
        return None if card is None else card.probe_failure(kernel.family, dtype, feature)
    key = (kernel.family, device_type, dtype, feature)
    try:
        return _results[key]
    except KeyError:
        pass
    if _DEFERRED.get():
        return DEFERRED_GQA if feature == "gqa" else None
    with _lock:
        if key not in _results:
            _results[key] = _run_probe(kernel, device_type, dtype, feature)
    return _results[key]


def passed_probes(device_type: str) -> set[tuple[str, str, str, str]]:
    """The probe keys (family, device type, dtype, feature) that passed in this process on `device_type`."""
    with _lock:
        return {key for key, failure in _results.items() if failure is None and key[1] == device_type}


def seed_passed_probes(keys) -> None:
    """Take these probe keys as passed without running them (`models.probe_store`); known results stay."""
    with _lock:
        for key in keys:
            _results.setdefault(tuple(key), None)


def clear_probe_cache() -> None:
    """Forget every probe result (tests; after changing PyTorch backend flags)."""
    with _lock:
        _results.clear()
        _dead_rows.clear()


_dead_rows: dict[tuple[torch.dtype, bool], bool] = {}


def default_zeroes_dead_rows(device: torch.device, dtype: torch.dtype, bool_mask: bool) -> bool:
    """Whether PyTorch's own SDPA zeroes rows its mask blocks entirely (SDPA's semantics), so `sdpa_default` need not
    repair them: asked once per dtype and mask kind on CPUs, never assumed on GPUs (it depends on each shape's
    backend)."""
    if device.type != "cpu":
        return False
    key = (dtype, bool_mask)
    if key not in _dead_rows:
        with _lock:
            _dead_rows[key] = _probe_dead_rows(dtype, bool_mask)
    return _dead_rows[key]


def _probe_dead_rows(dtype: torch.dtype, bool_mask: bool) -> bool:
    query, key, value, mask = _probe_inputs(dtype, "mask")  # row 1 blocked
    if not bool_mask:
        mask = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
    try:
        with torch.no_grad():
            out = torch._C._nn.scaled_dot_product_attention(query, key, value, mask, 0.0, False)
    except Exception:  # noqa: BLE001 - it cannot even run: repair whatever a real call gives
        return False
    return bool(torch.all(out[:, :, 1] == 0)) and bool(torch.isfinite(out).all())


def _probe_inputs(dtype: torch.dtype, feature: str):
    """A probe's query, key, value and mask (or None), on the host."""
    generator = torch.Generator().manual_seed(1234)
    kv_heads = PROBE_HEADS // 2 if feature == "gqa" else PROBE_HEADS
    q_len = PROBE_KV_LEN if feature == "causal_square" else PROBE_Q_LEN

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype=dtype)

    query = randn(1, PROBE_HEADS, q_len, PROBE_HEAD_DIM)
    key = randn(1, kv_heads, PROBE_KV_LEN, PROBE_HEAD_DIM)
    value = randn(1, kv_heads, PROBE_KV_LEN, PROBE_HEAD_DIM)
    mask = None
    if feature == "mask":
        mask = torch.rand(q_len, PROBE_KV_LEN, generator=generator) > 0.3
        mask[1] = False  # one fully masked row
    return query, key, value, mask


def _run_probe(kernel: SdpaBackendKernel, device_type: str, dtype: str, feature: str) -> str | None:
    if device_type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available in this process"
    device = torch.device(device_type)
    where = f"{device_type} {dtype}"
    try:
        on_cpu = _probe_inputs(DTYPES_BY_NAME[dtype], feature)
        query, key, value, mask = (None if t is None else t.to(device) for t in on_cpu)
        causal = feature.startswith("causal")
        gqa = feature == "gqa"
        with torch.no_grad():
            if gqa:  # does the operator itself take fewer K/V heads?
                out = kernel._call_op(query, key, value, None, False, PROBE_HEAD_DIM**-0.5)
            else:
                problem = Problem.from_tensors(query, key, value, mask, causal)
                out = kernel.run(query, key, value, mask, None, False, problem)
        out = out.cpu()  # judged on the host: no float64 kernels to load on the device for a probe
        reference = reference_attention(*on_cpu, causal, enable_gqa=gqa)
    except Exception as error:  # noqa: BLE001 - any failure means "not available"
        message = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        return f"{kernel.family} failed its {feature} probe on {where}: {type(error).__name__}: {message}"
    rel_l2, rel_max = relative_errors(out, reference)
    if not TOLERANCES[dtype].accepts(rel_l2, rel_max):
        return (f"{kernel.family} gave wrong results in its {feature} probe on {where} (relative error {rel_l2:.1e})")
    return None


# PyTorch's SDPBackend enum values (torch.nn.attention.SDPBackend): what `_fused_sdp_choice` returns.
SDP_BACKEND_FAMILIES = {0: "sdpa_math", 1: "sdpa_flash", 2: "sdpa_efficient", 3: "sdpa_cudnn"}
_choices: dict[tuple, str] = {}


def default_backend_choice(problem: Problem) -> str:
    """The backend family `F.scaled_dot_product_attention` picks for problems of this kind, asked of PyTorch once
    with tiny inputs and cached; "sdpa_math" when it cannot be asked. Off the card, inside
    `assumed_backends.assume_backends_available(card)`, the card's recorded answer."""
    card = _ASSUMED_CARD.get()
    if card is not None and _device_absent(problem.device_type):
        recorded = card.default_backend(problem)
        if recorded is not None:
            return recorded
    key = (problem.device_type, problem.dtype, problem.head_dim, problem.value_dim, problem.causal,
           problem.mask_kind, problem.gqa_ratio > 1, problem.q_len == 1, _enabled_backends())
    if key not in _choices:
        _choices[key] = _ask_pytorch(problem)
    return _choices[key]


def _always_on() -> bool:
    return True


BACKEND_SWITCHES = tuple(
    getattr(torch._C, f"_get_{name}_sdp_enabled", _always_on) for name in ("flash", "mem_efficient", "math", "cudnn")
)
"""Readers of PyTorch's global SDPA backend switches (flash, efficient, math, cuDNN); a missing one reads as on."""


def _enabled_backends() -> tuple[bool, ...]:
    """PyTorch's global backend switches (`sdpa_kernel` flips them): part of the choice's key."""
    flash, efficient, math_, cudnn = BACKEND_SWITCHES
    return (flash(), efficient(), math_(), cudnn())


def _ask_pytorch(problem: Problem) -> str:
    if problem.device_type == "cuda" and not torch.cuda.is_available():
        return "sdpa_math"
    device, dtype = torch.device(problem.device_type), DTYPES_BY_NAME[problem.dtype]
    q_len, kv_len, kv_heads = (1 if problem.q_len == 1 else 16), 32, 1
    q_heads = kv_heads * problem.gqa_ratio
    try:
        query = torch.randn(1, q_heads, q_len, problem.head_dim).to(device, dtype)
        key = torch.randn(1, kv_heads, kv_len, problem.head_dim).to(device, dtype)
        value = torch.randn(1, kv_heads, kv_len, problem.value_dim).to(device, dtype)
        mask = None
        if problem.mask_kind == "bool":
            mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
        elif problem.mask_kind == "float":
            mask = torch.zeros(q_len, kv_len, dtype=dtype, device=device)
        kwargs = {"enable_gqa": True} if problem.gqa_ratio > 1 else {}
        choice = torch._fused_sdp_choice(query, key, value, mask, 0.0, problem.causal and mask is None, **kwargs)
    except Exception:  # noqa: BLE001 - an old or unusual build: assume the worst case
        return "sdpa_math"
    return SDP_BACKEND_FAMILIES.get(int(choice), "sdpa_math")
