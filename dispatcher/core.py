"""`Dispatcher`: per device, the fastest kernel that fits, decided once per problem shape and
cached; a kernel that fails at run time is replaced by the next one and remembered.

Warm path (a shape seen before): one key tuple from tensor attributes, one dict lookup, the
kernel's `run` (no validation: a hit means these shapes, dtypes, devices and layouts were
validated when the decision was made).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

import torch

from attn_dispatch.dispatcher import _log, sdpa_context
from attn_dispatch.dispatcher._plan import Plan, cache_key, check_scale
from attn_dispatch.dispatcher.decision import ROUTE_TRAINING, TRAINING_KERNEL, Decision
from attn_dispatch.dispatcher.device_state import DeviceState
from attn_dispatch.dispatcher.errors import NoKernelError
from attn_dispatch.dispatcher.kernel_set import kernel_set
from attn_dispatch.dispatcher.memory import budget_from_env, free_bytes, parse_memory_size, release_cached_memory
from attn_dispatch.dispatcher.planning import Ranked, failure_bucket, fit_options, memory_limit, needs_recheck, rank_options
from attn_dispatch.dispatcher.ranking import resolve_ranking
from attn_dispatch.dispatcher.tuning import put_first, tune_from_env
from attn_dispatch.dispatcher.tuning_store import kernel_set_signature
from attn_dispatch.kernels import LOSSLESS, AccuracyPolicy, Kernel, Problem
from attn_dispatch.kernels.failures import is_out_of_memory
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from attn_dispatch.models.paths import tunings_dir

_grad_enabled = torch.is_grad_enabled
_needs_context = sdpa_context.needs_context
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
TRAINING_COUNT = f"{TRAINING_KERNEL} (training)"
"""`stats` key of calls that went to PyTorch's SDPA on the training route."""
_NOT_GIVEN = object()  # `_plan_for` without the call's scale: nothing to tune on


def _route(dropout_p: float, inputs_grad: bool, mask_grad: bool, kernel: Kernel) -> str | None:
    """Why a call goes to PyTorch's SDPA on the training route; None when `kernel` (the decision)
    runs it. `inputs_grad` / `mask_grad`: grad is enabled and query, key or value / the mask
    requires it. `Dispatcher.attention` and `_training` apply the same rule inline (warm path)."""
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p} (only PyTorch's SDPA does dropout)"
    if mask_grad:
        return "the mask requires grad (only PyTorch's SDPA gives the mask a gradient)"
    if inputs_grad and not kernel.supports_backward:
        return f"inputs require grad and {kernel.name} has no backward"
    return None


class Dispatcher:
    """Runs each attention call with the fastest kernel that fits in memory on its device.

    Parameters
    ----------
    kernels: ``"all"`` (every kernel variant, default), ``"portable"`` (no fused PyTorch backends,
        as on gfx906), or a sequence of kernels / kernel names (used as given). ``sdpa_default``
        (PyTorch's own choice) is added to the two named sets as the last-resort fallback.
    policy: lossy conversions allowed (default lossless only), e.g.
        ``AccuracyPolicy.allowing("fp32->bf16")``.
    memory_budget: most workspace one call may use: bytes or a size such as ``"16GiB"``; default
        ``ATTN_DISPATCH_MEMORY_BUDGET`` (read when a decision is made), else no budget.
    home: directory holding threshold tables (default: ``ATTN_DISPATCH_HOME`` or the user cache).
    tune: time the closest candidates on the first call of each problem bucket and keep the
        fastest (`dispatcher.tuning`); default ``ATTN_DISPATCH_TUNE`` (read when a decision is
        made), else off.
    remember_tunings: keep tunings across processes under the home directory
        (`dispatcher.tuning_store`; default on). ``attn-dispatch bench`` turns it off so every run
        tunes afresh.
    """

    def __init__(
        self,
        *,
        kernels: str | Sequence[Kernel | str] = "all",
        policy: AccuracyPolicy = LOSSLESS,
        memory_budget: int | str | None = None,
        home: str | None = None,
        tune: bool | None = None,
        remember_tunings: bool = True,
    ) -> None:
        if not isinstance(policy, AccuracyPolicy):
            raise TypeError(f"policy must be an AccuracyPolicy (e.g. AccuracyPolicy.allowing('fp32->bf16')), got {policy!r}")
        self.policy = policy
        self._kernels = kernel_set(kernels, policy)
        self._signature = kernel_set_signature(self._kernels, policy.describe())  # names its tuning store
        self._budget = None if memory_budget is None else parse_memory_size(memory_budget, name="memory_budget")
        self.home = home
        self._tune = tune
        self.remember_tunings = remember_tunings
        self._plans: dict[tuple, Plan] = {}
        self._plan_get = self._plans.get  # bound once for the warm path
        self._devices: dict[torch.device, DeviceState] = {}
        self._counts: dict[str, list[int]] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ configuration
    @property
    def kernels(self) -> list[Kernel]:
        """The kernel set this dispatcher chooses from."""
        return list(self._kernels.values())

    @property
    def memory_budget(self) -> int | None:
        """Workspace cap in bytes: the argument, else ``ATTN_DISPATCH_MEMORY_BUDGET``, else None."""
        return self._budget if self._budget is not None else budget_from_env()

    @property
    def tune(self) -> bool:
        """First-call tuning on? The argument, else ``ATTN_DISPATCH_TUNE``."""
        return self._tune if self._tune is not None else tune_from_env()

    # ------------------------------------------------------------------ the call
    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        *,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        """`torch.nn.functional.scaled_dot_product_attention`, run by the fastest kernel that fits.

        Parameters
        ----------
        query: ``[..., Hq, L, E]``; key: ``[..., Hkv, S, E]``; value: ``[..., Hkv, S, Ev]``.
        attn_mask: bool (True = attend) or float (added), broadcastable to ``[..., Hq, L, S]``.
        dropout_p, is_causal, scale, enable_gqa: as in SDPA. Dropout, or inputs requiring grad
            with grad enabled, go to PyTorch's SDPA unless the chosen kernel supports backward.

        Returns
        -------
        ``[..., Hq, L, Ev]`` in the query's dtype.
        """
        if _is_compiling():  # torch.compile traces PyTorch's SDPA, not our Python dispatch
            # issue 13 hook: a CausalBias through PyTorch's own handling, never as a tensor mask
            return sdpa_context.pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        try:  # `cache_key`, inlined: this is the warm path
            key_ = (
                query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype,
                query.device, key.device, value.device,
                query.is_contiguous(), key.is_contiguous(), value.is_contiguous(),
                None if attn_mask is None else (attn_mask.shape, attn_mask.dtype, attn_mask.device),
                is_causal, enable_gqa,
            )
            training = dropout_p != 0.0 or (
                _grad_enabled()  # one call under no_grad / inference_mode, where inference runs
                and (query.requires_grad or key.requires_grad or value.requires_grad
                     or (attn_mask is not None and attn_mask.requires_grad))
            )
        except AttributeError:  # not tensors: validation raises SDPA's TypeError
            Problem.from_tensors(query, key, value, attn_mask, is_causal, enable_gqa)
            raise
        if _needs_context(query, attn_mask):  # issue 13 hook: sdpa_kernel restrictions, CausalBias, meta
            routed = sdpa_context.route(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            if routed is not None:
                return routed
        if training:
            return self._training(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, key_)
        plan = self._plan_get(key_)
        if plan is None or plan.recheck:
            plan = self._plan_for(key_, query, key, value, attn_mask, is_causal, enable_gqa, scale)
        plan.count[0] += 1
        try:
            return plan.run(query, key, value, attn_mask, scale, enable_gqa, plan.problem)
        except Exception as error:  # noqa: BLE001 - any kernel failure falls back to the next kernel
            return self._recover(plan, key_, error, query, key, value, attn_mask, scale, enable_gqa)

    __call__ = attention

    def _training(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, key_):
        if dropout_p == 0.0 and not (attn_mask is not None and attn_mask.requires_grad):
            plan = self._plans.get(key_)
            if plan is None or plan.recheck:
                plan = self._plan_for(key_, query, key, value, attn_mask, is_causal, enable_gqa)
            if plan.kernel.supports_backward:
                plan.count[0] += 1
                try:
                    return plan.run(query, key, value, attn_mask, scale, enable_gqa, plan.problem)
                except Exception as error:  # noqa: BLE001
                    return self._recover(plan, key_, error, query, key, value, attn_mask, scale, enable_gqa,
                                         training=True)
        return self._pytorch_training(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def _pytorch_training(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        """PyTorch's own SDPA, arguments unchanged (autograd and dropout as PyTorch does them)."""
        self._count_cell(TRAINING_COUNT)[0] += 1
        gqa = {"enable_gqa": True} if enable_gqa else {}
        return pytorch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **gqa)

    # ------------------------------------------------------------------ deciding
    def _plan_for(self, key_, query, key, value, attn_mask, is_causal, enable_gqa, scale=_NOT_GIVEN) -> Plan:
        """Cold path (validate, rank, fit, tune), or a decision whose memory must be re-checked:
        when its kernel no longer is the first option that fits, only the memory fit is redone.
        `scale` is the call's (inference route only: it lets a new bucket be tuned on these inputs)."""
        plan = self._plans.get(key_)
        inputs = None if scale is _NOT_GIVEN else (query, key, value, attn_mask, scale, enable_gqa)
        retune = plan is not None and plan.tune_pending and inputs is not None
        if plan is not None and not retune and (not plan.recheck or self._recheck(plan)):
            return plan
        problem = plan.problem if plan is not None else Problem.from_tensors(
            query, key, value, attn_mask, is_causal, enable_gqa)
        with self._lock:
            current = self._plans.get(key_)
            if current is not None and current is not plan:
                return current  # another thread decided meanwhile
            if current is None or retune:
                plan = self._new_plan(problem, query.device, inputs)
            else:
                plan = self._refit(current)
            self._plans[key_] = plan
            _log.new_decision(plan.decision)
        return plan

    def _recheck(self, plan: Plan) -> bool:
        """Is the plan's kernel still the first option that fits free memory now? (A kernel
        shrunk to fit is no option: it stands while no option fits and it still does.)"""
        limit = memory_limit(free_bytes(plan.device), self.memory_budget)
        options = plan.ranked.options
        tuned = self._state(plan.device).tuned.get(failure_bucket(plan.problem)) if self.tune else None
        if tuned is not None:
            options = put_first(options, tuned.kernel)
        for option in options:
            if limit is None or option.workspace_bytes <= limit:
                return option.kernel is plan.kernel
        return limit is not None and plan.workspace <= limit  # an option's kernel is over it too

    def _state(self, device: torch.device) -> DeviceState:
        state = self._devices.get(device)
        if state is None:
            with self._lock:
                state = self._devices.get(device)
                if state is None:
                    state = self._devices[device] = DeviceState(resolve_ranking(device, home=self.home))
        return state

    def _new_plan(self, problem: Problem, device: torch.device, inputs: tuple | None = None) -> Plan:
        """Rank and fit; `inputs` (query, key, value, mask, scale, enable_gqa) let tuning time them."""
        state = self._state(device)
        failed = state.failures.get(failure_bucket(problem), {})
        ranked = rank_options(problem, self._kernels, state.ranking, failed, policy=self.policy)
        return self._fit(ranked, device, state, failed, inputs)

    def _refit(self, plan: Plan) -> Plan:
        """`plan` redone for the memory free now from its ranked options (ranking does not
        depend on free memory: `planning`'s two steps); ranked again only when one of them has
        since failed in the bucket (on another shape)."""
        state = self._state(plan.device)
        failed = state.failures.get(failure_bucket(plan.problem), {})
        ranked = plan.ranked
        if any(option.kernel.name in failed for option in ranked.options):
            ranked = rank_options(plan.problem, self._kernels, state.ranking, failed, policy=self.policy)
        return self._fit(ranked, plan.device, state, failed)

    def _fit(self, ranked: Ranked, device: torch.device, state: DeviceState, failed: dict[str, str],
             inputs: tuple | None = None) -> Plan:
        """The plan of the first ranked option that fits in memory now (`planning.fit_options`),
        or of the bucket's tuned kernel when tuning is on (timed now when `inputs` are given)."""
        problem = ranked.problem
        free, budget = free_bytes(device), self.memory_budget
        fit = fit_options(ranked, free=free, budget=budget, ranking=state.ranking, failed=failed)
        if not fit.options:
            raise NoKernelError(problem, str(device), ranked.dropped + fit.dropped)
        options, notes, dropped, pending = fit.options, fit.notes, fit.dropped + ranked.dropped, False
        if self.tune:
            state.open_store((lambda: tunings_dir(self.home)) if self.remember_tunings else None, self._signature)
            options, notes, dropped, pending = state.apply_tuning(
                options, notes, dropped, problem, device, inputs,
                on_failure=lambda name, error: self._remember(device, problem, name, error))
        decision = Decision(
            kernel=options[0].kernel.name, params=dict(options[0].kernel.params), problem=problem,
            device=str(device), source=state.ranking.source,
            candidates=tuple(option.candidate() for option in options),
            dropped=dropped, free_bytes=free, budget_bytes=budget, notes=notes,
        )
        chosen = options[0]
        recheck = needs_recheck(chosen.workspace_bytes, free) or pending
        return Plan(problem, device, chosen.kernel, chosen.workspace_bytes, recheck, ranked, decision,
                    self._count_cell(chosen.kernel.name), tune_pending=pending)

    def _count_cell(self, name: str) -> list[int]:
        cell = self._counts.get(name)
        if cell is None:
            with self._lock:
                cell = self._counts.setdefault(name, [0])
        return cell

    # ------------------------------------------------------------------ failing
    def _recover(
        self, plan, key_, error, query, key, value, attn_mask, scale, enable_gqa, *, training=False
    ) -> torch.Tensor:
        """`plan`'s kernel raised: remember it for the bucket, run the next candidate (repeatedly).
        On the training route a next candidate without backward hands over to PyTorch's SDPA."""
        check_scale(scale)
        while True:
            plan.count[0] -= 1  # count calls that returned, not attempts
            failed = plan.kernel.name
            self._remember_failure(plan, error)
            try:
                with self._lock:
                    self._plans.pop(key_, None)
                    plan = self._new_plan(plan.problem, plan.device)
                    self._plans[key_] = plan
            except NoKernelError as no_kernel:
                self._forget_out_of_memory(plan)
                raise no_kernel from error
            if training and not plan.kernel.supports_backward:
                _log.fallback(failed, error, TRAINING_KERNEL)
                return self._pytorch_training(query, key, value, attn_mask, 0.0, plan.problem.causal, scale, enable_gqa)
            _log.fallback(failed, error, plan.kernel.name)
            plan.count[0] += 1
            try:
                return plan.run(query, key, value, attn_mask, scale, enable_gqa, plan.problem)
            except Exception as next_error:  # noqa: BLE001
                error = next_error

    def _remember_failure(self, plan: Plan, error: BaseException) -> None:
        self._remember(plan.device, plan.problem, plan.kernel.name, error)

    def _remember(self, device: torch.device, problem: Problem, name: str, error: BaseException) -> None:
        """Kernel `name` raised `error` on `problem` (`DeviceState.remember`)."""
        out_of_memory = is_out_of_memory(error)
        if out_of_memory:
            release_cached_memory(device)
        with self._lock:
            self._state(device).remember(problem, name, error, out_of_memory)

    def _forget_out_of_memory(self, plan: Plan) -> None:
        with self._lock:
            self._state(plan.device).forget_out_of_memory(plan.problem)

    # ------------------------------------------------------------------ explaining
    def explain(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        *,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Decision:
        """The decision `attention` makes (or made) for these arguments, without running it."""
        attn_mask, is_causal = sdpa_context.explain_arguments(query, key, attn_mask, is_causal)  # issue 13 hook
        key_ = cache_key(query, key, value, attn_mask, is_causal, enable_gqa)
        plan = self._plans.get(key_)
        if plan is None or plan.recheck:
            plan = self._plan_for(key_, query, key, value, attn_mask, is_causal, enable_gqa)
        grad = _grad_enabled()
        why = _route(
            dropout_p,
            grad and (query.requires_grad or key.requires_grad or value.requires_grad),
            grad and attn_mask is not None and attn_mask.requires_grad,
            plan.kernel,
        )
        if why is None:
            return plan.decision
        return replace(plan.decision, kernel=TRAINING_KERNEL, params={}, route=ROUTE_TRAINING,
                       notes=(*plan.decision.notes, f"training: {why}"))

    def decide(self, problem: Problem, *, device: torch.device | str) -> Decision:
        """The decision for a `Problem` on `device` without tensors (``attn-dispatch explain``);
        not cached and not logged."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return self._new_plan(problem, device).decision

    def stats(self) -> dict[str, int]:
        """Calls per kernel name since the last `reset` (training calls that went to PyTorch's SDPA
        count as `TRAINING_COUNT`, ``"pytorch_sdpa (training)"``). Approximate under concurrent calls."""
        return {name: cell[0] for name, cell in self._counts.items() if cell[0]}

    def reset(self) -> None:
        """Forget every decision, table, remembered failure and count (after recalibrating, or
        after changing ``ATTN_DISPATCH_MEMORY_BUDGET`` / ``ATTN_DISPATCH_HOME``)."""
        with self._lock:
            self._plans.clear()
            self._devices.clear()
            self._counts.clear()
