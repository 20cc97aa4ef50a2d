"""One device's planner (the cold path): problem -> `Plan`, deciding once per size bucket (`selection.decide`, kept
as a `Bucket`) and planning each exact shape from its bucket. Nothing here is on the warm path."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch

from attn_dispatch.dispatcher.call_clock import clock_for
from attn_dispatch.dispatcher.decision import Candidate, Decision, free_bytes
from attn_dispatch.dispatcher.device_ranking import no_table_line
from attn_dispatch.dispatcher.device_state import DeviceState
from attn_dispatch.dispatcher.measuring import Trial
from attn_dispatch.dispatcher.plans import (
    MAX_BUCKETS,
    BoundedCache,
    Plan,
    SeenShapes,
    SpentCalls,
    mask_ndim_of,
)
from attn_dispatch.dispatcher.selection import (
    FASTER_DID_NOT_FIT,
    HISTORY,
    SETTLED,
    Option,
    Ranked,
    Tuned,
    compile_deferred_order,
    decide,
    decision_bucket,
    failure_bucket,
    first_call_setups,
    may_replace_first,
    needs_recheck,
    new_shape_order,
    over_limit_reason,
    put_first,
    shape_setup_seconds,
    workspace_bound,
)
from attn_dispatch.dispatcher.waiting_ranking import Waiting, WaitingRanking
from attn_dispatch.kernels import AccuracyPolicy, Kernel, Problem
from attn_dispatch.kernels.base import compile_seconds
from attn_dispatch.kernels.sdpa_default import probes_deferred
from attn_dispatch.models.environment import RECORD
from attn_dispatch.models.probe_store import ProbeCache


def _record(problem: Problem) -> None:
    """`recording.record_problem` where recording is on (``ATTN_DISPATCH_RECORD`` or a `record()` block)."""
    if RECORD.read() or "attn_dispatch.dispatcher.recording" in sys.modules:
        from attn_dispatch.dispatcher.recording import record_problem

        record_problem(problem)


@dataclass(frozen=True)
class PlannerConfig:
    """What a dispatcher's planners share; `tunings_root` None: in memory only; `count_cell`: see `measuring.Trial`."""

    kernels: Mapping[str, Kernel]
    policy: AccuracyPolicy
    signature: str
    tunings_root: Callable[[], object] | None
    count_cell: Callable[[str], list[int]] | None = None


@dataclass(frozen=True)
class Asked:
    """What a bucket is decided with: its first problem, the memory budget, whether to measure (`measure`: the
    setting; `trial`: for this decision), the bytes free, the failures and measured result known for it, and where a
    trial reports a failing candidate."""

    problem: Problem
    budget: int | None
    measure: bool
    trial: bool
    free: int | None
    failed: dict[str, str]
    tuned: Tuned | None
    on_failure: Callable[[str, BaseException], None]


class DevicePlanner:
    """Decisions for one device: per size bucket, and per exact shape from its bucket.

    `seen`: exact shapes each set-up-paying kernel has run (`SeenShapes`); `cold_costs` / `floors`: measured
    per-shape set-up seconds / per-call floors, name -> problem kind -> seconds (`models.probe_store`)."""

    def __init__(self, device: torch.device, state: DeviceState, config: PlannerConfig,
                 cold_costs: Mapping[str, Mapping[str, float]] | None = None,
                 floors: Mapping[str, Mapping[str, float]] | None = None, *, probes: ProbeCache | None = None,
                 lock: threading.RLock | None = None) -> None:
        self.device = device
        self.lock = lock if lock is not None else threading.RLock()  # the dispatcher's: a trial's result changes a bucket
        self.probes = probes  # backend probes kept across processes (GPUs): written after a decision
        self.state = state
        self.config = config
        self.buckets: BoundedCache[tuple, Bucket] = BoundedCache(MAX_BUCKETS)
        self.seen = SeenShapes()
        self.spent = SpentCalls()  # calls of evicted plans still waiting to settle
        self.waiting_ranking = WaitingRanking(self)  # buckets whose ranking waits for their second call
        self.cold_costs = {name: dict(by_kind) for name, by_kind in (cold_costs or {}).items()}
        self.floors = {name: dict(by_kind) for name, by_kind in (floors or {}).items()}
        # the portable set (gfx906's): PyTorch's default is its last resort, not a contender (`selection.measured_candidates`)
        self.portable = any(getattr(kernel, "last_resort", False) for kernel in config.kernels.values())

    # ------------------------------------------------------------------ per exact shape
    def plan(self, problem: Problem, shape_key: tuple, *, settings: Callable[[], tuple[int | None, bool]],
             on_failure: Callable[[str, BaseException], None], new_shape: bool = True) -> tuple[Plan, bool]:
        """The plan for one exact shape, and whether a bucket was decided for it (`settings()` read only then)."""
        key = decision_bucket(problem)
        bucket = self.buckets.get(key)
        decided = bucket is None
        if decided:
            _record(problem)
            budget, measure = settings()
            bucket = self.decide(problem, budget=budget, measure=measure, on_failure=on_failure, defer_ranking=True)
            self.buckets.put(key, bucket)
            if self.probes is not None:
                self.probes.save_new()
        plan = self._plan_in(bucket, problem, shape_key, first=decided)
        if plan is None:  # nothing the bucket chose runs or fits this exact shape: decide for it alone
            alone = self.decide(problem, budget=bucket.budget, measure=settings()[1], on_failure=on_failure, trial=False)
            plan = self._plan_in(alone, problem, shape_key, first=True)
            decided = True
        if plan is None:  # cannot happen: a decision's first option fits its own problem
            raise RuntimeError(f"attn_dispatch: no plan for {problem} although a kernel was decided")
        if new_shape:
            plan.bucket.history.append(plan.count)
        return plan, decided

    def settled(self, plan: Plan, shape_key: tuple) -> Plan | None:
        """`plan`'s shape on the bucket's decided order, ignoring set-up (`selection.settle_after`); None: no change."""
        settled = self._plan_in(plan.bucket, plan.problem, shape_key, first=False, settled=True)
        return None if settled is None or settled.kernel is plan.kernel else settled

    def _plan_in(self, bucket: Bucket, problem: Problem, shape_key: tuple, *, first: bool,
                 settled: bool = False) -> Plan | None:
        """The first of the bucket's options (new-shape order; decided order when `first` or `settled`) that runs
        `problem` and fits, else None."""
        if first and bucket.waiting is not None:
            return self.waiting_ranking.plan_default(bucket, problem, shape_key)
        settle_at = 0
        if first:
            order, notes = bucket.options, ()
        elif settled:
            order, notes = bucket.options, (SETTLED,)
        else:
            order, notes, settle_at = new_shape_order(
                bucket.options, bucket.warm, bucket.cold(self.cold_costs), bucket.measured,
                (cell[0] for cell in bucket.history), lambda name: self.seen.has(name, shape_key),
                self.floors)
            settle_at = self.spent.settle_at(shape_key, settle_at)
        waiting = None if settled else bucket.compile_wait(problem, self.cold_costs)
        if waiting is not None:  # the first option would compile now: a set-up-free one runs until it paid
            order, notes, settle_at = waiting
        own_problem = problem == bucket.ranked.problem
        failed = self.state.failures.get(bucket.key, {})
        free, skipped, budget = bucket.free, [], bucket.budget
        for option in order:
            kernel = option.kernel
            if kernel.name in failed:
                skipped.append((kernel.name, f"failed at run time on a problem of this size: {failed[kernel.name]}"))
                continue
            why = kernel.reasons(problem) if bucket.unprobed or not own_problem else ()  # what runs is probed first
            if why:
                skipped.append((kernel.name, "; ".join(why)))
                continue
            workspace = option.workspace_bytes if own_problem else workspace_bound(kernel, problem)
            if needs_recheck(workspace, free) and not first:  # first: `free` was read by the decision just made
                free = free_bytes(self.device)
            over = over_limit_reason(workspace, free, budget)
            if over is not None:
                skipped.append((kernel.name, over))
                continue
            if next(c for o, c in zip(bucket.options, bucket.cold(self.cold_costs), strict=True) if o is option):
                self.seen.add(kernel.name, shape_key)
            if skipped and any("free on the device" in why for _, why in skipped):
                notes = (*notes, FASTER_DID_NOT_FIT)
            plan = Plan(problem, self.device, kernel, workspace, needs_recheck(workspace, free), bucket,
                        notes if option is order[0] or skipped else (), tuple(skipped),
                        settle_at=settle_at if option is order[0] else 0, mask_ndim=mask_ndim_of(shape_key))
            trial = bucket.trial
            if trial is not None and trial.open:
                plan.measure_with(trial)
            if waiting is not None and option is order[0]:
                bucket.waited.append(plan.count)
            return plan
        return None

    # ------------------------------------------------------------------ per bucket
    def decide(self, problem: Problem, *, budget: int | None, measure: bool,
               on_failure: Callable[[str, BaseException], None], trial: bool = True,
               defer_probes: bool = True, defer_ranking: bool = False) -> Bucket:
        """`problem`'s bucket by `selection.decide`, with a `measuring.Trial` where wanted; `defer_probes`:
        `sdpa_default.probes_deferred`; `defer_ranking`: where PyTorch's default comes first whatever the ranking
        (`WaitingRanking.default_first`), the bucket waits for its second call to rank. Raises `NoKernelError`."""
        state, config = self.state, self.config
        bucket_key = failure_bucket(problem)
        free = free_bytes(self.device)
        state.open_store(config.tunings_root, config.signature)
        asked = Asked(problem, budget, measure, measure and trial, free, dict(state.failures.get(bucket_key, {})),
                      state.tuned.get(bucket_key), on_failure)
        bucket = Bucket(bucket_key, free=free, budget=budget, unprobed=defer_probes)
        default = self.waiting_ranking.default_first(asked) if defer_ranking else None
        if default is None:
            candidates = self.rank(bucket, asked, defer_probes=defer_probes)
            if candidates:
                bucket.trial = self.trial(bucket, candidates, asked)
        else:
            self.waiting_ranking.wait(bucket, asked, default)
        return bucket

    def rank(self, bucket: Bucket, asked: Asked, *, defer_probes: bool) -> tuple[Option, ...]:
        """Decide `bucket` by `selection.decide`; returns the candidates its calls measure."""
        state, config, problem = self.state, self.config, asked.problem
        with probes_deferred() if defer_probes else contextlib.nullcontext():  # `_plan_in` probes what runs
            selected = decide(problem, kernels=config.kernels, policy=config.policy, ranking=state.ranking,
                              failed=asked.failed, free=asked.free, budget=asked.budget, tuned=asked.tuned,
                              measure=asked.trial, device=self.device, portable=self.portable,
                              cold_costs=self.cold_costs,
                              notice=no_table_line(state.ranking.source.level, str(self.device), measure=asked.measure))
        options = selected.options
        decision = Decision(kernel=options[0].kernel.name, params=dict(options[0].kernel.params),
                            problem=problem, device=str(self.device), source=state.ranking.source,
                            candidates=tuple(option.candidate() for option in options),
                            dropped=selected.dropped, free_bytes=asked.free, budget_bytes=asked.budget,
                            notes=selected.notes)
        bucket.decided(selected.ranked, options, decision, selected.seconds)
        return selected.candidates

    def trial(self, bucket: Bucket, candidates: tuple[Option, ...], asked: Asked, **more) -> Trial:
        """The measuring of `bucket`'s `candidates` on its calls (`more`: further `measuring.Trial` arguments)."""
        return Trial(candidates, clock_for(self.device), fits=lambda kernel, exact: self._fits(bucket, kernel, exact),
                     cold_s=self.setup_seconds(candidates, asked.problem),
                     on_close=lambda trial: self._measured(bucket, trial), on_failure=asked.on_failure,
                     count_cell=self.config.count_cell, **more)

    def setup_seconds(self, options: tuple[Option, ...], problem: Problem) -> dict[str, float]:
        return first_call_setups(options, problem, self.cold_costs)

    def _fits(self, bucket: Bucket, kernel: Kernel, problem: Problem) -> bool:
        """Whether `kernel` runs this exact problem within the memory `bucket` was decided under."""
        if kernel.reasons(problem):
            return False
        return over_limit_reason(workspace_bound(kernel, problem), bucket.free, bucket.budget) is None

    def _measured(self, bucket: Bucket, trial: Trial) -> None:
        """`bucket`'s trial decided: keep its result, follow it, re-plan its measuring plans."""
        with self.lock:
            if trial.result is not None:
                self.state.keep_measured(bucket.key, trial.result, store=trial.compared)
            bucket.measured_by(trial)
            for plan in trial.plans:
                plan.recheck = True

    def forget_bucket(self, problem: Problem) -> None:
        self.buckets.pop(decision_bucket(problem))


class Bucket:
    """One size bucket's decision on one device.

    `ranked`: the first problem's ranked options (to refit when memory changes); `warm`: each option's per-call
    seconds, measured (`measured`: names) or predicted; `trial`: the measuring in progress (`measuring.Trial`), else
    None; `free`: bytes free when decided; `budget`: the memory budget decided under; `history`: call counters of
    recent exact shapes; `unprobed`: ranked with probes deferred, so `Kernel.reasons` is asked again before a run;
    `waiting`: while the ranking waits for the bucket's second call, what decides it then (`Waiting`), else None.
    Reading `ranked`, `options`, `decision`, `warm` or `measured` of a waiting bucket (unset) ranks it first."""

    __slots__ = ("key", "free", "budget", "unprobed", "history", "trial", "waited", "waiting", "ranked", "options",
                 "decision", "warm", "measured", "_cold", "_wait_calls")

    def __init__(self, key: tuple, *, free: int | None, budget: int | None, unprobed: bool = False) -> None:
        self.key = key
        self.free = free
        self.budget = budget
        self.unprobed = unprobed
        self.history: deque[list[int]] = deque(maxlen=HISTORY)
        self.trial = None
        self.waited: list[list[int]] = []
        self.waiting: Waiting | None = None  # `_cold`, `_wait_calls`: set with the decided fields (`_follow`)

    def decided(self, ranked: Ranked, options: tuple[Option, ...], decision: Decision,
                seconds: Mapping[str, float]) -> None:
        """Take the bucket's decision (`DevicePlanner.decide`)."""
        self.ranked = ranked
        self._follow(options, decision, seconds)

    def _follow(self, options: tuple[Option, ...], decision: Decision, seconds: Mapping[str, float]) -> None:
        self.options = options
        self.decision = decision
        self.warm = tuple(seconds.get(o.kernel.name, o.predicted_s) for o in options)
        self.measured = frozenset(seconds)
        self._cold: tuple[float, ...] | None = None
        self._wait_calls: int | None = None  # `compile_wait`'s calls for the bucket, once priced

    def __getattr__(self, name: str):
        """An unset slot: a decided field of a waiting bucket, read after ranking it (`Waiting.rank`)."""
        if name not in ("ranked", "options", "decision", "warm", "measured"):
            raise AttributeError(name)
        waiting = self.waiting
        if waiting is not None:
            waiting.rank()
        return object.__getattribute__(self, name)

    def measured_by(self, trial) -> None:
        """Follow a decided `trial`: its kernel first, its medians as warm times, failed candidates dropped, a note."""
        failed = {c.name: c.failure for c in trial.contenders if c.failure is not None}
        seconds = {} if trial.result is None else {name: s for name, s in trial.result.seconds}
        options = self.options if trial.result is None else put_first(self.options, trial.result.kernel)
        options = tuple(o for o in options if o.kernel.name not in failed) or options
        first = options[0].kernel
        decision = replace(self.decision, kernel=first.name, params=dict(first.params),
                           candidates=tuple(o.candidate() for o in options),
                           dropped=(*self.decision.dropped, *failed.items()),
                           notes=(*self.decision.notes, trial.describe()))
        self._follow(options, decision, seconds)
        self.trial = None

    def explained(self) -> Decision:
        """`decision` plus what a running trial has measured so far (`explain`)."""
        trial = self.trial
        if trial is None or not trial.open:
            return self.decision
        return replace(self.decision, notes=(*self.decision.notes, trial.describe()))

    def cold(self, measured: Mapping[str, float]) -> tuple[float, ...]:
        """Each option's per-shape set-up seconds (`selection.shape_setup_seconds`)."""
        options = self.options
        if self._cold is None:
            self._cold = tuple(shape_setup_seconds(o.kernel, self.ranked.problem, measured) for o in options)
        return self._cold

    def compile_wait(self, problem: Problem, measured: Mapping[str, float],
                     ) -> tuple[tuple[Option, ...], tuple[str, ...], int] | None:
        """Where the first option would compile (`selection.compile_deferred_order`): order, notes and calls left;
        else None."""
        compiling = compile_seconds(self.options[0].kernel, problem)
        if not compiling:
            self.waited.clear()
            return None
        cold = tuple(s + compile_seconds(o.kernel, problem) for s, o in zip(self.cold(measured), self.options, strict=True))
        order, notes, calls = compile_deferred_order(self.options, self.warm, cold, compiling, self.measured)
        if not calls:
            return None
        if self._wait_calls is None:
            self._wait_calls = calls
        left = max(1, self._wait_calls - sum(cell[0] for cell in self.waited))
        return order, notes, left

    def new_shapes_run_first(self, measured_cold: Mapping[str, float]) -> bool:
        """Whether every new shape keeps the decided order, whatever the history and set-up state."""
        cold = self.cold(measured_cold)
        if compile_seconds(self.options[0].kernel, self.ranked.problem):
            return False
        return not cold or not cold[0] or not any(may_replace_first(o, self.measured) for o in self.options[1:])

    def decision_for(self, problem: Problem, kernel: Kernel, workspace: int, notes: tuple[str, ...],
                     skipped: tuple[tuple[str, str], ...] = ()) -> Decision:
        """`decision` adapted to an exact shape running `kernel`, having passed over `skipped` (name, why)."""
        decision = self.explained()
        if problem == decision.problem and kernel.name == decision.kernel and not notes and not skipped:
            return decision
        passed = {name for name, _ in skipped}
        chosen = Candidate(kernel.name, next((c.predicted_s for c in decision.candidates if c.name == kernel.name), None),
                           workspace)
        first = decision.problem
        return replace(
            decision, kernel=kernel.name, params=dict(kernel.params), problem=problem,
            candidates=(chosen, *(c for c in decision.candidates if c.name != kernel.name and c.name not in passed)),
            dropped=(*skipped, *(d for d in decision.dropped if d[0] not in passed)),
            notes=(*decision.notes, *(n for n in notes if n not in decision.notes),
                   f"decided for its size bucket on a first shape of Lq={first.q_len} Lk={first.kv_len} B={first.batch}"),
        )
