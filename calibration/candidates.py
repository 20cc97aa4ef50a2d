"""Which kernels a problem's sweep times, cheapest first (a cut-short run decides the most), and
which it records untimed: refused (unsupported), over the memory budget, hopeless by the prior, or
not worth their compile (infeasible).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from attn_dispatch.kernels.accuracy import AccuracyPolicy
from attn_dispatch.kernels.base import Kernel, compile_seconds
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import all_kernels, kernel_from_name, portable_kernels, serving
from attn_dispatch.models.identity import CardSpec
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.priors import prior_seconds

KERNEL_SETS = ("all", "portable")
# A kernel predicted this many times slower than the problem's fastest candidate, and slower than
# the per-point budget, is not timed.
HOPELESS_FACTOR = 50.0
COMPILE_WORTH_FACTOR = 2.0
"""A kernel whose first run here compiles for longer than the per-point budget (a Triton variant) is timed
only if predicted within this factor of the problem's fastest candidate
(docs/RESULTS.md#calibration-with-the-triton-tunables-h200)."""


def split_names(text: str) -> list[str]:
    """Split a comma-separated list of kernel names, keeping commas inside brackets:
    ``"math,chunked[q=128,kv=1024]"`` -> ``["math", "chunked[q=128,kv=1024]"]``."""
    names, depth, current = [], 0, []
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            names.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    names.append("".join(current).strip())
    return [name for name in names if name]


def kernel_set(spec: str, *, policy: AccuracyPolicy) -> list[Kernel]:
    """``"all"``, ``"portable"`` (what gfx906 has) or a comma-separated list of kernel names.
    Raises ValueError naming an unknown kernel."""
    if spec == "all":
        return serving(all_kernels(policy=policy))
    if spec == "portable":
        return serving(portable_kernels(policy=policy))
    names = split_names(spec)
    if not names:
        raise ValueError(f"--kernels must be 'all', 'portable' or kernel names, got {spec!r}")
    return [kernel_from_name(name, policy=policy) for name in names]


class CostEstimator:
    """Predicted seconds of (problem, kernel) from a card's spec sheet (the analytic prior); nan
    for kernels the prior does not know (they are timed, last)."""

    def __init__(self, spec: CardSpec) -> None:
        self.spec = spec

    def seconds(self, problem: Problem, kernel: Kernel) -> float:
        try:
            return float(prior_seconds(problem, kernel, self.spec))
        except (ValueError, KeyError, ZeroDivisionError, AttributeError):
            return math.nan

    def fastest(self, problem: Problem, kernels: list[Kernel]) -> float:
        """The smallest prediction among `kernels` that support `problem` (inf if none)."""
        times = (self.seconds(problem, k) for k in kernels if not k.reasons(problem))
        return min((t for t in times if math.isfinite(t)), default=math.inf)


@dataclass
class Triage:
    """A problem's kernels split into those to time (cheapest predicted first) and records of
    those decided without timing."""

    to_time: list[Kernel]
    decided: list[Measurement]
    predicted: dict[str, float]


def triage(problem: Problem, kernels: list[Kernel], *, estimator: CostEstimator, memory_budget: int | None,
           point_budget_s: float, device_key: str) -> Triage:
    """Split `kernels` for `problem`; see module docstring."""
    base = {"problem": problem, "device_key": device_key, "timestamp": time.time()}
    inputs = problem.input_bytes
    supported, decided = [], []
    for kernel in kernels:
        reasons = kernel.reasons(problem)
        if reasons:
            decided.append(Measurement(**base, kernel=kernel.name, status="unsupported", reason="; ".join(reasons)))
            continue
        workspace = kernel.workspace_bytes(problem)
        if memory_budget is not None and inputs + workspace > memory_budget:
            decided.append(Measurement(
                **base, kernel=kernel.name, status="infeasible", extra={"workspace_bytes": workspace},
                reason=f"inputs ({inputs} B) + workspace ({workspace} B) exceed the memory budget ({memory_budget} B)",
            ))
            continue
        supported.append(kernel)
    predicted = {k.name: estimator.seconds(problem, k) for k in supported}
    fastest = min((t for t in predicted.values() if math.isfinite(t)), default=math.inf)
    to_time = []
    for kernel in supported:
        guess = predicted[kernel.name]
        compiling = compile_seconds(kernel, problem)
        if math.isfinite(guess) and guess > point_budget_s and guess > HOPELESS_FACTOR * fastest:
            decided.append(Measurement(
                **base, kernel=kernel.name, status="infeasible", extra={"predicted_s": guess, "skipped": "hopeless"},
                reason=f"not timed: predicted {guess:.3g} s per call, over {HOPELESS_FACTOR:.0f}x the fastest "
                f"candidate ({fastest:.3g} s) and over the per-point budget ({point_budget_s:g} s)",
            ))
        elif compiling > point_budget_s and math.isfinite(guess) and guess > COMPILE_WORTH_FACTOR * fastest:
            decided.append(Measurement(
                **base, kernel=kernel.name, status="infeasible", extra={"predicted_s": guess, "skipped": "compile"},
                reason=f"not timed: its first run here compiles (~{compiling:.3g} s, over the per-point budget of "
                f"{point_budget_s:g} s) and it is predicted {guess / fastest:.3g}x the fastest candidate",
            ))
        else:
            to_time.append(kernel)
    to_time.sort(key=lambda k: (not math.isfinite(predicted[k.name]), predicted[k.name] if math.isfinite(predicted[k.name]) else 0.0))
    return Triage(to_time, decided, predicted)
