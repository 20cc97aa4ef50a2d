"""Calls per kernel name (`CallCounts`, a base class of `core.Dispatcher`): each cached plan counts
its own calls in a one-cell list (`Plan.count`, bumped in place on the warm path); the calls of
plans no longer cached and of the training route are kept per kernel name."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.plans import Plan


class CallCounts:
    """`stats` and the counts behind it (it uses the dispatcher's `_counts`, `_plans` and `_lock`)."""

    def _count_cell(self, name: str) -> list[int]:
        cell = self._counts.get(name)
        if cell is None:
            with self._lock:
                cell = self._counts.setdefault(name, [0])
        return cell

    def _fold_count(self, plan: Plan) -> None:
        """An evicted or replaced plan's calls stay in `stats`."""
        if plan.count[0]:
            self._count_cell(plan.kernel.name)[0] += plan.count[0]

    def stats(self) -> dict[str, int]:
        """Calls per kernel name since the last `reset` (training calls that went to PyTorch's SDPA
        count as `TRAINING_COUNT`, ``"pytorch_sdpa (training)"``). Approximate under concurrent calls."""
        with self._lock:
            counts = {name: cell[0] for name, cell in self._counts.items()}
            for plan in list(self._plans.values()):
                counts[plan.kernel.name] = counts.get(plan.kernel.name, 0) + plan.count[0]
        return {name: count for name, count in counts.items() if count}
