"""The cached decision of one exact call shape (what the warm path reads) and its cache key."""

from __future__ import annotations

import torch

from attn_dispatch.dispatcher.decision import Decision
from attn_dispatch.dispatcher.planning import Ranked
from attn_dispatch.kernels import Kernel, Problem


class Plan:
    """A decision ready to run: the kernel, the validated problem, and what it was chosen from.

    Attributes
    ----------
    recheck: go through `Dispatcher._plan_for` before each call: to re-check free memory (see
        `planning.RECHECK_FRACTION`), or because `tune_pending`.
    tune_pending: tuning is on but this decision was made without a call's inputs to time (by
        `explain`, on the training route or under CUDA graph capture); the next inference call
        with inputs tunes the bucket and replaces it.
    count: the chosen kernel's call counter (a one-element list shared by every plan that
        chose the kernel, so `Dispatcher.stats` sums them without a lookup per call).
    """

    __slots__ = ("problem", "device", "kernel", "run", "workspace", "recheck", "ranked", "decision", "count",
                 "tune_pending")

    def __init__(
        self,
        problem: Problem,
        device: torch.device,
        kernel: Kernel,
        workspace: int,
        recheck: bool,
        ranked: Ranked,
        decision: Decision,
        count: list[int],
        tune_pending: bool = False,
    ) -> None:
        self.problem = problem
        self.device = device
        self.kernel = kernel
        self.run = kernel.run  # bound once: the warm path saves an attribute lookup per call
        self.workspace = workspace
        self.recheck = recheck
        self.ranked = ranked
        self.decision = decision
        self.count = count
        self.tune_pending = tune_pending


def cache_key(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    enable_gqa: bool,
) -> tuple:
    """Everything `Problem.from_tensors` validates and reads, from tensor attributes only: shapes,
    dtypes, devices and contiguity of every input, the mask's shape, dtype and device, and the
    flags. Two calls with equal keys have the same `Problem` and the same validity.

    Raises AttributeError for inputs that are not tensors (the caller validates those).
    """
    mask = None if attn_mask is None else (attn_mask.shape, attn_mask.dtype, attn_mask.device)
    return (
        query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype,
        query.device, key.device, value.device,
        query.is_contiguous(), key.is_contiguous(), value.is_contiguous(),
        mask, is_causal, enable_gqa,
    )


MAX_MESSAGE = 200
"""Characters of a failure's message kept in `explain` (a CUDA OOM message runs to a paragraph)."""


def failure_message(error: BaseException) -> str:
    """``"RuntimeError: first line of the message"``."""
    text = str(error).strip().splitlines()
    first = text[0][:MAX_MESSAGE] if text else ""
    return f"{type(error).__name__}: {first}"


def check_scale(scale: object) -> None:
    """SDPA's own check of `scale` (the cache key does not see it): raise before a bad argument
    is blamed on the kernels."""
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scaled_dot_product_attention(): argument 'scale' must be float or None, not {type(scale).__name__}")
