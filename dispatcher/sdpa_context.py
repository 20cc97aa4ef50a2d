"""What the caller's context asks of an SDPA call before the dispatcher may choose a kernel.

- `sdpa_kernel` restrictions (PyTorch's global backend flags): while any backend is off the call goes to PyTorch's
  SDPA as given, its backend choice and errors; opt out with ``ATTN_DISPATCH_IGNORE_SDPA_KERNEL=1`` or
  `respect_sdpa_kernel(False)`, except a mask with ``is_causal=True``, which stays PyTorch's
  (`check_mask_with_causal`). `explain` names the restriction; a call over the memory budget warns once.
- `CausalBias`: never read as a mask (uninitialised storage). Upper-left (or made for L == S) is ``is_causal=True``;
  lower-right goes to the kernels (`Problem.causal_alignment`) except on the training route (PyTorch's handling).
  With ``is_causal=True``: ValueError, as PyTorch.
- Meta and nested tensors: PyTorch's SDPA.
- `torch.autocast` never sees the dispatcher: `autocast_inputs` casts as autocast would, and
  `attention_under_autocast` runs with autocast off."""

from __future__ import annotations

import threading

import torch

from attn_dispatch.dispatcher.decision import (
    Candidate,
    Decision,
    RankingSource,
    format_bytes,
    free_bytes,
    logger,
)
from attn_dispatch.dispatcher.plans import cache_key
from attn_dispatch.kernels import Problem, kernel_from_name
from attn_dispatch.kernels._layout import causal_bias_alignment, is_causal_bias
from attn_dispatch.kernels.base import training_bytes
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from attn_dispatch.kernels.sdpa_default import BACKEND_SWITCHES, default_backend_choice
from attn_dispatch.models.environment import IGNORE_SDPA_KERNEL

RESPECTING = [True]
"""``[bool]``: whether restrictions are respected now, read in place by the per-call test inlined in
`Dispatcher.attention` (which sends restricted, meta, nested or mask-subclass calls to `route`)."""
_chosen: list[bool | None] = [None]  # `respect_sdpa_kernel`'s argument, which wins over the environment


def respect_sdpa_kernel(enabled: bool | None = True) -> None:
    """Whether calls made while PyTorch's SDPA backends are restricted go to PyTorch's SDPA (default, unless
    ``ATTN_DISPATCH_IGNORE_SDPA_KERNEL=1``). True or False overrides the variable for the rest of the process; None
    follows it again."""
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"respect_sdpa_kernel takes True, False or None, got {enabled!r}")
    _chosen[0] = enabled
    if enabled is None:
        follow_environment()
    else:
        RESPECTING[0] = enabled


def follow_environment() -> None:
    """Read ``ATTN_DISPATCH_IGNORE_SDPA_KERNEL`` now unless `respect_sdpa_kernel` chose (ValueError if not on/off)."""
    ignore = IGNORE_SDPA_KERNEL.read()
    if _chosen[0] is None:
        RESPECTING[0] = not ignore


_flash_on, _efficient_on, _math_on, _cudnn_on = BACKEND_SWITCHES


def _all_enabled() -> bool:
    """Whether all of PyTorch's SDPA backends are on (runs on every call: one expression)."""
    return _flash_on() and _efficient_on() and _math_on() and _cudnn_on()


def backends_restricted() -> bool:
    """Whether some SDPA backend is off now and restrictions are respected."""
    return RESPECTING[0] and not _all_enabled()


def some_backend_off() -> bool:
    """Whether some SDPA backend is off now, respected or not (a PyTorch-backed kernel may then fail for the switch)."""
    return not _all_enabled()


MASK_WITH_CAUSAL = ("_scaled_dot_product_attention: Explicit attn_mask should not be set when "
                    "is_causal=True (PyTorch's SDPA takes its MATH backend for these inputs, which refuses "
                    "the pair): fold the causality into the mask (mask & torch.ones(L, S, "
                    "dtype=torch.bool).tril()) or pass only one of them")


def check_mask_with_causal(query, key, value, attn_mask, enable_gqa) -> None:
    """A mask with ``is_causal=True``: PyTorch's fused backends combine the two, its MATH backend raises
    RuntimeError. Raise it where PyTorch would take MATH for these tensors (``torch._fused_sdp_choice``, once per new
    shape); traced tensors are not asked."""
    if query.__class__ is not torch.Tensor:
        return
    gqa = {"enable_gqa": True} if enable_gqa else {}  # torch < 2.5: none
    try:
        choice = torch._fused_sdp_choice(query, key, value, attn_mask, 0.0, True, **gqa)
    except Exception:  # noqa: BLE001 - PyTorch cannot even choose: the call itself says why
        return
    if int(choice) == 0:  # SDPBackend.MATH
        raise RuntimeError(MASK_WITH_CAUSAL)


def pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """PyTorch's SDPA with the arguments as given (a `CausalBias` through its own handling)."""
    if is_causal_bias(attn_mask):
        gqa = {"enable_gqa": True} if enable_gqa else {}  # torch < 2.5 has no enable_gqa there
        return type(attn_mask)._dispatch(query, key, value, attn_mask, dropout_p, is_causal, scale, **gqa)
    gqa = {} if enable_gqa is False else {"enable_gqa": enable_gqa}  # torch < 2.5: none; not a bool: its TypeError
    return pytorch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **gqa)


def _training(query, key, value, dropout_p) -> bool:
    """Whether a call takes the training route: dropout, or inputs requiring grad with grad enabled."""
    return dropout_p != 0.0 or (torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad))


def route(dispatcher, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor | None:
    """The output where the context decides the call, else None (the dispatcher goes on)."""
    if query.is_meta or query.is_nested:
        return pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if backends_restricted() or (is_causal is True and attn_mask is not None and some_backend_off()):
        # the caller's choice (a mask with is_causal: PyTorch's in any case, `check_mask_with_causal`); said
        # once where it goes over the budget (`sdpa_context`)
        training = _training(query, key, value, dropout_p)
        warn_if_over_budget(dispatcher.memory_budget, query, key, value, attn_mask, is_causal, enable_gqa, training)
        return pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if not is_causal_bias(attn_mask):
        return None
    alignment = causal_bias_alignment(attn_mask, is_causal, query.shape[-2], key.shape[-2])  # ValueError with is_causal
    if alignment == "top_left":
        return dispatcher.attention(query, key, value, None, dropout_p, True, scale=scale, enable_gqa=enable_gqa)
    if _training(query, key, value, dropout_p):
        return pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return None


def explain_arguments(query, key, attn_mask, is_causal) -> tuple[torch.Tensor | None, bool]:
    """``(attn_mask, is_causal)`` as decided on: an upper-left `CausalBias` becomes ``is_causal=True``."""
    if is_causal_bias(attn_mask) and causal_bias_alignment(attn_mask, is_causal, query.shape[-2], key.shape[-2]) == "top_left":
        return None, True
    return attn_mask, is_causal


# the caller's `sdpa_kernel` restriction: what `explain` says runs, and the over-budget warning

RESTRICTED_LEVEL = "sdpa_kernel"
"""`RankingSource.level` of a decision the caller's restriction made."""
BACKEND_NAMES = ("flash", "efficient", "math", "cudnn")
"""PyTorch's backends in `sdpa_default.BACKEND_SWITCHES` order."""
MAX_CHECKED_SHAPES = 4096
"""Exact shapes of restricted calls checked against the budget per process (then forgotten: a warning may repeat)."""
OPT_OUT = "respect_sdpa_kernel(False) or ATTN_DISPATCH_IGNORE_SDPA_KERNEL=1 lets the dispatcher choose instead"

_checked: set[tuple] = set()
_lock = threading.Lock()


def restriction_words() -> str:
    """``"sdpa_kernel restriction: math on; flash, efficient, cudnn off"``."""
    on = [name for name, enabled in zip(BACKEND_NAMES, BACKEND_SWITCHES, strict=True) if enabled()]
    off = [name for name in BACKEND_NAMES if name not in on]
    return f"sdpa_kernel restriction: {', '.join(on) or 'no backend'} on; {', '.join(off)} off"


def needed_bytes(problem: Problem, training: bool) -> tuple[str, int]:
    """The backend PyTorch runs `problem` with now, and its extra memory (forward, plus backward when `training`)."""
    backend = default_backend_choice(problem)
    kernel = kernel_from_name(backend)
    return backend, int(training_bytes(kernel, problem) if training else kernel.workspace_bytes(problem))


def restricted_decision(problem: Problem, device: torch.device, budget: int | None, *, training: bool) -> Decision:
    """The decision of a restricted call: PyTorch's SDPA, its backend and memory, and whether over `budget`."""
    backend, needed = needed_bytes(problem, training)
    notes = [f"the caller's {restriction_words()}: PyTorch's SDPA runs the call as given, with its {backend} "
             f"backend ({OPT_OUT})"]
    if budget is not None and needed > budget:
        notes.append(over_budget_words(backend, needed, budget, training))
    return Decision(kernel=backend, params={}, problem=problem, device=str(device),
                    source=RankingSource(RESTRICTED_LEVEL, restriction_words()),
                    candidates=(Candidate(backend, None, needed),), free_bytes=free_bytes(device),
                    budget_bytes=budget, notes=tuple(notes))


def over_budget_words(backend: str, needed: int, budget: int, training: bool) -> str:
    what = "forward and backward need" if training else "needs"
    return (f"over the memory budget: PyTorch's {backend} backend {what} {format_bytes(needed)} ({needed} bytes) "
            f"beyond the inputs, the budget is {format_bytes(budget)} ({budget} bytes)")


def warn_if_over_budget(budget: int | None, query, key, value, attn_mask, is_causal, enable_gqa, training) -> None:
    """Log one WARNING per exact shape whose restricted call needs more than `budget`. Never raises."""
    if budget is None:
        return
    try:
        shape = (cache_key(query, key, value, attn_mask, is_causal, enable_gqa), bool(training), budget)
        with _lock:
            if shape in _checked:
                return
            if len(_checked) >= MAX_CHECKED_SHAPES:
                _checked.clear()
            _checked.add(shape)
        problem = Problem.from_tensors(query, key, value, attn_mask, is_causal, enable_gqa)
        backend, needed = needed_bytes(problem, bool(training))
    except Exception:  # noqa: BLE001 - bad inputs: PyTorch's SDPA raises its own error for them
        return
    if needed > budget:
        logger.warning("attn_dispatch: %s under the caller's %s (%s)", over_budget_words(backend, needed, budget, training),
                       restriction_words(), OPT_OUT)


# torch.autocast: the casts autocast would make for PyTorch's SDPA

any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: False)
"""``() -> bool``: some device's autocast is on."""


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast casts SDPA's inputs to on `device_type` now, or None."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except (TypeError, RuntimeError, AttributeError):  # a device type autocast does not know
        return None


def autocast_inputs(query, key, value, attn_mask) -> tuple | None:
    """``(query, key, value, attn_mask)`` as autocast hands them to SDPA (floating, not float64, on its device type;
    a `CausalBias` as given), or None where autocast is off or the arguments are not tensors."""
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
