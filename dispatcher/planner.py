"""One device's planner: from a validated problem to a `Plan`, deciding once per size bucket.

The cold path of `Dispatcher` in one place. A bucket's decision (`decide`) ranks the kernels
(`planning.rank_options`), keeps those that fit in memory (`planning.fit_options`), follows the
bucket's measured result where an earlier call or process has one, else measures its candidates on
its next calls (`measuring`), and becomes a `buckets.Bucket`. Each exact
shape then gets its plan from its bucket (`plan`): the bucket's kernel checked against the exact
problem (capability and workspace), with a kernel that sets up per shape moved behind a faster one
where the bucket's shapes keep changing (`cold_shape`). Nothing here is on the warm path.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from attn_dispatch.dispatcher._plan import Plan, mask_ndim_of
from attn_dispatch.dispatcher.buckets import MAX_BUCKETS, BoundedCache, Bucket
from attn_dispatch.dispatcher.call_timing import clock_for
from attn_dispatch.dispatcher.cold_shape import (
    SeenShapes,
    SpentCalls,
    cold_seconds,
    costly_setups,
    floor_order,
)
from attn_dispatch.dispatcher.decision import Decision
from attn_dispatch.dispatcher.device_state import DeviceState
from attn_dispatch.dispatcher.errors import NoKernelError
from attn_dispatch.dispatcher.measured_candidates import is_default, measured_candidates, measuring_wanted
from attn_dispatch.dispatcher.measuring import Trial
from attn_dispatch.dispatcher.memory import free_bytes
from attn_dispatch.dispatcher.no_table_notice import no_table_line
from attn_dispatch.dispatcher.planning import (
    FASTER_DID_NOT_FIT,
    Option,
    decision_bucket,
    failure_bucket,
    fit_options,
    needs_recheck,
    over_limit_reason,
    rank_options,
)
from attn_dispatch.dispatcher.probe_cache import ProbeCache
from attn_dispatch.dispatcher.recording import record_problem
from attn_dispatch.dispatcher.tuning import put_first
from attn_dispatch.kernels import AccuracyPolicy, Kernel, Problem
from attn_dispatch.kernels.sdpa_probe import probes_deferred

UNMEASURED_LEVELS = ("prior", "none")
"""Ranking sources that measured nothing on this card: the analytic prior and the bare kernel order."""

SETTLED = ("this exact shape has been called often enough to pay the chosen kernel's per-shape set-up "
           "(cold_shape.settle_after): it now runs the bucket's decided kernel")

DEFAULT_KEPT_UNMEASURED = ("no table measured on this card: PyTorch's own choice (sdpa_default) runs wherever it fits "
                           "until the bucket's calls measured another kernel faster; the prior only orders the kernels "
                           "behind it")


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
    buckets: bucket key -> `Bucket` (bounded: `buckets.MAX_BUCKETS`).
    seen: exact shapes each kernel with a per-shape set-up has already run (`cold_shape`).
    cold_costs: measured seconds of per-shape set-up, kernel name or backend family -> problem
        kind -> seconds (`models.cold_shape_store`; empty: the priors of `cold_shape` serve).
    floors: measured per-call floors, kernel name -> problem kind -> seconds (`cold_shape.floor_order`).
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
        # the portable set (gfx906's): PyTorch's default is its last resort, not a contender (`measured_candidates`)
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
            record_problem(problem)  # a no-op unless a workload is being recorded (`recording`)
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
        set-up (`cold_shape.settle_after`: the shape has been called often enough to pay it);
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
            return plan
        return None

    # ------------------------------------------------------------------ per bucket
    def decide(self, problem: Problem, *, budget: int | None, measure: bool,
               on_failure: Callable[[str, BaseException], None], trial: bool = True,
               defer_probes: bool = True) -> Bucket:
        """Rank and fit for `problem`'s bucket; its result measured on an earlier call or process
        first, else (`measure`, and `trial`: not for a shape decided apart from its bucket) a
        `measuring.Trial` of its candidates on its next calls. `defer_probes`: rank without running
        backend probes not run yet (`sdpa_probe.probes_deferred`); a kernel is probed where it is
        about to run (`_plan_in`, `measuring.Trial`, the training route). Raises `NoKernelError`
        when nothing can run it within the memory limit."""
        state, config = self.state, self.config
        bucket_key = failure_bucket(problem)
        failed = state.failures.get(bucket_key, {})
        with probes_deferred() if defer_probes else contextlib.nullcontext():  # `_plan_in` probes what runs
            ranked = rank_options(problem, config.kernels, state.ranking, failed, policy=config.policy)
        free = free_bytes(self.device)
        fit = fit_options(ranked, free=free, budget=budget, ranking=state.ranking, failed=failed)
        if not fit.options:
            raise NoKernelError.nothing_fits(ranked, fit, str(self.device), free=free, budget=budget)
        options, notes, dropped = fit.options, fit.notes, fit.dropped + ranked.dropped
        if self.floors:
            options, floor_note = floor_order(options, problem, [o.predicted_s for o in options], self.floors)
            notes = notes if floor_note is None else (*notes, floor_note)
        if state.ranking.source.level in UNMEASURED_LEVELS and any(is_default(o) for o in options[1:]):
            options = (*(o for o in options if is_default(o)), *(o for o in options if not is_default(o)))
            notes = (*notes, DEFAULT_KEPT_UNMEASURED)  # nothing measured on this card says another kernel is faster
        no_table = no_table_line(state.ranking.source.level, str(self.device), measure=measure)
        notes = notes if no_table is None else (*notes, no_table)
        state.open_store(config.tunings_root, config.signature)
        tuned = state.tuned.get(bucket_key)
        seconds: dict[str, float] = {}
        candidates: tuple[Option, ...] = ()
        if tuned is not None and any(option.kernel.name == tuned.kernel for option in options):
            options, notes = put_first(options, tuned.kernel), (*notes, tuned.note())
            seconds = {name: s for name, s in tuned.seconds}
        elif measure and trial and measuring_wanted(self.device, entry_decides=state.ranking.entry_decides(problem),
                                          level=state.ranking.source.level):
            measured, doubt = state.ranking.measured_note(problem), state.ranking.entry_doubt(problem)
            if measured is not None and doubt is not None:  # an entry that does not decide: say why
                notes = (*notes, f"{measured}: {doubt}")
            candidates = measured_candidates(options, self.device, problem, portable=self.portable,
                                             sets_up=costly_setups(options, problem, self.cold_costs))
            if candidates:  # the baseline serves until the measuring decides (`measuring.Trial`)
                options = put_first(options, candidates[0].kernel.name)
        decision = Decision(
            kernel=options[0].kernel.name, params=dict(options[0].kernel.params), problem=problem,
            device=str(self.device), source=state.ranking.source,
            candidates=tuple(option.candidate() for option in options),
            dropped=dropped, free_bytes=free, budget_bytes=budget, notes=notes,
        )
        bucket = Bucket(bucket_key, ranked, options, decision, seconds=seconds, free=free, unprobed=defer_probes)
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
    answers as `sdpa_probe.probes_deferred` does (native GQA taken as absent: K/V counted repeated),
    so the bound is never under what the call takes, and no call waits for a probe to size memory
    (PyTorch's default sizes its backend's GQA, a probe of its own, on every decode step's new shape)."""
    with probes_deferred():
        return int(kernel.workspace_bytes(problem))
