"""What runs when the caller's `sdpa_kernel` restriction decides a call (`sdpa_context.route`), as
`explain` says it, and the warning when that goes over the memory budget.

Inside ``with sdpa_kernel([SDPBackend.MATH])`` (or with a backend switched off) the dispatcher
hands the call to PyTorch's SDPA as given: PyTorch's own choice among the backends left on runs,
whatever the dispatcher would have chosen. So `explain` names the restriction and that backend
(`restricted_decision`), not the kernel of an unrestricted call; and where a memory budget is set
(``ATTN_DISPATCH_MEMORY_BUDGET`` or the dispatcher's), a call whose backend needs more than the
budget (its forward workspace, or forward and backward for inputs requiring grad:
`kernels.backward_memory.training_bytes`) logs one WARNING per exact shape naming the budget and
the bytes (`warn_if_over_budget`).
"""

from __future__ import annotations

import logging
import threading

import torch

from attn_dispatch.dispatcher.decision import Candidate, Decision, RankingSource, format_bytes, free_bytes
from attn_dispatch.dispatcher.plans import cache_key
from attn_dispatch.kernels import Problem, kernel_from_name
from attn_dispatch.kernels.backward_memory import training_bytes
from attn_dispatch.kernels.sdpa_probe import BACKEND_SWITCHES, default_backend_choice

logger = logging.getLogger("attn_dispatch")

RESTRICTED_LEVEL = "sdpa_kernel"
"""`RankingSource.level` of a decision the caller's restriction made."""
BACKEND_NAMES = ("flash", "efficient", "math", "cudnn")
"""PyTorch's backends in the order of `sdpa_probe.BACKEND_SWITCHES`."""
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
