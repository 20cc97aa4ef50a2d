"""One device's planner: from a validated problem to a `Plan`, deciding once per size bucket.

The cold path of `Dispatcher` in one place. A new bucket is decided by `selection.decide` (the
stages, in order) and kept as a `Bucket`; its calls may measure its candidates (`measuring.Trial`).
Each exact shape then gets its plan from its bucket (`DevicePlanner.plan`): the bucket's first
option that runs the exact problem and fits, in the set-up-cost order for a new shape
(`selection.new_shape_order`). Per device it keeps the ranker, the kernels that failed per bucket
and the buckets measured on their calls (`DeviceState`), which exact shapes each kernel has set up
(`SeenShapes`), and its backend probes across processes (`ProbeCache`). Nothing here is on the
warm path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from attn_dispatch.dispatcher.decision import Candidate, Decision, failure_message, free_bytes
from attn_dispatch.dispatcher.device_ranking import DeviceRanking, no_table_line
from attn_dispatch.dispatcher.measuring import Trial, clock_for
from attn_dispatch.dispatcher.plans import MAX_BUCKETS, BoundedCache, Plan, mask_ndim_of
from attn_dispatch.dispatcher.selection import (
    FASTER_DID_NOT_FIT,
    HISTORY,
    SETTLED,
    Option,
    Ranked,
    Tuned,
    cold_seconds,
    compile_deferred_order,
    compile_seconds,
    decide,
    decision_bucket,
    failure_bucket,
    may_replace_first,
    needs_recheck,
    new_shape_order,
    over_limit_reason,
    put_first,
    shape_setup_seconds,
)
from attn_dispatch.kernels import AccuracyPolicy, Kernel, Problem
from attn_dispatch.kernels.sdpa_default import passed_probes, probes_deferred, seed_passed_probes
from attn_dispatch.models.probe_store import load_cold_costs
from attn_dispatch.models.environment import RECORD


def _record(problem: Problem) -> None:
    """`recording.record_problem`, where a workload is being recorded: ``ATTN_DISPATCH_RECORD`` or
    a `record()` block (which imported `recording`)."""
    if RECORD.read() or "attn_dispatch.dispatcher.recording" in sys.modules:
        from attn_dispatch.dispatcher.recording import record_problem

        record_problem(problem)


@dataclass(frozen=True)
class PlannerConfig:
    """What a dispatcher's planners share: its kernel set, accuracy policy, where measured buckets
    are kept (`tunings_root() -> directory`, None: in memory only) under which kernel-set signature,
    and where a measuring call run by another kernel than its plan's is counted (`count_cell`)."""

    kernels: Mapping[str, Kernel]
    policy: AccuracyPolicy
    signature: str
    tunings_root: Callable[[], object] | None
    count_cell: Callable[[str], list[int]] | None = None


class DevicePlanner:
    """Decisions for one device: per size bucket, and per exact shape from its bucket.

    Attributes
    ----------
    state: the device's ranker, remembered failures and measured buckets (`DeviceState`).
    buckets: bucket key -> `Bucket` (bounded: `plans.MAX_BUCKETS`).
    seen: exact shapes each kernel with a per-shape set-up has already run (`SeenShapes`).
    cold_costs: measured seconds of per-shape set-up, kernel name or backend family -> problem
        kind -> seconds (`models.probe_store`; empty: `selection.cold_seconds`' priors serve).
    floors: measured per-call floors, kernel name -> problem kind -> seconds (`selection.floor_seconds`).
    """

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
        self.cold_costs = {name: dict(by_kind) for name, by_kind in (cold_costs or {}).items()}
        self.floors = {name: dict(by_kind) for name, by_kind in (floors or {}).items()}
        # the portable set (gfx906's): PyTorch's default is its last resort, not a contender (`selection.measured_candidates`)
        self.portable = any(getattr(kernel, "last_resort", False) for kernel in config.kernels.values())

    # ------------------------------------------------------------------ per exact shape
    def plan(self, problem: Problem, shape_key: tuple, *, settings: Callable[[], tuple[int | None, bool]],
             on_failure: Callable[[str, BaseException], None], new_shape: bool = True) -> tuple[Plan, bool]:
        """The plan for one exact shape, and whether a new bucket decision was made for it.
        `settings() -> (memory budget, measure)`, read only when a bucket is decided (a decided
        bucket keeps its budget: `Dispatcher.reset` after changing it); `new_shape`: the shape has no
        plan yet (it joins the bucket's history)."""
        key = decision_bucket(problem)
        bucket = self.buckets.get(key)
        decided = bucket is None
        if decided:
            _record(problem)
            budget, measure = settings()
            bucket = self.decide(problem, budget=budget, measure=measure, on_failure=on_failure)
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
        """`plan`'s shape, planned on its bucket's decided order with no regard to per-shape
        set-up (`selection.settle_after`: the shape has been called often enough to pay it);
        None when nothing else runs or fits it."""
        settled = self._plan_in(plan.bucket, plan.problem, shape_key, first=False, settled=True)
        return None if settled is None or settled.kernel is plan.kernel else settled

    def _plan_in(self, bucket: Bucket, problem: Problem, shape_key: tuple, *, first: bool,
                 settled: bool = False) -> Plan | None:
        """The first of the bucket's options (in its order for a new shape, or its decided order
        when `first` or `settled`) that runs `problem` and fits; None when none does. The memory
        free now is asked only for a workspace large next to what was free when the bucket was
        decided."""
        settle_at = 0
        if first:
            order, notes = bucket.options, ()
        elif settled:
            order, notes = bucket.options, (SETTLED,)
        else:
            order, notes, settle_at = bucket.order_for_new_shape(
                lambda name: self.seen.has(name, shape_key), self.cold_costs, self.floors)
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
            if own_problem and not (bucket.unprobed and kernel.reasons(problem)):  # what runs is probed first
                workspace = option.workspace_bytes
            elif own_problem:
                skipped.append((kernel.name, "; ".join(kernel.reasons(problem))))
                continue
            else:
                why = kernel.reasons(problem)
                if why:
                    skipped.append((kernel.name, "; ".join(why)))
                    continue
                workspace = workspace_bound(kernel, problem)
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
               defer_probes: bool = True) -> Bucket:
        """`problem`'s bucket decided by `selection.decide` (its result measured on an earlier call or
        process first, else, with `measure` and `trial`, a `measuring.Trial` of its candidates on its
        next calls; not for a shape decided apart from its bucket). `defer_probes`: rank without
        running backend probes not run yet (`sdpa_default.probes_deferred`); a kernel is probed where it
        is about to run (`_plan_in`, `measuring.Trial`, the training route). Raises `NoKernelError`
        when nothing can run it within the memory limit."""
        state, config = self.state, self.config
        bucket_key = failure_bucket(problem)
        failed = state.failures.get(bucket_key, {})
        free = free_bytes(self.device)
        state.open_store(config.tunings_root, config.signature)
        with probes_deferred() if defer_probes else contextlib.nullcontext():  # `_plan_in` probes what runs
            selected = decide(problem, kernels=config.kernels, policy=config.policy, ranking=state.ranking,
                              failed=failed, free=free, budget=budget, tuned=state.tuned.get(bucket_key),
                              measure=measure and trial, device=self.device, portable=self.portable,
                              cold_costs=self.cold_costs,
                              notice=no_table_line(state.ranking.source.level, str(self.device), measure=measure))
        options = selected.options
        decision = Decision(
            kernel=options[0].kernel.name, params=dict(options[0].kernel.params), problem=problem,
            device=str(self.device), source=state.ranking.source,
            candidates=tuple(option.candidate() for option in options),
            dropped=selected.dropped, free_bytes=free, budget_bytes=budget, notes=selected.notes,
        )
        bucket = Bucket(bucket_key, selected.ranked, options, decision, seconds=selected.seconds, free=free,
                        unprobed=defer_probes)
        candidates = selected.candidates
        if candidates:
            bucket.trial = Trial(candidates, clock_for(self.device), fits=lambda kernel, exact: self._fits(bucket, kernel, exact),
                                 cold_s={o.kernel.name: cold_seconds(o.kernel, problem, self.cold_costs) for o in candidates},
                                 on_close=lambda trial: self._measured(bucket, trial), on_failure=on_failure,
                                 count_cell=config.count_cell)
        return bucket

    def _fits(self, bucket: Bucket, kernel: Kernel, problem: Problem) -> bool:
        """Whether `kernel` runs this exact problem of `bucket` (probed: `Kernel.reasons`) within the
        memory it was decided under (`workspace_bytes`)."""
        if kernel.reasons(problem):
            return False
        return over_limit_reason(workspace_bound(kernel, problem), bucket.free, bucket.budget) is None

    def _measured(self, bucket: Bucket, trial: Trial) -> None:
        """`bucket`'s trial is decided: its result is kept (this process, and the tuning store where
        it compared candidates: `Trial.compared`), the bucket follows it, and its measuring plans
        are planned again at their next call."""
        with self.lock:
            if trial.result is not None:
                self.state.keep_measured(bucket.key, trial.result, store=trial.compared)
            bucket.measured_by(trial)
            for plan in trial.plans:
                plan.recheck = True

    def forget_bucket(self, problem: Problem) -> None:
        """Drop `problem`'s bucket decision (a kernel of it failed: the next shape decides anew)."""
        self.buckets.pop(decision_bucket(problem))


def workspace_bound(kernel: Kernel, problem: Problem) -> int:
    """`kernel`'s workspace on `problem`, estimated without running a probe: a probe not run yet
    answers as `sdpa_default.probes_deferred` does (native GQA taken as absent: K/V counted repeated),
    so the bound is never under what the call takes, and no call waits for a probe to size memory
    (PyTorch's default sizes its backend's GQA, a probe of its own, on every decode step's new shape)."""
    with probes_deferred():
        return int(kernel.workspace_bytes(problem))


class Bucket:
    """One size bucket's decision on one device.

    Attributes
    ----------
    key: the bucket (`selection.failure_bucket` of its first problem).
    ranked: the first problem's ranked options (kept to refit when memory changes).
    options: the options that fitted when decided, in try order (a measured winner first).
    decision: the decision made for the first problem (`explain` adapts it per exact shape).
    warm: seconds per warm call of each option: measured on the bucket's calls (`seconds`, kernel
        name -> seconds; empty where nothing was timed), else predicted.
    measured: the options whose warm time was measured (the names in `seconds`).
    trial: its candidates being measured on its calls (`measuring.Trial`), None once decided or
        where nothing is measured.
    free: bytes free on the device when decided (None: unknown, e.g. the CPU).
    history: the call counters of the bucket's most recent exact shapes (`selection.new_shape_order`).
    unprobed: ranked with backend probes deferred (`sdpa_default.probes_deferred`): an option is asked
        its `Kernel.reasons` again before it runs.
    """

    __slots__ = ("key", "ranked", "options", "decision", "trial", "free", "history", "warm", "measured", "unprobed",
                 "waited", "_cold", "_wait_calls")

    def __init__(self, key: tuple, ranked: Ranked, options: tuple[Option, ...], decision: Decision, *,
                 seconds: Mapping[str, float], free: int | None, unprobed: bool = False) -> None:
        self.key = key
        self.ranked = ranked
        self.free = free
        self.unprobed = unprobed
        self.history: deque[list[int]] = deque(maxlen=HISTORY)
        self.trial = None
        self.waited: list[list[int]] = []
        self._follow(options, decision, seconds)

    def _follow(self, options: tuple[Option, ...], decision: Decision, seconds: Mapping[str, float]) -> None:
        self.options = options
        self.decision = decision
        self.warm = tuple(seconds.get(o.kernel.name, o.predicted_s) for o in options)
        self.measured = frozenset(seconds)
        self._cold: tuple[float, ...] | None = None
        self._wait_calls: int | None = None  # `compile_wait`'s calls for the bucket, once priced

    def measured_by(self, trial) -> None:
        """Follow `trial`'s result (`measuring.Trial`, decided): its kernel first, its medians as the
        options' warm times, a candidate that raised dropped, and what it measured in the notes."""
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
        """`decision`, with what its trial has measured so far while it measures (`explain`)."""
        trial = self.trial
        if trial is None or not trial.open:
            return self.decision
        return replace(self.decision, notes=(*self.decision.notes, trial.describe()))

    @property
    def budget(self) -> int | None:
        """The memory budget the bucket was decided under."""
        return self.decision.budget_bytes

    def cold(self, measured: Mapping[str, float]) -> tuple[float, ...]:
        """Seconds of per-shape set-up of each option (`selection.shape_setup_seconds`; every exact
        problem of the bucket is of one kind for it)."""
        if self._cold is None:
            self._cold = tuple(shape_setup_seconds(o.kernel, self.ranked.problem, measured) for o in self.options)
        return self._cold

    def compile_wait(self, problem: Problem, measured: Mapping[str, float],
                     ) -> tuple[tuple[Option, ...], tuple[str, ...], int] | None:
        """Where the bucket's first option would compile on `problem` in this process
        (`selection.compile_deferred_order`): the order that runs a set-up-free option instead, its
        notes and the calls left before the bucket compiles (counted over all its shapes: `waited`);
        None where nothing compiles or nothing else can run."""
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

    def order_for_new_shape(self, is_set_up: Callable[[str], bool], measured_cold: Mapping[str, float],
                            floors: Mapping[str, Mapping[str, float]] | None = None,
                            ) -> tuple[tuple[Option, ...], tuple[str, ...], int]:
        """The options in try order for a new exact shape, with notes and the calls after which to
        settle (`selection.new_shape_order` on this bucket's times and history)."""
        return new_shape_order(self.options, self.warm, self.cold(measured_cold), self.measured,
                               (cell[0] for cell in self.history), is_set_up, floors or {})

    def new_shapes_run_first(self, measured_cold: Mapping[str, float]) -> bool:
        """Whether `order_for_new_shape` keeps the decided order for any new shape, whatever the
        bucket's history and whatever has been set up: the first option pays no per-shape set-up,
        or no other option may run a new shape in its place."""
        cold = self.cold(measured_cold)
        if compile_seconds(self.options[0].kernel, self.ranked.problem):
            return False
        return not cold or not cold[0] or not any(may_replace_first(o, self.measured) for o in self.options[1:])

    def decision_for(self, problem: Problem, kernel: Kernel, workspace: int, notes: tuple[str, ...],
                     skipped: tuple[tuple[str, str], ...] = ()) -> Decision:
        """`decision` for an exact shape of this bucket that runs `kernel`, having passed over the
        options in `skipped` (name, why)."""
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


class DeviceState:
    """One device's state.

    Attributes
    ----------
    failures: bucket -> kernel name -> why it failed at run time (not tried again there).
    out_of_memory: bucket -> names of those failures that were out of memory (transient).
    tuned: bucket -> its measured result (`tuning.Tuned`); store: where they are kept (None: memory only).
    """

    def __init__(self, ranking: DeviceRanking) -> None:
        self.ranking = ranking
        self.failures: dict[tuple, dict[str, str]] = {}
        self.out_of_memory: dict[tuple, set[str]] = {}
        self.tuned: dict[tuple, Tuned] = {}
        self._store = None
        self._store_path: Path | None = None
        self._store_opened = False

    # ------------------------------------------------------------------ failures
    def remember(self, problem: Problem, name: str, error: BaseException, out_of_memory: bool) -> None:
        """Kernel `name` raised `error` on `problem`: not tried again in its bucket (out of memory:
        until nothing else is left, `forget_out_of_memory`)."""
        bucket = failure_bucket(problem)
        self.failures.setdefault(bucket, {})[name] = failure_message(error)
        if out_of_memory:
            self.out_of_memory.setdefault(bucket, set()).add(name)

    def forget_failure(self, problem: Problem, name: str) -> None:
        """Kernel `name`'s remembered failure in `problem`'s bucket, forgotten (it was the context's)."""
        bucket = failure_bucket(problem)
        self.failures.get(bucket, {}).pop(name, None)
        self.out_of_memory.get(bucket, set()).discard(name)

    def forget_out_of_memory(self, problem: Problem) -> None:
        """Out-of-memory failures are transient: when nothing is left to try, forget them for the
        bucket so the next call tries again instead of failing at once."""
        bucket = failure_bucket(problem)
        failures = self.failures.get(bucket, {})
        for name in self.out_of_memory.pop(bucket, ()):
            failures.pop(name, None)

    # ------------------------------------------------------------------ tunings
    def open_store(self, root_of_stores: Callable[[], object] | None, signature: str) -> None:
        """Load the tuning store on first use (`measured_store`, imported only where its file
        exists or a tuning is kept); nothing when `root_of_stores` is None (tunings not
        remembered), the device has no identity, or its directory is unusable."""
        if not self._store_opened:
            self._store_opened = True
            device_key = self.ranking.source.identity
            if root_of_stores is not None and device_key:
                try:
                    self._store_path = tuning_path(root_of_stores(), device_key, signature)
                    if self._store_path.exists():
                        self.tuned.update({**self.store.load(), **self.tuned})
                except OSError:
                    self._store_path = None

    @property
    def store(self):
        """The `measured_store.TuningStore` the tunings are kept in (None: memory only)."""
        if self._store is None and self._store_path is not None:
            from attn_dispatch.dispatcher.measured_store import TuningStore

            self._store = TuningStore(self._store_path)
        return self._store

    def keep_measured(self, bucket: tuple, tuned: Tuned, *, store: bool = True) -> None:
        """A bucket measured on its calls (`measuring`): kept for this process and (`store`) in the store."""
        self.tuned[bucket] = tuned
        if store and self.store is not None:
            self.store.append(bucket, tuned)


def kernel_set_signature(names: Iterable[str], policy: str) -> str:
    """A short, stable name for a kernel set and its accuracy policy."""
    text = json.dumps([sorted(names), policy])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tuning_path(root, device_key: str, signature: str) -> Path:
    """The tuning store's file of a device and kernel set under `root` (`measured_store`)."""
    return Path(root) / device_key / f"{signature}.jsonl"


MAX_SEEN_SHAPES = 1 << 16
"""Exact shapes remembered per kernel as already set up in this process (about 10 MB at most);
past it, new shapes are not recorded (they count as unseen: the weighing stays conservative)."""


class SeenShapes:
    """Per kernel, the exact shapes (plan cache keys) it has already run in this process: its
    per-shape set-up is paid there, so a kernel with a cold-shape cost is not charged it again."""

    def __init__(self) -> None:
        self._seen: dict[str, set] = {}

    def add(self, kernel_name: str, shape_key: tuple) -> None:
        seen = self._seen.setdefault(kernel_name, set())
        if len(seen) < MAX_SEEN_SHAPES:
            seen.add(shape_key)

    def has(self, kernel_name: str, shape_key: tuple) -> bool:
        return shape_key in self._seen.get(kernel_name, ())


class SpentCalls:
    """Calls already made on exact shapes whose plans were evicted before they settled
    (`settle_after`): the shape's next plan settles that many calls sooner, so a long-running
    server whose key lengths outnumber the plan cache (`plans.MAX_PLANS`; a 32k-token context
    alone has 32k of them) still ends on the kernel that sets up, as a shape's calls add up.
    At most `MAX_SEEN_SHAPES` shapes (about 38 MB per device planner when full)."""

    def __init__(self) -> None:
        self._calls: dict[tuple, int] = {}

    def add(self, shape_key: tuple, calls: int) -> None:
        if calls > 0 and (shape_key in self._calls or len(self._calls) < MAX_SEEN_SHAPES):
            self._calls[shape_key] = self._calls.get(shape_key, 0) + calls

    def settle_at(self, shape_key: tuple, settle_at: int) -> int:
        """`settle_at` for a new plan of `shape_key`, less the calls spent there before (at least 1)."""
        spent = self._calls.pop(shape_key, 0)
        return max(1, settle_at - spent) if settle_at and spent else settle_at


def measured_costs(device: torch.device, home: str | None, field: str = "seconds") -> dict[str, dict[str, float]]:
    """The per-shape set-up costs (``field="floor_seconds"``: per-call floors) measured for this
    device's card (`models.probe_store`); {} where none were, off GPUs (where no kernel is
    known to set up per shape) and on any error."""
    if device.type != "cuda":
        return {}
    try:
        from attn_dispatch.models.identity import DeviceIdentity

        return load_cold_costs(DeviceIdentity.detect(device), home=home, field=field)
    except Exception:  # noqa: BLE001 - a missing or damaged file never fails a call: the priors serve
        return {}




class ProbeCache:
    """The kept probes of one device (`for_device`), and what this process has written since."""

    def __init__(self, identity, cudnn_version: str, home: str | None, kept: set, index: int | None = None) -> None:
        self.identity = identity
        self.device_type = identity.device_type
        self.index = index  # the device's CUDA index (None: the current device, or a CPU)
        self.cudnn_version = cudnn_version
        self.home = home
        self.kept = kept

    @classmethod
    def for_device(cls, device: torch.device, home: str | None) -> ProbeCache | None:
        """Seed this process's probe results from the device's file; None on devices other than CPUs
        and GPUs, on any error, and for a GPU other than the current one: probes run on the current
        device and their results are kept per device type (`sdpa_default`), so another card's file
        would vouch for this one, and this one's passes be written as another card's."""
        if device.type not in ("cpu", "cuda"):
            return None
        try:
            from attn_dispatch.models.identity import DeviceIdentity
            from attn_dispatch.models.probe_store import load_passed

            if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
                return None
            identity = DeviceIdentity.detect(device)
            cudnn_version = str(torch.backends.cudnn.version() or "") if device.type == "cuda" else ""
            kept = {key for key in load_passed(identity, cudnn_version, home) if key[1] == device.type}
        except Exception:  # noqa: BLE001 - no kept probes: they run as before
            return None
        seed_passed_probes(kept)
        return cls(identity, cudnn_version, home, kept, device.index)

    def save_new(self) -> None:
        """Write the passes this process has that the file lacks (nothing when there are none, or
        when the current device is no longer this one: the passes were not made on it)."""
        passed = passed_probes(self.device_type) | self.kept
        if passed == self.kept:
            return
        try:
            from attn_dispatch.models.probe_store import save_passed

            if self.device_type == "cuda" and self.index is not None and self.index != torch.cuda.current_device():
                return

            save_passed(self.identity, self.cudnn_version, passed, self.home)
        except Exception:  # noqa: BLE001 - an unwritable home costs the next process its probes, nothing else
            return
        self.kept = passed
