"""`Dispatcher.explain` and `Dispatcher.decide`: the decision for a call or a `Problem`, without
running it (a base class of `core.Dispatcher`: it uses the dispatcher's plans and planners)."""

from __future__ import annotations

from dataclasses import replace

import torch

from attn_dispatch.dispatcher import sdpa_context
from attn_dispatch.dispatcher.autocast import any_autocast, autocast_inputs
from attn_dispatch.dispatcher.decision import ROUTE_TRAINING, TRAINING_KERNEL, Decision
from attn_dispatch.dispatcher.plans import cache_key
from attn_dispatch.dispatcher.restricted_calls import restricted_decision
from attn_dispatch.dispatcher.training_route import pytorch_route_reason
from attn_dispatch.kernels import Problem

_grad_enabled = torch.is_grad_enabled


class Explaining:
    """What `core.Dispatcher` would run, said without running it."""

    _ranking_options: dict = {}
    """More arguments of `ranking.resolve_ranking` for every new device (`use_table` sets them)."""

    def use_table(self, table, path: str) -> None:
        """Rank with `table` (a `models.ThresholdTable` read from `path`) on every device instead of
        the table each device's lookup finds (``attn-dispatch explain --table``); every decision
        made so far is forgotten (`reset`)."""
        self._ranking_options = {"given": (table, str(path))}
        self.reset()

    def explain(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        *,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Decision:
        """The decision `attention` makes (or made) for these arguments, without running it (under the
        caller's `sdpa_kernel` restriction: PyTorch's backend that runs, `restricted_calls`)."""
        if sdpa_context.backends_restricted() and not (query.is_meta or query.is_nested):
            grad = _grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
            problem = Problem.from_tensors(query, key, value, attn_mask, is_causal, enable_gqa)
            return restricted_decision(problem, query.device, self.memory_budget, training=dropout_p != 0.0 or grad)
        attn_mask, is_causal = sdpa_context.explain_arguments(query, key, attn_mask, is_causal)  # issue 13 hook
        cast = autocast_inputs(query, key, value, attn_mask) if any_autocast() else None
        if cast is not None:  # under torch.autocast: the inputs `attention` runs (`autocast`)
            query, key, value, attn_mask = cast
        key_ = cache_key(query, key, value, attn_mask, is_causal, enable_gqa)
        plan = self._plans.get(key_)
        if plan is None or plan.recheck:
            plan = self._plan_for(key_, query, key, value, attn_mask, is_causal, enable_gqa)
        grad = _grad_enabled()
        inputs_grad = grad and (query.requires_grad or key.requires_grad or value.requires_grad)
        why = pytorch_route_reason(dropout_p, False, grad and attn_mask is not None and attn_mask.requires_grad, plan.kernel)
        if why is None:
            return self._training_route.decision(plan, self.memory_budget) if inputs_grad else plan.decision
        return replace(plan.decision, kernel=TRAINING_KERNEL, params={}, route=ROUTE_TRAINING,
                       notes=(*plan.decision.notes, f"training: {why}"))

    def decide(self, problem: Problem, *, device: torch.device | str) -> Decision:
        """The decision for a `Problem` on `device` without tensors (``attn-dispatch explain``);
        not cached and not logged."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        planner = self._planner(device)
        return planner.decide(problem, budget=self.memory_budget, measure=self.measure,
                              on_failure=lambda name, error: None, defer_probes=False).explained()
