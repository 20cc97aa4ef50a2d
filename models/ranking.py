"""The ranking interface the dispatcher uses: anything with ``rank(problem, kernels)``.

A ranker returns the supported kernels' names with predicted seconds, fastest first. The analytic
prior (`models.priors.PriorRanker`) and a threshold table (`models.table.ThresholdTable`) are
rankers.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from attn_dispatch.kernels.accuracy import AccuracyPolicy
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import kernel_from_name

# Kernel names are validated against the registry under the most permissive policy: whether a
# lossy conversion may *run* is the dispatcher's policy, not a property of the name.
_ANY_POLICY = AccuracyPolicy.allowing("any")


@runtime_checkable
class Ranker(Protocol):
    """Predicts which kernels are fastest for a problem."""

    def rank(self, problem: Problem, kernels: Iterable[Kernel]) -> list[tuple[str, float]]:
        """Supported kernels' names and predicted seconds, fastest first."""
        ...


def supported(problem: Problem, kernels: Iterable[Kernel]) -> list[Kernel]:
    """The kernels of `kernels` whose `reasons(problem)` is empty, in order, without duplicates."""
    seen: set[str] = set()
    result = []
    for kernel in kernels:
        if kernel.name not in seen and not kernel.reasons(problem):
            seen.add(kernel.name)
            result.append(kernel)
    return result


UNPRICED = float("inf")
"""Predicted seconds of a kernel no model can price (not a registry kernel): ranked last."""


def priceable(kernel: Kernel) -> bool:
    """True for kernels the registry can build from their name (the ones priors and models know)."""
    try:
        kernel_named(kernel.name)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def kernel_named(name: str) -> Kernel:
    """A kernel object for a canonical name (cached); ValueError for names that are not ours."""
    return kernel_from_name(name, policy=_ANY_POLICY)
