"""What the caller's context asks of an SDPA call before the dispatcher may choose a kernel:
PyTorch's backend restrictions, `CausalBias` objects, meta tensors.

- **`sdpa_kernel` restrictions.** ``with torch.nn.attention.sdpa_kernel([...])`` (and
  ``torch.backends.cuda.enable_*_sdp(False)``) switch PyTorch's backends off through global flags
  (`torch._C._get_{flash,mem_efficient,math,cudnn}_sdp_enabled`, torch 2.4 .. 2.13; the context
  manager itself reads them the same way). While any is off, the user asked for exactly PyTorch's
  behaviour, so the call goes to PyTorch's SDPA as given: its backend choice, its errors (the
  MATH backend refuses a mask together with ``is_causal``). Opt out with
  ``ATTN_DISPATCH_IGNORE_SDPA_KERNEL=1`` or `respect_sdpa_kernel(False)`, except for a mask
  together with ``is_causal=True``: whether PyTorch combines the two or raises depends on its
  backend (`check_mask_with_causal`), so that call stays PyTorch's. `explain` names the
  restriction and the backend, and a call over the memory budget warns once (`sdpa_context`).
- **`CausalBias`** (`causal_upper_left`, `causal_lower_right`): a tensor subclass with
  uninitialised storage, never read as a mask. Upper-left (and any bias made for L == S) is
  ``is_causal=True``; lower-right goes on to the kernels, which read its alignment from the
  `Problem` (`causal_alignment`), except on the training route, which PyTorch's own
  `CausalBias` handling serves. With ``is_causal=True`` it raises ValueError, as PyTorch.
- **Meta tensors** (model init under ``torch.device("meta")``, shape inference): PyTorch's SDPA,
  which gives a meta tensor of the right shape (no table lookup, no memory query).
- **`torch.autocast`**: autocast casts SDPA's floating inputs (not float64, on its device type) to
  its dtype before the call, but never sees the dispatcher: `autocast_inputs` casts them the same
  way and `attention_under_autocast` runs the call with autocast off, as autocast runs the operator.
- **Nested tensors** (``torch.nested``, jagged or strided: variable-length batches): PyTorch's
  SDPA, which has kernels for them; ours take strided tensors of one shape (a `Problem`).
"""

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
"""``[bool]``: whether restrictions are respected now (`respect_sdpa_kernel`, else
``ATTN_DISPATCH_IGNORE_SDPA_KERNEL`` as `follow_environment` last read it), read in place by the
per-call test, which is inlined in `Dispatcher.attention`: a restriction, a meta or nested query,
or a mask that is not a plain tensor sends the call to `route`."""
_chosen: list[bool | None] = [None]  # `respect_sdpa_kernel`'s argument, which wins over the environment


def respect_sdpa_kernel(enabled: bool | None = True) -> None:
    """Whether calls made while PyTorch's SDPA backends are restricted go to PyTorch's SDPA
    (default, unless ``ATTN_DISPATCH_IGNORE_SDPA_KERNEL=1``). `False` lets the dispatcher choose
    among its own kernels even inside ``sdpa_kernel(...)``. True or False wins over the environment
    variable for the rest of the process; None follows the variable again."""
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"respect_sdpa_kernel takes True, False or None, got {enabled!r}")
    _chosen[0] = enabled
    if enabled is None:
        follow_environment()
    else:
        RESPECTING[0] = enabled


def follow_environment() -> None:
    """Read ``ATTN_DISPATCH_IGNORE_SDPA_KERNEL`` now (a dispatcher, `install()` or `patched()`
    starting), unless `respect_sdpa_kernel` chose; ValueError (one line) for a value not on/off."""
    ignore = IGNORE_SDPA_KERNEL.read()
    if _chosen[0] is None:
        RESPECTING[0] = not ignore


def _every_backend_enabled():
    """``() -> bool``: are all of PyTorch's SDPA backends on? One expression, no loop: it runs on
    every dispatcher call."""
    flash, efficient, math, cudnn = BACKEND_SWITCHES
    return lambda: flash() and efficient() and math() and cudnn()


_all_enabled = _every_backend_enabled()


def backends_restricted() -> bool:
    """Whether some PyTorch SDPA backend is switched off now (and restrictions are respected)."""
    return RESPECTING[0] and not _all_enabled()


def some_backend_off() -> bool:
    """Whether some PyTorch SDPA backend is switched off now, whether or not restrictions are
    respected: a kernel running PyTorch's SDPA may then fail for the switch, not for its problem."""
    return not _all_enabled()


MASK_WITH_CAUSAL = (
    "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True (PyTorch's SDPA "
    "takes its MATH backend for these inputs, which refuses the pair): fold the causality into the mask "
    "(mask & torch.ones(L, S, dtype=torch.bool).tril()) or pass only one of them"
)


def check_mask_with_causal(query, key, value, attn_mask, enable_gqa) -> None:
    """A mask together with ``is_causal=True``: PyTorch's fused backends combine the two (a query
    sees a key only where both allow it), its MATH backend raises RuntimeError. Raise it where
    PyTorch takes MATH for these inputs (3-D inputs, or a size no fused backend takes), as asked of
    PyTorch itself on the call's tensors (``torch._fused_sdp_choice``, about 2 us, once per new
    shape). Traced tensors (torch.compile's fake ones) are not asked."""
    if query.__class__ is not torch.Tensor:
        return
    gqa = {"enable_gqa": True} if enable_gqa else {}  # torch < 2.5: none
    try:
        choice = torch._fused_sdp_choice(query, key, value, attn_mask, 0.0, True, **gqa)
    except Exception:  # noqa: BLE001 - PyTorch cannot even choose: the call itself says why
        return
    if int(choice) == 0:  # SDPBackend.MATH
        raise RuntimeError(MASK_WITH_CAUSAL)


def all_strided(*tensors) -> bool:
    """Every tensor given is strided (not sparse, not mkldnn): what our kernels and plans take; the
    others go to PyTorch's SDPA, whose errors they get."""
    return all(t is None or t.layout is torch.strided for t in tensors)


def pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """PyTorch's SDPA with the arguments as given (a `CausalBias` through its own handling, also
    under torch.compile, where it must not reach the operator as a tensor)."""
    if is_causal_bias(attn_mask):
        gqa = {"enable_gqa": True} if enable_gqa else {}  # torch < 2.5 has no enable_gqa there
        return type(attn_mask)._dispatch(query, key, value, attn_mask, dropout_p, is_causal, scale, **gqa)
    gqa = {} if enable_gqa is False else {"enable_gqa": enable_gqa}  # torch < 2.5: none; not a bool: its TypeError
    return pytorch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **gqa)


def route(dispatcher, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor | None:
    """The output when the context decides the call, else None (the dispatcher goes on with the
    same arguments: a lower-right `CausalBias` on the inference route, or a mask subclass)."""
    if query.is_meta or query.is_nested:
        return pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if backends_restricted() or (is_causal is True and attn_mask is not None and some_backend_off()):
        # the caller's choice (a mask with is_causal: PyTorch's in any case, `check_mask_with_causal`); said
        # once where it goes over the budget (`sdpa_context`)
        training = dropout_p != 0.0 or (torch.is_grad_enabled() and (
            query.requires_grad or key.requires_grad or value.requires_grad))
        warn_if_over_budget(dispatcher.memory_budget, query, key, value, attn_mask, is_causal, enable_gqa, training)
        return pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if not is_causal_bias(attn_mask):
        return None
    alignment = causal_bias_alignment(attn_mask, is_causal, query.shape[-2], key.shape[-2])  # ValueError with is_causal
    if alignment == "top_left":
        return dispatcher.attention(query, key, value, None, dropout_p, True, scale=scale, enable_gqa=enable_gqa)
    training = dropout_p != 0.0 or (
        torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    )
    if training:
        return pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return None


def explain_arguments(query, key, attn_mask, is_causal) -> tuple[torch.Tensor | None, bool]:
    """``(attn_mask, is_causal)`` as the dispatcher decides on them: an upper-left `CausalBias`
    becomes ``is_causal=True`` (ValueError with ``is_causal`` already set)."""
    if is_causal_bias(attn_mask) and causal_bias_alignment(attn_mask, is_causal, query.shape[-2], key.shape[-2]) == "top_left":
        return None, True
    return attn_mask, is_causal


# the caller's `sdpa_kernel` restriction: what `explain` says runs, and the over-budget warning

RESTRICTED_LEVEL = "sdpa_kernel"
"""`RankingSource.level` of a decision the caller's restriction made."""
BACKEND_NAMES = ("flash", "efficient", "math", "cudnn")
"""PyTorch's backends in the order of `sdpa_default.BACKEND_SWITCHES`."""
MAX_CHECKED_SHAPES = 4096
"""Exact shapes whose restricted calls were checked against the budget, per process (then forgotten
and checked again: a warning may repeat, a check never grows memory without bound)."""
OPT_OUT = "respect_sdpa_kernel(False) or ATTN_DISPATCH_IGNORE_SDPA_KERNEL=1 lets the dispatcher choose instead"

_checked: set[tuple] = set()
_lock = threading.Lock()


def restriction_words() -> str:
    """``"sdpa_kernel restriction: math on; flash, efficient, cudnn off"``."""
    on = [name for name, enabled in zip(BACKEND_NAMES, BACKEND_SWITCHES, strict=True) if enabled()]
    off = [name for name in BACKEND_NAMES if name not in on]
    return f"sdpa_kernel restriction: {', '.join(on) or 'no backend'} on; {', '.join(off)} off"


def needed_bytes(problem: Problem, training: bool) -> tuple[str, int]:
    """The backend PyTorch runs `problem` with under the switches now (`default_backend_choice`) and
    its extra memory: forward workspace, or forward and backward when `training`."""
    backend = default_backend_choice(problem)
    kernel = kernel_from_name(backend)
    return backend, int(training_bytes(kernel, problem) if training else kernel.workspace_bytes(problem))


def restricted_decision(problem: Problem, device: torch.device, budget: int | None, *, training: bool) -> Decision:
    """The decision of a call the caller's restriction decides: PyTorch's SDPA with the backend it
    picks among those on, its memory, and whether that goes over `budget`."""
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
    """Log one WARNING per exact shape whose restricted call needs more than `budget` (module
    docstring). Never raises: a call PyTorch refuses raises its own error right after."""
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
"""``() -> bool``: some device's autocast is on (one C call; the warm path reads it only where the
hot path missed)."""


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast casts SDPA's inputs to on `device_type` now, or None where it is off."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except (TypeError, RuntimeError, AttributeError):  # a device type autocast does not know
        return None


def autocast_inputs(query, key, value, attn_mask) -> tuple | None:
    """``(query, key, value, attn_mask)`` as autocast hands them to SDPA (a `CausalBias` mask as
    given), or None where autocast is off for the query's device type (or the arguments are not
    tensors: validation speaks then)."""
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
