"""The one error an attention call raises when no kernel can run it.

Its message leads with the cause, on the first line (the memory budget is below the smallest
workspace any kernel needs; free memory is; no kernel supports the problem), then the problem,
then the details. `NoKernelError.reasons` keeps every kernel's reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from attn_dispatch.dispatcher.memory import format_bytes
from attn_dispatch.kernels import Problem
from attn_dispatch.models.environment import MEMORY_BUDGET


class NoKernelError(RuntimeError):
    """No kernel can run the problem: every one is unsupported, over the memory limit or failed.

    Attributes
    ----------
    problem: the problem; device: where; reasons: ``(kernel name, why)`` for every kernel;
    cause: the first line of the message (why nothing runs, and what to do).
    """

    def __init__(
        self, problem: Problem, device: str, reasons: Sequence[tuple[str, str]], *,
        smallest: tuple[str, int] | None = None, budget: int | None = None, free: int | None = None,
    ) -> None:
        """`smallest`: (kernel name, workspace bytes) of the runnable kernel that needs the least
        workspace, when every runnable kernel was dropped for memory; `budget`, `free`: the
        limits it was held to (bytes, None when there was none)."""
        self.problem = problem
        self.device = device
        self.reasons = tuple(reasons)
        self.cause = _cause(device, self.reasons, smallest, budget, free)
        if smallest is not None and (_over(smallest, budget) or _over(smallest, free)):
            over = sum("of workspace" in why for _, why in self.reasons)
            details = (f"  {over} kernels need more workspace than that; the other {len(self.reasons) - over} do "
                       f"not support this problem here (NoKernelError.reasons lists every kernel's reason)")
        else:
            details = "\n".join(f"  {name}: {why}" for name, why in self.reasons)
        super().__init__(f"{self.cause}\n  problem: {problem} on {device}\n{details}")

    @classmethod
    def nothing_fits(cls, ranked, fit, device: str, *, free: int | None, budget: int | None) -> NoKernelError:
        """The error for a `selection.Ranked` whose `selection.Fit` kept no option."""
        return cls(ranked.problem, device, ranked.dropped + fit.dropped, smallest=smallest_workspace(ranked),
                   budget=budget, free=free)


def smallest_workspace(ranked) -> tuple[str, int] | None:
    """(name, workspace bytes) of the runnable option of a `selection.Ranked` that needs the least
    workspace, counting the chunked kernel shrunk to its smallest chunks (`selection.MIN_CHUNK`),
    which the dispatcher tries when nothing else fits (of equal workspaces, the first name); None when no kernel
    supports the problem."""
    from attn_dispatch.dispatcher.selection import MIN_CHUNK
    from attn_dispatch.kernels import ChunkedKernel

    sizes = [(option.kernel.name, int(option.workspace_bytes)) for option in ranked.options]
    tiniest = ChunkedKernel(q=MIN_CHUNK, kv=MIN_CHUNK)
    if sizes and not tiniest.reasons(ranked.problem):
        sizes.append((tiniest.name, int(tiniest.workspace_bytes(ranked.problem))))
    return min(sizes, key=lambda item: (item[1], item[0]), default=None)  # ties by name: one message whatever the ranking


BUDGET_FIX = f"raise {MEMORY_BUDGET.name} or Dispatcher(memory_budget=...)"
"""What a `NoKernelError` over the memory budget tells a Python user to do (the CLI names its flag)."""


def _over(smallest: tuple[str, int], limit: int | None) -> bool:
    return limit is not None and smallest[1] > limit


def _cause(device: str, reasons: Sequence[tuple[str, str]], smallest: tuple[str, int] | None,
           budget: int | None, free: int | None) -> str:
    """The first line of a `NoKernelError`: the real reason, then the fix."""
    if not reasons:
        return "no attention kernel can run this problem: the dispatcher has no kernels; pass kernels='all'"
    if smallest is not None and _over(smallest, budget):
        name, need = smallest
        return (f"no attention kernel fits the memory budget of {format_bytes(budget)}: the smallest workspace this "
                f"problem needs is {format_bytes(need)} ({name}); {BUDGET_FIX} to at least that")
    if smallest is not None and _over(smallest, free):
        name, need = smallest
        return (f"no attention kernel fits in the {format_bytes(free)} free on {device}: the smallest workspace this "
                f"problem needs is {format_bytes(need)} ({name}); free device memory or split the batch")
    return (f"no attention kernel in this dispatcher's set can run this problem on {device} (first reason: "
            f"{reasons[0][0]}: {reasons[0][1]}); pass a kernel set that includes one for it")
