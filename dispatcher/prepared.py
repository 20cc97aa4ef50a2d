"""`PreparedAttention`: a decision made once for one exact call shape, run many times with no lookup
(FlashInfer's plan/run). `Dispatcher.plan` makes it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attn_dispatch.dispatcher.plans import Plan, cache_key

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.core import Dispatcher

_grad_enabled = torch.is_grad_enabled


class PreparedAttention:
    """``prepared(query, key, value, attn_mask=None)``: `F.scaled_dot_product_attention` with the
    flags given to `Dispatcher.plan`, run by the kernel decided there.

    Calls must have the planned shapes, dtypes, devices and layouts (checked: a mismatch raises
    ValueError naming the planned and the given values). Calls needing a gradient through a kernel
    without a backward go through `Dispatcher.attention` (its training route).
    """

    __slots__ = ("_dispatcher", "_plan", "_key", "_causal", "_scale", "_gqa", "_count")

    def __init__(self, dispatcher: Dispatcher, plan: Plan, key: tuple, *, is_causal: bool, scale: float | None,
                 enable_gqa: bool) -> None:
        self._dispatcher = dispatcher
        self._plan = plan
        self._key = key
        self._causal = is_causal
        self._scale = scale
        self._gqa = enable_gqa
        # `stats()` counts calls that ran a kernel; meta calls compute shapes only (as `attention`'s)
        self._count = [0] if plan.problem.device_type == "meta" else plan.count

    @property
    def kernel(self) -> str:
        """The chosen kernel's name."""
        return self._plan.kernel.name

    @property
    def decision(self):
        """The `Decision` behind it (what `Dispatcher.explain` shows)."""
        return self._plan.decision

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run the planned kernel: ``[..., Hq, L, E]``, ``[..., Hkv, S, E]``, ``[..., Hkv, S, Ev]``
        (and the mask, if planned with one) -> ``[..., Hq, L, Ev]``."""
        given = cache_key(query, key, value, attn_mask, self._causal, self._gqa)
        if given != self._key:
            raise ValueError(_mismatch(self._key, given))
        plan = self._plan
        if _grad_enabled() and not plan.kernel.supports_backward and (
                query.requires_grad or key.requires_grad or value.requires_grad
                or (attn_mask is not None and attn_mask.requires_grad)):
            return self._dispatcher.attention(query, key, value, attn_mask, 0.0, self._causal, scale=self._scale,
                                              enable_gqa=self._gqa)
        self._count[0] += 1
        try:
            return plan.run(query, key, value, attn_mask, self._scale, self._gqa, plan.problem)
        except Exception as error:  # noqa: BLE001 - the dispatcher's fallback takes over
            return self._dispatcher._cold.recover(plan, self._key, error, query, key, value, attn_mask, self._scale, self._gqa)

    def __repr__(self) -> str:
        return f"PreparedAttention({self._plan.decision.summary()})"


_FIELDS = ("query shape", "key shape", "value shape", "query dtype", "key dtype", "value dtype", "query device",
           "key device", "value device", "query, key and value contiguous", "mask (shape, dtype, device, class)",
           "is_causal", "enable_gqa")


def _mismatch(planned: tuple, given: tuple) -> str:
    """One line naming every field where `given` differs from `planned` (`cache_key` order)."""
    diffs = [f"{name} {want} planned, {got} given" for name, want, got in zip(_FIELDS, planned, given, strict=True)
             if want != got]
    return ("this PreparedAttention was planned for another call: " + "; ".join(diffs)
            + " (call dispatcher.plan(...) for the new shape)")
