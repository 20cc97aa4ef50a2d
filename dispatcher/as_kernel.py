"""A `Dispatcher` behind the kernel protocol, so calibration's harness can time it like any kernel."""

from __future__ import annotations

import torch

from attn_dispatch.dispatcher.core import Dispatcher
from attn_dispatch.dispatcher.decision import NoKernelError
from attn_dispatch.kernels._layout import is_causal_bias
from attn_dispatch.kernels.accuracy import Tolerance
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem

DISPATCHER_PATH = "dispatcher"


class DispatchedKernel(Kernel):
    """`dispatcher.attention` as a kernel (the warm path on every call). `settle_calls`: repeat a call whose bucket
    is still measuring up to this many times, so timed calls see the bucket as it serves for good."""

    family = DISPATCHER_PATH

    def __init__(self, dispatcher: Dispatcher, device: torch.device | str, *, settle_calls: int = 0) -> None:
        self.dispatcher = dispatcher
        self.device = torch.device(device)
        self.settle_calls = settle_calls

    def reasons(self, problem: Problem) -> list[str]:
        try:
            self.dispatcher.decide(problem, device=self.device)
        except NoKernelError as error:
            return [str(error)]
        return []

    def workspace_bytes(self, problem: Problem) -> int:
        decision = self.dispatcher.decide(problem, device=self.device)
        return decision.candidates[0].workspace_bytes if decision.candidates else 0

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem: Problem) -> torch.Tensor:
        causal = problem.causal and not is_causal_bias(attn_mask)  # a CausalBias carries it
        out = self.dispatcher.attention(query, key, value, attn_mask, 0.0, causal, scale=scale, enable_gqa=enable_gqa)
        for _ in range(self.settle_calls if self._measuring(problem) else 0):
            out = self.dispatcher.attention(query, key, value, attn_mask, 0.0, causal, scale=scale,
                                            enable_gqa=enable_gqa)
            if not self._measuring(problem):
                break
        return out

    def _measuring(self, problem: Problem) -> bool:
        """Whether the dispatcher's plan for `problem` still measures its bucket's candidates."""
        return any(plan.problem == problem and plan.trial is not None and plan.trial.open
                   for plan in self.dispatcher._plans.values())

    def tolerance(self, problem: Problem) -> Tolerance:
        """The tolerance of the kernel the dispatcher runs (an allowed lossy conversion: its target dtype's)."""
        plan = self._plan(problem)
        kernel = None if plan is None else plan.kernel
        if kernel is None:
            try:
                kernel = self.dispatcher._kernels.get(self.dispatcher.decide(problem, device=self.device).kernel)
            except NoKernelError:
                kernel = None
        return kernel.tolerance(problem) if kernel is not None else super().tolerance(problem)

    def _plan(self, problem: Problem):
        """The dispatcher's first cached plan for `problem`, else None."""
        return next((plan for plan in self.dispatcher._plans.values() if plan.problem == problem), None)

    def notes(self, problem: Problem) -> tuple[str, ...]:
        plan = self._plan(problem)
        return () if plan is None else tuple(plan.decision.notes)

    def chosen(self, problem: Problem) -> str | None:
        """The kernel the dispatcher runs for `problem` (after fallbacks), else would choose now, else None."""
        plan = self._plan(problem)
        if plan is not None:
            return plan.kernel.name
        try:
            return self.dispatcher.decide(problem, device=self.device).kernel
        except NoKernelError:
            return None
