"""The timing harness of `attn-dispatch bench`: every path of one shape, interleaved.

A *path* is anything with the kernel protocol: the dispatcher (behind an adapter the bench
command builds), PyTorch's SDPA called as a user calls it (`PytorchDefault`), the math kernel and
every single kernel (so the oracle, the best single kernel, is known). Per shape:

1. paths that cannot run (their `reasons`), whose workspace exceeds free memory or the budget
   ("skipped: over budget"), or that the ranker predicts hopeless are recorded and not run;
2. each other path goes once through `calibration.measure.measure` (support, memory budget,
   numerics gate, peak memory, out-of-memory handling, a first timing); a path already
   `loser_factor` slower than the best so far is timed once (``timed_once``);
3. the remaining contenders are timed round-robin, one sample per path per round (a batch of
   back-to-back calls of about `calibration.timer.TARGET_SAMPLE_S`), the order rotated each round, so that clock or
   thermal drift affects all alike.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from attn_dispatch.calibration.inputs import InputCache, rotation_count
from attn_dispatch.calibration.measure import SINGLE_SHOT, empty_cache, measure
from attn_dispatch.calibration.scenarios import Shape
from attn_dispatch.calibration.timer import (
    TimerSettings,
    calls_per_sample,
    interquartile_range,
    time_repetitions,
)
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from attn_dispatch.kernels.sdpa_default import SdpaDefaultKernel

ROLES = ("dispatcher", "pytorch", "kernel")
SKIPPED = "skipped"
MIN_PAIRED_ROUNDS = 2
"""Rounds two paths must share for a paired ratio (with one, it is the plain ratio)."""
# One round's sample of a path is a batch of back-to-back calls sized by the timer's rule
# (`calibration.timer.calls_per_sample`: about 2 ms per sample, for the reason given there).


class PytorchDefault(Kernel):
    """`F.scaled_dot_product_attention` called exactly as a user calls it (no canonicalisation):
    the baseline the dispatcher must beat."""

    family = "pytorch_default"
    _default = SdpaDefaultKernel()

    def reasons(self, problem: Problem) -> list[str]:
        return self._default.reasons(problem)

    def workspace_bytes(self, problem: Problem) -> int:
        return self._default.workspace_bytes(problem)

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem: Problem) -> torch.Tensor:
        gqa = {"enable_gqa": True} if enable_gqa else {}
        return pytorch_sdpa(query, key, value, attn_mask, 0.0, problem.causal, scale=scale, **gqa)


@dataclass(frozen=True)
class BenchSettings:
    """How hard the harness tries per shape.

    Attributes
    ----------
    rounds, min_rounds: interleaved rounds at most / at least (one repetition per path each).
    shape_budget_s: no new round starts once the shape has taken this long (after `min_rounds`).
    warmup: untimed calls of each path after its first (gated) call.
    loser_factor: a path whose first timing is this many times the best so far is timed once.
    hopeless_factor, hopeless_min_s: a kernel predicted `hopeless_factor` x slower than the best
        predicted path, and slower than `hopeless_min_s`, is not run (baselines always run).
    first_pass_budget_s: once the first pass of a shape has taken this long, its remaining single
        kernels (the predicted slowest: they come last) are not run; a guard against wrong
        predictions on huge shapes.
    """

    # Defaults: 3-10 samples give a median and an interquartile range (the timer's own DEFAULT
    # keeps 5-50); 3 s per shape keeps 35 GPU shapes within a few minutes; a path 4x slower than
    # the best cannot be the oracle whatever the noise; the 10x / 20 ms hopeless rule only skips
    # paths that would cost real time and that the ranker expects to be far behind.
    rounds: int = 10
    min_rounds: int = 3
    shape_budget_s: float = 3.0
    warmup: int = 1
    loser_factor: float = 4.0
    hopeless_factor: float = 10.0
    hopeless_min_s: float = 0.02
    first_pass_budget_s: float = 9.0

    def first_pass(self) -> TimerSettings:
        """What `measure` runs per path: warm-up, then one timed repetition."""
        return TimerSettings(warmup=self.warmup, min_reps=1, max_reps=1, target_relative_iqr=math.inf,
                             budget_s=self.shape_budget_s)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BenchPath:
    """A path to time: its label, the kernel-protocol object, its role, its predicted seconds."""

    label: str
    kernel: Kernel
    role: str = "kernel"
    predicted_s: float | None = None


@dataclass
class PathResult:
    """One path on one shape. `status`: ok / unsupported / infeasible (out of memory or over the
    budget while running) / inaccurate / failed / skipped (not run: over budget or hopeless)."""

    label: str
    role: str
    status: str
    reason: str = ""
    samples: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    rel_error: float | None = None
    workspace_bytes: int | None = None
    timed_once: bool = False

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples) if self.status == "ok" and self.samples else math.inf

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0 with fewer than two samples)."""
        median = self.median_s
        return interquartile_range(self.samples) / median if math.isfinite(median) and median > 0 else 0.0

    def to_dict(self) -> dict:
        median = self.median_s
        return {
            "path": self.label, "role": self.role, "status": self.status, "reason": self.reason,
            "median_s": median if math.isfinite(median) else None, "spread": self.spread, "reps": len(self.samples),
            "timed_once": self.timed_once, "peak_bytes": self.peak_bytes, "rel_error": self.rel_error,
            "workspace_bytes": self.workspace_bytes,
        }


@dataclass
class ShapeResult:
    """Every path of one shape, the dispatcher's chosen kernel and the rounds timed."""

    shape: Shape
    paths: list[PathResult]
    chosen: str | None = None
    rounds: int = 0
    wall_s: float = 0.0
    notes: tuple[str, ...] = ()  # the dispatcher's decision notes (memory, tuning timings)

    def path(self, role: str) -> PathResult | None:
        return next((p for p in self.paths if p.role == role), None)

    @property
    def oracle(self) -> PathResult | None:
        """The fastest single kernel measured (PyTorch's default counts as one)."""
        timed = [p for p in self.paths if p.role != "dispatcher" and math.isfinite(p.median_s)]
        return min(timed, key=lambda p: p.median_s) if timed else None

    def ratio(self, role: str) -> float | None:
        """Dispatcher time / the oracle's (``role="oracle"``) or PyTorch's default's (``"pytorch"``)."""
        pair = self._pair(role)
        return None if pair is None else pair[0].median_s / pair[1].median_s

    def paired_ratio(self, role: str) -> float | None:
        """`ratio` taken round by round: the median over the interleaved rounds of the dispatcher's
        sample / the other path's sample of the same round, so that load which changes between
        rounds cancels (llm_grid's paired ratio). The plain `ratio` where the two were not timed in
        the same rounds (a path timed once)."""
        pair = self._pair(role)
        if pair is None:
            return None
        mine, other = pair
        if len(mine.samples) != len(other.samples) or len(mine.samples) < MIN_PAIRED_ROUNDS:
            return mine.median_s / other.median_s
        return statistics.median(m / o for m, o in zip(mine.samples, other.samples, strict=True))

    def _pair(self, role: str) -> tuple[PathResult, PathResult] | None:
        mine = self.path("dispatcher")
        other = self.oracle if role == "oracle" else self.path(role)
        if mine is None or other is None or not (math.isfinite(mine.median_s) and math.isfinite(other.median_s)):
            return None
        return mine, other

    def to_dict(self) -> dict:
        oracle = self.oracle
        return {
            "scenario": self.shape.suite, "label": self.shape.label, "problem": self.shape.problem.to_dict(),
            "chosen": self.chosen, "oracle": oracle.label if oracle else None,
            "ratio_to_oracle": self.ratio("oracle"), "ratio_to_pytorch": self.ratio("pytorch"),
            "paired_ratio_to_oracle": self.paired_ratio("oracle"),
            "paired_ratio_to_pytorch": self.paired_ratio("pytorch"),
            "rounds": self.rounds, "wall_s": self.wall_s, "decision_notes": list(self.notes),
            "unsupported": sum(1 for p in self.paths if p.status == "unsupported"),
            "paths": [p.to_dict() for p in self.paths if p.status != "unsupported"],
        }


def _precheck(path: BenchPath, problem: Problem, limit: int | None, best_predicted: float | None,
              settings: BenchSettings) -> PathResult | None:
    """A result for a path that is not run (unsupported, over budget, hopeless), else None."""
    why = path.kernel.reasons(problem)
    if why:
        return PathResult(path.label, path.role, "unsupported", "; ".join(why))
    workspace = int(path.kernel.workspace_bytes(problem))
    inputs = problem.input_bytes
    if limit is not None and workspace + inputs > limit:
        return PathResult(path.label, path.role, SKIPPED, f"skipped: over budget (inputs {inputs} B + workspace "
                          f"{workspace} B > {limit} B free or allowed)", workspace_bytes=workspace)
    predicted = path.predicted_s
    if (path.role == "kernel" and path.label != "math" and predicted is not None and best_predicted
            and predicted > max(settings.hopeless_factor * best_predicted, settings.hopeless_min_s)):
        return PathResult(path.label, path.role, SKIPPED, f"skipped: predicted hopeless ({predicted / best_predicted:.0f}x "
                          "the best predicted path)", workspace_bytes=workspace)
    return None


def _first_pass(path: BenchPath, problem: Problem, device: torch.device, cache: InputCache, settings: BenchSettings,
                memory_budget: int | None, best: float) -> PathResult:
    loser_above = settings.loser_factor * best if math.isfinite(best) else None
    point = measure(path.kernel, problem, device, settings=settings.first_pass(), memory_budget=memory_budget,
                    cache=cache, single_shot_above_s=loser_above)
    result = PathResult(path.label, path.role, point.status, point.reason, peak_bytes=point.peak_bytes,
                        rel_error=point.rel_error, workspace_bytes=point.extra.get("workspace_bytes"))
    if point.status == "ok":
        result.samples = [point.median_s]
        result.timed_once = point.extra.get("stopped") in ("early", "budget") or (
            loser_above is not None and point.median_s > loser_above)
    return result


def _rounds(contenders: list[tuple[BenchPath, PathResult]], problem: Problem, device: torch.device,
            cache: InputCache, settings: BenchSettings, cap: int | None, started: float) -> int:
    """Interleaved rounds; each contender's first-pass sample is replaced by the rounds' samples.
    `cap`: bytes the rotated input sets may take (None: no cap)."""
    inputs = cache.input_sets(problem, device, 0, rotation_count(problem, device, cap))
    calls = {result.label: calls_per_sample(result.median_s) for _, result in contenders}
    fresh: dict[str, list[float]] = {result.label: [] for _, result in contenders}
    done = 0
    with torch.inference_mode():
        while done < settings.rounds and (done < settings.min_rounds or time.perf_counter() - started < settings.shape_budget_s):
            for offset in range(len(contenders)):
                path, result = contenders[(done + offset) % len(contenders)]
                count = calls[result.label]

                def run(_: int, kernel=path.kernel, count=count, first=done * count) -> None:
                    for j in range(first, first + count):
                        x = inputs[j % len(inputs)]
                        kernel.run(x.query, x.key, x.value, x.attn_mask, None, x.enable_gqa, problem)

                fresh[result.label].append(time_repetitions(run, device, SINGLE_SHOT).median_s / count)
            done += 1
    for _, result in contenders:
        result.samples = fresh[result.label]
    return done


def bench_shape(
    shape: Shape,
    device: torch.device | str,
    paths: Sequence[BenchPath],
    *,
    settings: BenchSettings = BenchSettings(),
    memory_budget: int | None = None,
    workspace_limit: int | None = None,
) -> ShapeResult:
    """Time every path of `shape` (see module docstring). Never raises for a path's failure.

    Parameters
    ----------
    paths: the dispatcher first, then PyTorch's default, then the single kernels (the order the
        first pass runs them in; the best so far decides who is a loser).
    memory_budget: bytes one call may use (inputs + workspace), passed to `measure`.
    workspace_limit: free memory or the budget, whichever is smaller: paths whose inputs and
        workspace exceed it are skipped without running.
    """
    device = torch.device(device)
    problem = shape.problem
    started = time.perf_counter()
    predictions = [p.predicted_s for p in paths if p.predicted_s is not None and p.role == "kernel"]
    best_predicted = min(predictions) if predictions else None
    cache = InputCache()
    results: list[PathResult] = []
    contenders: list[tuple[BenchPath, PathResult]] = []
    best = math.inf
    try:
        for path in paths:
            result = _precheck(path, problem, workspace_limit, best_predicted, settings)
            spent = time.perf_counter() - started
            if result is None and path.role == "kernel" and path.label != "math" and spent > settings.first_pass_budget_s:
                result = PathResult(path.label, path.role, SKIPPED, f"skipped: the shape's first pass took {spent:.1f} s, "
                                    f"over its {settings.first_pass_budget_s:g} s budget")
            if result is None:
                result = _first_pass(path, problem, device, cache, settings, memory_budget, best)
                best = min(best, result.median_s)
                if result.status == "ok" and not result.timed_once:
                    contenders.append((path, result))
            results.append(result)
        contenders = [(p, r) for p, r in contenders if p.role != "kernel" or r.median_s <= settings.loser_factor * best]
        racing = {id(r) for _, r in contenders}
        for result in results:
            result.timed_once = result.status == "ok" and id(result) not in racing
        widest = max((r.workspace_bytes or 0 for _, r in contenders), default=0)
        one_set = problem.input_bytes
        cap = None if memory_budget is None else max(memory_budget - widest, one_set)
        rounds = _rounds(contenders, problem, device, cache, settings, cap, started) if contenders else 0
    finally:
        cache.clear()
        empty_cache(device)
    return ShapeResult(shape, results, rounds=rounds, wall_s=time.perf_counter() - started)
