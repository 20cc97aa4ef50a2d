"""One device's planner: from a validated problem to a `Plan`, deciding once per size bucket.

The cold path of `Dispatcher` in one place. A bucket's decision (`decide`) ranks the kernels
(`planning.rank_options`), keeps those that fit in memory (`planning.fit_options`), tunes the
close ones when tuning is on (`DeviceState.apply_tuning`) and becomes a `buckets.Bucket`. Each exact
shape then gets its plan from its bucket (`plan`): the bucket's kernel checked against the exact
problem (capability and workspace), with a kernel that sets up per shape moved behind a faster one
where the bucket's shapes keep changing (`cold_shape`). Nothing here is on the warm path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from attn_dispatch.dispatcher._plan import Plan, mask_ndim_of
from attn_dispatch.dispatcher.buckets import MAX_BUCKETS, BoundedCache, Bucket
from attn_dispatch.dispatcher.cold_shape import SeenShapes, SpentCalls, costly_setups, floor_order
from attn_dispatch.dispatcher.decision import Decision
from attn_dispatch.dispatcher.device_state import DeviceState
from attn_dispatch.dispatcher.dual_calls import carries_tangent
from attn_dispatch.dispatcher.errors import NoKernelError
from attn_dispatch.dispatcher.memory import free_bytes
from attn_dispatch.dispatcher.planning import (
    FASTER_DID_NOT_FIT,
    decision_bucket,
    failure_bucket,
    fit_options,
    needs_recheck,
    over_limit_reason,
    rank_options,
)
from attn_dispatch.dispatcher.probe_cache import ProbeCache
from attn_dispatch.dispatcher.recording import record_problem
from attn_dispatch.dispatcher.verify import is_default, verification_wanted, verify_against_default
from attn_dispatch.kernels import AccuracyPolicy, Kernel, Problem

UNMEASURED_LEVELS = ("prior", "none")
"""Ranking sources that measured nothing on this card: the analytic prior and the bare kernel order."""

SETTLED = ("this exact shape has been called often enough to pay the chosen kernel's per-shape set-up "
           "(cold_shape.settle_after): it now runs the bucket's decided kernel")

DEFAULT_KEPT_UNMEASURED = ("no table measured on this card: PyTorch's own choice (sdpa_default) runs wherever it fits; "
                           "the prior only orders the kernels behind it (calibrate, or turn tuning on, to replace it)")


@dataclass(frozen=True)
class PlannerConfig:
    """What a dispatcher's planners share: its kernel set, accuracy policy, and where tunings are
    kept (`tunings_root() -> directory`, None: in memory only) under which kernel-set signature."""

    kernels: Mapping[str, Kernel]
    policy: AccuracyPolicy
    signature: str
    tunings_root: Callable[[], object] | None


class DevicePlanner:
    """Decisions for one device: per size bucket, and per exact shape from its bucket.

    Attributes
    ----------
    state: the device's ranker, remembered failures and tunings (`DeviceState`).
    buckets: bucket key -> `Bucket` (bounded: `buckets.MAX_BUCKETS`).
    seen: exact shapes each kernel with a per-shape set-up has already run (`cold_shape`).
    cold_costs: measured seconds of per-shape set-up, kernel name or backend family -> problem
        kind -> seconds (`models.cold_shape_store`; empty: the priors of `cold_shape` serve).
    floors: measured per-call floors, kernel name -> problem kind -> seconds (`cold_shape.floor_order`).
    """

    def __init__(self, device: torch.device, state: DeviceState, config: PlannerConfig,
                 cold_costs: Mapping[str, Mapping[str, float]] | None = None,
                 floors: Mapping[str, Mapping[str, float]] | None = None, *, probes: ProbeCache | None = None) -> None:
        self.device = device
        self.probes = probes  # backend probes kept across processes (GPUs): written after a decision
        self.state = state
        self.config = config
        self.buckets: BoundedCache[tuple, Bucket] = BoundedCache(MAX_BUCKETS)
        self.seen = SeenShapes()
        self.spent = SpentCalls()  # calls of evicted plans still waiting to settle
        self.cold_costs = {name: dict(by_kind) for name, by_kind in (cold_costs or {}).items()}
        self.floors = {name: dict(by_kind) for name, by_kind in (floors or {}).items()}
        # the portable set (gfx906's): PyTorch's default is its last resort, not a contender (`verify`)
        self.portable = any(getattr(kernel, "last_resort", False) for kernel in config.kernels.values())

    # ------------------------------------------------------------------ per exact shape
    def plan(self, problem: Problem, shape_key: tuple, inputs: tuple | None, *,
             settings: Callable[[], tuple[int | None, bool]], on_failure: Callable[[str, BaseException], None],
             new_shape: bool = True) -> tuple[Plan, bool]:
        """The plan for one exact shape, and whether a new bucket decision was made for it.
        `inputs` (query, key, value, mask, scale, enable_gqa) let a new bucket be tuned on them;
        `settings() -> (memory budget, tune)`, read only when a bucket is decided (a decided bucket
        keeps its budget: `Dispatcher.reset` after changing it); `new_shape`: the shape has no plan
        yet (it joins the bucket's history)."""
        key = decision_bucket(problem)
        bucket = self.buckets.get(key)
        decided = bucket is None or (inputs is not None and bucket.tune_pending)
        if decided and inputs is not None and carries_tangent(*inputs[:4]):
            # no timing on forward-AD duals (`dual_calls`): a kernel failing on one is not the bucket's failure;
            # checked only where a bucket is decided, not for every new exact shape (a decode loop's every token)
            inputs, decided = None, bucket is None
        if decided:
            if bucket is None:
                record_problem(problem)  # a no-op unless a workload is being recorded (`recording`)
            budget, tune = settings()
            bucket = self.decide(problem, inputs, budget=budget, tune=tune, on_failure=on_failure)
            self.buckets.put(key, bucket)
            if self.probes is not None:
                self.probes.save_new()
        plan = self._plan_in(bucket, problem, shape_key, first=decided)
        if plan is None:  # nothing the bucket chose runs or fits this exact shape: decide for it alone
            alone = self.decide(problem, None, budget=bucket.budget, tune=False, on_failure=on_failure)
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
            if own_problem:
                workspace = option.workspace_bytes
            else:
                why = kernel.reasons(problem)
                if why:
                    skipped.append((kernel.name, "; ".join(why)))
                    continue
                workspace = int(kernel.workspace_bytes(problem))
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
            recheck = needs_recheck(workspace, free) or bucket.tune_pending
            return Plan(problem, self.device, kernel, workspace, recheck, bucket,
                        notes if option is order[0] or skipped else (), tuple(skipped),
                        settle_at=settle_at if option is order[0] else 0, mask_ndim=mask_ndim_of(shape_key))
        return None

    # ------------------------------------------------------------------ per bucket
    def decide(self, problem: Problem, inputs: tuple | None, *, budget: int | None, tune: bool,
               on_failure: Callable[[str, BaseException], None]) -> Bucket:
        """Rank, fit and (tuning on) tune for `problem`'s bucket. Raises `NoKernelError` when
        nothing can run it within the memory limit."""
        state, config = self.state, self.config
        failed = state.failures.get(failure_bucket(problem), {})
        ranked = rank_options(problem, config.kernels, state.ranking, failed, policy=config.policy)
        free = free_bytes(self.device)
        fit = fit_options(ranked, free=free, budget=budget, ranking=state.ranking, failed=failed)
        if not fit.options:
            raise NoKernelError.nothing_fits(ranked, fit, str(self.device), free=free, budget=budget)
        options, notes, dropped, pending = fit.options, fit.notes, fit.dropped + ranked.dropped, False
        if self.floors:
            options, floor_note = floor_order(options, problem, [o.predicted_s for o in options], self.floors)
            notes = notes if floor_note is None else (*notes, floor_note)
        if state.ranking.source.level in UNMEASURED_LEVELS and any(is_default(o) for o in options[1:]):
            options = (*(o for o in options if is_default(o)), *(o for o in options if not is_default(o)))
            notes = (*notes, DEFAULT_KEPT_UNMEASURED)  # nothing measured on this card says another kernel is faster
        seconds: dict[str, float] = {}
        portable = self.portable
        sets_up = costly_setups(options, problem, self.cold_costs)
        if not tune and inputs is not None and verification_wanted(
                options, self.device, problem, entry_decides=state.ranking.entry_decides(problem),
                table_measured=(state.ranking.source.level not in UNMEASURED_LEVELS
                                and getattr(state.ranking.table, "verdict", "table") == "table"), portable=portable,
                sets_up=sets_up):
            measured, doubt = state.ranking.measured_note(problem), state.ranking.entry_doubt(problem)
            if measured is not None and doubt is not None:  # an entry that does not decide: say why before the check's note
                notes = (*notes, f"{measured}: {doubt}")
            options, notes, seconds = verify_against_default(options, notes, problem, self.device, inputs,
                                                             on_failure=on_failure, portable=portable, sets_up=sets_up)
        if tune:
            state.open_store(config.tunings_root, config.signature)
            options, notes, dropped, pending = state.apply_tuning(
                options, notes, dropped, problem, self.device, inputs,
                on_failure=lambda name, error: on_failure(name, error))
            tuned = state.tuned.get(failure_bucket(problem))
            if tuned is not None:
                seconds = {name: s for name, s in tuned.seconds}
        decision = Decision(
            kernel=options[0].kernel.name, params=dict(options[0].kernel.params), problem=problem,
            device=str(self.device), source=state.ranking.source,
            candidates=tuple(option.candidate() for option in options),
            dropped=dropped, free_bytes=free, budget_bytes=budget, notes=notes,
        )
        return Bucket(failure_bucket(problem), ranked, options, decision, seconds=seconds, tune_pending=pending,
                      free=free)

    def forget_bucket(self, problem: Problem) -> None:
        """Drop `problem`'s bucket decision (a kernel of it failed: the next shape decides anew)."""
        self.buckets.pop(decision_bucket(problem))
