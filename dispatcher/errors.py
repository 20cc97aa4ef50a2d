"""The one error an attention call raises when no kernel can run it."""

from __future__ import annotations

from collections.abc import Sequence

from attn_dispatch.kernels import Problem


class NoKernelError(RuntimeError):
    """No kernel can run the problem: every one is unsupported, over the memory limit or failed.

    Attributes
    ----------
    problem: the problem; device: where; reasons: ``(kernel name, why)`` for every kernel.
    """

    def __init__(self, problem: Problem, device: str, reasons: Sequence[tuple[str, str]]) -> None:
        self.problem = problem
        self.device = device
        self.reasons = tuple(reasons)
        listed = "\n".join(f"  {name}: {why}" for name, why in self.reasons) or "  (no kernels configured)"
        super().__init__(
            f"no attention kernel can run {problem} on {device}. Every kernel's reason:\n{listed}\n"
            "Raise the memory budget (ATTN_DISPATCH_MEMORY_BUDGET / Dispatcher(memory_budget=...)), free "
            "device memory, or pass a kernel set that includes one for this problem."
        )
