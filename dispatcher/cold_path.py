"""What a `Dispatcher` does off its warm path: planning a new exact shape, settling, recovering from a kernel that
raised (remembered for its bucket, the next candidate runs, until one returns or `NoKernelError`; a forward-AD dual
call gets PyTorch's SDPA, nothing remembered), and the training route's calls."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch.autograd import forward_ad

import attn_dispatch.dispatcher.sdpa_context as sdpa_context
from attn_dispatch.dispatcher.decision import (
    TRAINING_KERNEL,
    NoKernelError,
    decision_logged,
    log_decision,
    log_fallback,
    log_settled,
    release_cached_memory,
)
from attn_dispatch.dispatcher.device_planner import DevicePlanner, PlannerConfig
from attn_dispatch.dispatcher.device_ranking import resolve_ranking, say_once
from attn_dispatch.dispatcher.device_state import DeviceState
from attn_dispatch.dispatcher.hot_path import HotSlots
from attn_dispatch.dispatcher.plans import (
    MAX_PLANS,
    BoundedCache,
    CallCounts,
    Plan,
    check_scale,
    family_key,
    problem_at_key_length,
)
from attn_dispatch.dispatcher.sdpa_context import pytorch_attention, some_backend_off
from attn_dispatch.kernels import Problem
from attn_dispatch.kernels.base import is_out_of_memory
from attn_dispatch.kernels.registry import uses_fused_backend
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from attn_dispatch.models.probe_store import ProbeCache, measured_costs

TRAINING_COUNT = f"{TRAINING_KERNEL} (training)"
"""`stats` key of training-route calls that went to PyTorch's SDPA."""


class ColdPath:
    """One dispatcher's decisions: its device planners and every change to its plan cache, hot slots and counts, made
    under `lock`. `settings() -> (memory budget, measure)` is read when a bucket is decided."""

    def __init__(self, config: PlannerConfig, plans: BoundedCache, hot: HotSlots, counts: CallCounts, *,
                 settings: Callable[[], tuple[int | None, bool]], lock: threading.RLock, home: str | None) -> None:
        self.config = config
        self.plans = plans
        self.hot = hot
        self.counts = counts
        self.settings = settings
        self.lock = lock
        self.home = home
        self.planners: dict[torch.device, DevicePlanner] = hot.planners
        self.families: BoundedCache[tuple, Problem] = BoundedCache(MAX_PLANS)  # `plans.family_key` -> a Problem
        self.ranking_options: dict = {}  # more arguments of `device_ranking.resolve_ranking` (`Dispatcher.use_table`)
        self._training_route = None

    @property
    def training_route(self):
        """The `training_route.TrainingRoute` (made on the first gradient call)."""
        if self._training_route is None:
            from attn_dispatch.dispatcher.training_route import TrainingRoute

            self._training_route = TrainingRoute()
        return self._training_route

    # ------------------------------------------------------------------ planning
    def plan_for(self, key_, query, key, value, attn_mask, is_causal, enable_gqa) -> Plan:
        """`key_`'s kept plan where it needs no re-check, else a new exact shape's plan (deciding its bucket where new)
        or a re-checked plan."""
        plan = self.plans.get(key_)
        if plan is not None and not plan.recheck:
            return plan
        family = None
        if plan is not None:
            problem = plan.problem
        else:  # a sibling shape (another key length) spares the validation
            try:
                family = family_key(query, key, value, attn_mask, is_causal, enable_gqa)
            except IndexError:  # a 0-D input: `Problem.from_tensors` raises SDPA's RuntimeError (or accepts a 0-D mask)
                pass
            sibling = None if family is None else self.families.get(family)
            problem = None if sibling is None else problem_at_key_length(sibling, key, value, attn_mask)
            if problem is None:
                problem = Problem.from_tensors(query, key, value, attn_mask, is_causal, enable_gqa)
            if problem.causal and problem.mask_kind != "none":  # PyTorch's RuntimeError where it takes MATH
                sdpa_context.check_mask_with_causal(query, key, value, attn_mask, enable_gqa)
        planner = self.planner(query.device)
        with self.lock:
            current = self.plans.get(key_)
            if current is not None and current is not plan:
                return current  # another thread planned meanwhile
            new, decided = planner.plan(problem, key_, settings=self.settings,
                                        on_failure=self.failure_handler(planner.device, problem),
                                        new_shape=plan is None)
            if plan is not None and plan.trial is None and new.kernel is plan.kernel and new.bucket is plan.bucket:
                plan.recheck, new = new.recheck, plan  # unchanged: keep the plan (and its count)
            else:
                if plan is not None:
                    self.counts.fold(plan)
                self.keep(key_, new)
            if family is not None:
                self.families.put(family, problem)
            if decided and decision_logged():  # a waiting bucket's decision is made to be logged only
                log_decision(new.decision)
        return new

    def settle(self, key_, plan: Plan) -> Plan:
        """`plan`'s shape reached `plan.settle_at` calls: it runs the bucket's decided kernel from now on."""
        with self.lock:
            settled = self.planner(plan.device).settled(plan, key_)
            if settled is None or self.plans.get(key_) is not plan:
                return plan
            plan.count[0] -= 1  # this call runs the settled plan: counted there
            settled.count[0] += 1
            self.counts.fold(plan)
            self.hot.drop(key_)
            self.plans.put(key_, settled)
            log_settled(settled.kernel.name, plan.kernel.name, plan.settle_at)
        return settled

    def planner(self, device: torch.device) -> DevicePlanner:
        """`device`'s planner, made on first use (ranker, kept probes, measured set-up costs)."""
        planner = self.planners.get(device)
        if planner is None:
            with self.lock:
                planner = self.planners.get(device)
                if planner is None:
                    probes = ProbeCache.for_device(device, self.home)  # before any kernel is probed
                    state = DeviceState(resolve_ranking(device, home=self.home, **self.ranking_options))
                    planner = self.planners[device] = DevicePlanner(
                        device, state, self.config, measured_costs(device, self.home),
                        measured_costs(device, self.home, "floor_seconds"), probes=probes, lock=self.lock)
                    source = state.ranking.source
                    say_once(source.identity or str(device), source.level, str(device), measure=self.settings()[1])
        return planner

    def state(self, device: torch.device) -> DeviceState:
        return self.planner(device).state

    def keep(self, key_: tuple, plan: Plan) -> None:
        """Cache `plan` under `key_` (dropping a replaced plan from the hot path), except a meta device's: a meta
        call must miss, as `Dispatcher.attention` sends misses only to PyTorch."""
        if plan.device.type != "meta":
            if self.plans.get(key_) is not None:
                self.hot.drop(key_)
            self.plans.put(key_, plan)

    def evicted(self, key_: tuple, plan: Plan) -> None:
        """`plan` left the plan cache: its calls stay in `stats`, it leaves the hot path, and its calls toward
        settling carry to the shape's next plan (`plans.SpentCalls`)."""
        self.counts.fold(plan)
        if plan.settle_at and plan.count[0]:
            planner = self.planners.get(plan.device)
            if planner is not None:
                planner.spent.add(key_, plan.count[0])
        self.hot.drop_plan(plan)

    def reset(self) -> None:
        self.families.clear()
        self.planners.clear()
        if self._training_route is not None:
            self._training_route.reset()

    # ------------------------------------------------------------------ recovery
    def recover(self, plan: Plan, key_, error, query, key, value, attn_mask, scale, enable_gqa) -> torch.Tensor:
        """`plan`'s kernel raised: remember it for the bucket, run the next candidate (repeatedly)."""
        plan.count[0] -= 1  # count calls that returned, not attempts (a bad `scale` raises here, uncounted)
        if carries_tangent(query, key, value, attn_mask):  # PyTorch's answer to a dual tensor, nothing remembered
            is_causal = key_[-2]  # `plans.cache_key`'s second-to-last field
            return pytorch_attention(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa)
        check_scale(scale)
        switched: list[tuple[Problem, str]] = []
        try:
            return self._recover_from(plan, key_, error, query, key, value, attn_mask, scale, enable_gqa, switched)
        finally:
            if switched:
                self._forget_switched(plan, key_, switched)

    def _forget_switched(self, plan: Plan, key_: tuple, switched: list[tuple[Problem, str]]) -> None:
        """Forget failures a switched-off backend may have caused (inside ``sdpa_kernel`` with
        ``ATTN_DISPATCH_IGNORE_SDPA_KERNEL=1``) and the plans made without those kernels, so the bucket decides anew."""
        with self.lock:
            for problem, name in switched:
                self.state(plan.device).forget_failure(problem, name)
            old = self._drop(key_)
            if old is not None:
                self._drop_bucket_plans(old.bucket)
            self.planner(plan.device).forget_bucket(plan.problem)

    def _recover_from(self, plan, key_, error, query, key, value, attn_mask, scale, enable_gqa,
                      switched: list) -> torch.Tensor:
        """`recover`'s loop; failures of PyTorch backends while one is switched off are appended to `switched`."""
        planner = self.planner(plan.device)
        while True:
            failed = plan.kernel.name
            self.remember(plan.device, plan.problem, failed, error)
            if uses_fused_backend(plan.kernel) and some_backend_off():
                switched.append((plan.problem, failed))
            try:
                with self.lock:
                    self._drop(key_)
                    self._drop_bucket_plans(plan.bucket)
                    planner.forget_bucket(plan.problem)
                    plan, _ = planner.plan(plan.problem, key_, settings=self.settings,
                                           on_failure=self.failure_handler(plan.device, plan.problem), new_shape=False)
                    self.keep(key_, plan)
            except NoKernelError as no_kernel:
                with self.lock:
                    self.state(plan.device).forget_out_of_memory(plan.problem)
                raise no_kernel from error
            log_fallback(failed, error, plan.kernel.name)
            plan.count[0] += 1
            try:
                return plan.run(query, key, value, attn_mask, scale, enable_gqa, plan.problem)
            except Exception as next_error:  # noqa: BLE001
                plan.count[0] -= 1
                error = next_error

    def _drop(self, key_: tuple) -> Plan | None:
        """`key_`'s plan leaves the cache and hot path (its calls kept in `stats`); returns it, if any."""
        old = self.plans.pop(key_, None)
        self.hot.drop(key_)
        if old is not None:
            self.counts.fold(old)
        return old

    def _drop_bucket_plans(self, bucket) -> None:
        """A kernel of `bucket` failed: all its shapes' plans leave the cache and hot path (calls kept in `stats`)."""
        for key_, plan in list(self.plans.table.items()):
            if plan.bucket is bucket:
                self.plans.pop(key_)
                self.evicted(key_, plan)

    def failure_handler(self, device: torch.device, problem: Problem):
        """Where a measuring trial reports a candidate that raised on `problem`."""
        return lambda name, error: self.remember(device, problem, name, error)

    def remember(self, device: torch.device, problem: Problem, name: str, error: BaseException) -> None:
        out_of_memory = is_out_of_memory(error)
        if out_of_memory:
            release_cached_memory(device)
        with self.lock:
            self.state(device).remember(problem, name, error, out_of_memory)

    # ------------------------------------------------------------------ training
    def training(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, key_,
                 budget: int | None) -> torch.Tensor:
        """A call needing a gradient or dropout: the fastest fitting kernel with a backward, else PyTorch's SDPA."""
        if query.is_meta:  # as in `attention`: PyTorch's SDPA, no plan
            return pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if dropout_p == 0.0 and not (attn_mask is not None and attn_mask.requires_grad):
            plan = self.plan_for(key_, query, key, value, attn_mask, is_causal, enable_gqa)
            choice = self.training_route.choose(plan, budget)
            if choice.kernel is not None:
                count = self.counts.cell(choice.kernel.name)
                count[0] += 1
                try:
                    return choice.kernel.run(query, key, value, attn_mask, scale, enable_gqa, plan.problem)
                except Exception as error:  # noqa: BLE001 - remembered; PyTorch's SDPA runs this call
                    count[0] -= 1
                    if not carries_tangent(query, key, value, attn_mask):  # a dual's failure: not the kernel's
                        self.training_route.failed(plan, budget, choice.kernel, error)
                        log_fallback(choice.kernel.name, error, TRAINING_KERNEL)
        self.counts.cell(TRAINING_COUNT)[0] += 1
        gqa = {"enable_gqa": True} if enable_gqa else {}
        return pytorch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **gqa)


def carries_tangent(*tensors: torch.Tensor | None) -> bool:
    """Whether any plain tensor given is a forward-AD dual at the current level (a tensor subclass counts as none)."""
    return any(t.__class__ is torch.Tensor and forward_ad.unpack_dual(t).tangent is not None for t in tensors)
