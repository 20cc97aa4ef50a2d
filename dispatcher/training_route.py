"""The training route: a call whose inputs require grad runs the fastest kernel with a backward whose
forward-plus-backward memory fits the budget (`choose_training`), ordered by measured training times
(`models.training_times`) where there are some, else the inference order. `TrainingRoute` caches the choice per
problem and warns once when it goes over budget. Dropout and a mask requiring grad go to PyTorch's SDPA
(`cold_path.ColdPath.training`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from attn_dispatch.dispatcher.decision import (
    ROUTE_TRAINING,
    TRAINING_KERNEL,
    Candidate,
    Decision,
    format_bytes,
    free_bytes,
    log_decision,
    logger,
)
from attn_dispatch.dispatcher.selection import Option, memory_limit, over_limit_reason, shrink_chunked
from attn_dispatch.kernels import Kernel, Problem
from attn_dispatch.kernels.base import training_bytes
from attn_dispatch.models.training_times import TrainingTimes


def pytorch_route_reason(dropout_p: float, inputs_grad: bool, mask_grad: bool, kernel: Kernel) -> str | None:
    """Why a call goes to PyTorch's SDPA on the training route; None when `kernel` runs it."""
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p} (only PyTorch's SDPA does dropout)"
    if mask_grad:
        return "the mask requires grad (only PyTorch's SDPA gives the mask a gradient)"
    if inputs_grad and not kernel.supports_backward:
        return f"inputs require grad and {kernel.name} has no backward"
    return None


@dataclass(frozen=True)
class TrainingChoice:
    """What the training route runs for one problem: `kernel` (None: PyTorch's SDPA), its forward+backward bound,
    fitting `candidates` in try order, `dropped` with reasons, `over_budget` (nothing fits: the smallest runs anyway)
    and `notes`."""

    kernel: Kernel | None
    workspace_bytes: int | None
    candidates: tuple[Candidate, ...]
    dropped: tuple[tuple[str, str], ...]
    over_budget: bool
    notes: tuple[str, ...]

    @property
    def name(self) -> str:
        return TRAINING_KERNEL if self.kernel is None else self.kernel.name


def order_for_training(options: Sequence[Option], measured: Mapping[str, float] | None) -> list[Option]:
    """Options with measured forward+backward times first (fastest first), then ranked order; last resorts last."""
    last = [o for o in options if getattr(o.kernel, "last_resort", False)]
    ranked = [o for o in options if o not in last]
    if measured:
        timed = sorted((o for o in ranked if o.kernel.name in measured), key=lambda o: measured[o.kernel.name])
        ranked = timed + [o for o in ranked if o.kernel.name not in measured]
    return ranked + last


def in_decided_order(plan) -> tuple[Option, ...]:
    """`plan`'s ranked options in its bucket's decided order, then the rest (docs/RESULTS.md#training-memory)."""
    decided = plan.bucket.options
    position = {option.kernel.name: i for i, option in enumerate(decided)}
    return tuple(sorted(plan.bucket.ranked.options, key=lambda o: position.get(o.kernel.name, len(decided))))


def choose_training(options: Sequence[Option], problem: Problem, *, free: int | None, budget: int | None,
                    failed: Mapping[str, str] | None = None,
                    measured: Mapping[str, float] | None = None) -> TrainingChoice:
    """The training route's decision for `problem`. `options`: runnable kernels in inference order; `free`, `budget`:
    bytes (None: unknown / none); `failed`: name -> why it failed on this route; `measured`: name -> forward+backward
    seconds."""
    failed = failed or {}
    limit = memory_limit(free, budget)
    fitting: list[tuple[Option, int]] = []
    over: list[tuple[Option, int]] = []
    dropped: list[tuple[str, str]] = []
    for option in order_for_training(options, measured):
        kernel = option.kernel
        if not kernel.supports_backward:
            dropped.append((kernel.name, "no backward (training needs one)"))
            continue
        if kernel.name in failed:
            dropped.append((kernel.name, f"failed on the training route: {failed[kernel.name]}"))
            continue
        why = kernel.reasons(problem)  # a bucket ranked with its probes deferred: they run here (`sdpa_default`)
        if why:
            dropped.append((kernel.name, "; ".join(why)))
            continue
        need = training_bytes(kernel, problem)
        why = over_limit_reason(need, free, budget)
        if why is None:
            fitting.append((option, need))
        else:
            over.append((option, need))
            dropped.append((kernel.name, f"forward+backward {why}"))
    order = "measured forward+backward times" if measured else "the inference ranking"
    notes: list[str] = []
    if not fitting and over and limit is not None:  # kernels with a backward run, none fits: smaller chunks
        shrunk = shrink_chunked(problem, limit, failed, training_bytes)  # by the forward+backward bound
        if shrunk is not None:
            fitting.append((Option(shrunk, None, int(shrunk.workspace_bytes(problem))), training_bytes(shrunk, problem)))
            notes.append(f"training: no ranked kernel's backward fits; {shrunk.name} uses smaller chunks to fit")
    candidates = tuple(Candidate(o.kernel.name, (measured or {}).get(o.kernel.name, o.predicted_s), need)
                       for o, need in fitting)
    if fitting:
        option, need = fitting[0]
        notes.append(f"training: {option.kernel.name} is the fastest kernel with a backward that fits "
                     f"(forward+backward {format_bytes(need)}; ordered by {order})")
        return TrainingChoice(option.kernel, need, candidates, tuple(dropped), False, tuple(notes))
    if over:
        option, need = min(over, key=lambda pair: pair[1])
        notes.append(f"OVER BUDGET: no kernel with a backward fits the memory limit of {format_bytes(limit)}; "
                     f"running {option.kernel.name}, the smallest, whose forward+backward needs {format_bytes(need)}")
        return TrainingChoice(option.kernel, need, (), tuple(dropped), True, tuple(notes))
    notes.append("training: every kernel of this dispatcher that can run it has no backward; PyTorch's SDPA runs it")
    return TrainingChoice(None, None, (), tuple(dropped), False, tuple(notes))


def training_decision(decision: Decision, choice: TrainingChoice) -> Decision:
    """The inference `decision` turned into the training route's (`explain`)."""
    return replace(decision, kernel=choice.name,
                   params={} if choice.kernel is None else dict(choice.kernel.params), route=ROUTE_TRAINING,
                   candidates=choice.candidates or decision.candidates, dropped=choice.dropped,
                   notes=(*decision.notes, *choice.notes))


class TrainingRoute:
    """Training decisions, one per (problem, device, budget); `times` defaults to `TrainingTimes.from_env`."""

    def __init__(self, times: TrainingTimes | None = None) -> None:
        self._times = times
        self._choices: dict[tuple, tuple[TrainingChoice, Decision]] = {}
        self._failed: dict[tuple, dict[str, str]] = {}
        self._lock = threading.Lock()

    def _times_now(self) -> TrainingTimes:
        if self._times is None:
            self._times = TrainingTimes.from_env()
        return self._times

    def choose(self, plan, budget: int | None) -> TrainingChoice:
        return self._entry(plan, budget)[0]

    def decision(self, plan, budget: int | None) -> Decision:
        return self._entry(plan, budget)[1]

    def _entry(self, plan, budget: int | None) -> tuple[TrainingChoice, Decision]:
        key = (plan.problem, plan.device, budget)
        entry = self._choices.get(key)
        if entry is not None:
            return entry
        with self._lock:
            entry = self._choices.get(key)
            if entry is None:
                choice = choose_training(
                    in_decided_order(plan), plan.problem, free=free_bytes(plan.device), budget=budget,
                    failed=self._failed.get(key), measured=self._times_now().lookup(plan.problem, plan.device))
                entry = self._choices[key] = (choice, training_decision(plan.decision, choice))
                log_decision(entry[1])
                if choice.over_budget:
                    logger.warning("%s", choice.notes[-1])
        return entry

    def failed(self, plan, budget: int | None, kernel: Kernel, error: BaseException) -> None:
        """`kernel` raised on the training route: decide again without it."""
        key = (plan.problem, plan.device, budget)
        with self._lock:
            self._failed.setdefault(key, {})[kernel.name] = f"{type(error).__name__}: {error}"
            self._choices.pop(key, None)

    def reset(self) -> None:
        with self._lock:
            self._choices.clear()
            self._failed.clear()
