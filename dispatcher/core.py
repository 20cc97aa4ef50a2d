"""`Dispatcher`: per device, the fastest kernel that fits, decided once per size bucket; a kernel failing at run time
is replaced by the next and remembered. `attention` is the warm path: the hot slots (`hot_path`), else one key tuple
and one dict lookup, then the plan's `run` (validated when the plan was made); a miss goes to `cold_path.ColdPath`."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import replace

import torch

import attn_dispatch.dispatcher.sdpa_context as sdpa_context
from attn_dispatch.dispatcher.cold_path import ColdPath
from attn_dispatch.dispatcher.compiled import compiled_attention, compiling_readers, dispatcher_id
from attn_dispatch.dispatcher.decision import (
    ROUTE_TRAINING,
    TRAINING_KERNEL,
    Decision,
    parse_memory_size,
    with_lossy_gain,
)
from attn_dispatch.dispatcher.device_planner import PlannerConfig
from attn_dispatch.dispatcher.fast_path import attach
from attn_dispatch.dispatcher.hot_path import (
    HOT_AFTER,
    HotSlots,
    hot_path_enabled,
    rehot,
    shapes_called_again,
)
from attn_dispatch.dispatcher.measuring import measure_from_env
from attn_dispatch.dispatcher.plans import (
    MAX_PLANS,
    BoundedCache,
    CallCounts,
    Plan,
    PreparedAttention,
    cache_key,
    check_scale,
)
from attn_dispatch.dispatcher.sdpa_context import any_autocast as _any_autocast
from attn_dispatch.dispatcher.sdpa_context import (
    attention_under_autocast,
    autocast_inputs,
    restricted_decision,
)
from attn_dispatch.kernels import (
    LOSSLESS,
    AccuracyPolicy,
    Kernel,
    Problem,
    all_kernels,
    kernel_from_name,
    portable_kernels,
)
from attn_dispatch.kernels.registry import serving
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from attn_dispatch.kernels.sdpa_default import BACKEND_SWITCHES, SdpaDefaultKernel
from attn_dispatch.models import environment
from attn_dispatch.models.paths import tunings_dir

_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor
_respecting = sdpa_context.RESPECTING
_flash_on, _efficient_on, _math_on, _cudnn_on = BACKEND_SWITCHES
_sdpa = pytorch_sdpa
_pytorch = sdpa_context.pytorch_attention
_dynamo_compiling, _compile_flags = compiling_readers()  # `torch.compiler.is_compiling()`, in two cheap reads


def read_environment() -> None:
    """Validate every ``ATTN_DISPATCH_*`` variable (one-line ValueError) and follow the SDPA-kernel opt-out."""
    environment.check()
    sdpa_context.follow_environment()


def all_strided(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    """A call's tensors are all strided (not sparse or mkldnn); the others go to PyTorch's SDPA."""
    strided = torch.strided
    return (query.layout is strided and key.layout is strided and value.layout is strided
            and (attn_mask is None or attn_mask.layout is strided))


class Dispatcher:
    """Runs each attention call with the fastest kernel that fits in memory on its device.

    - `kernels`: ``"all"`` (default), ``"portable"`` (no fused PyTorch backends, as on gfx906), or kernels / kernel
      names used as given; the named sets add ``sdpa_default`` as the last-resort fallback.
    - `policy`: lossy conversions allowed, e.g. ``AccuracyPolicy.allowing("fp32->bf16")``.
    - `memory_budget`: most workspace per call, bytes or e.g. ``"16GiB"``; default ``ATTN_DISPATCH_MEMORY_BUDGET``.
    - `home`: directory of threshold tables (default ``ATTN_DISPATCH_HOME`` or the user cache).
    - `measure`: time candidates on a bucket's first calls where no measured entry of this card decides it
      (`dispatcher.measuring`); default on unless ``ATTN_DISPATCH_MEASURE=0``.
    - `remember_tunings`: keep measured buckets across processes (`dispatcher.measured_store`)."""

    def __init__(self, *, kernels: str | Sequence[Kernel | str] = "all", policy: AccuracyPolicy = LOSSLESS,
                 memory_budget: int | str | None = None, home: str | None = None, measure: bool | None = None,
                 remember_tunings: bool = True) -> None:
        if not isinstance(policy, AccuracyPolicy):
            raise TypeError(f"policy must be an AccuracyPolicy (e.g. AccuracyPolicy.allowing('fp32->bf16')), got {policy!r}")
        self.policy = policy
        self._kernels = kernel_set(kernels, policy)
        signature = json.dumps([sorted(self._kernels), policy.describe()])  # the kernel set's: names its tunings
        self._signature = hashlib.sha256(signature.encode()).hexdigest()[:16]
        self._budget = None if memory_budget is None else parse_memory_size(memory_budget, name="memory_budget")
        read_environment()  # a bad ATTN_DISPATCH_* value fails here, not at a model's first call
        self._home = home
        self._measure = measure
        self.remember_tunings = remember_tunings
        self._lock = threading.RLock()
        self.compile_id = dispatcher_id(self)
        self._fast = attach(self)  # `fast_path`'s C++ entry where it is built, else None
        # the parts: plans per exact shape, the hot slots over them, call counts, and the cold path
        self._plans: BoundedCache[tuple, Plan] = BoundedCache(
            MAX_PLANS, on_evict=lambda key_, plan: self._cold.evicted(key_, plan))
        self._plan_table = self._plans.table  # the warm path's lookup
        self._counts = CallCounts(self._lock)
        self._hot_path = HotSlots(self._plan_table, self._lock, {}, enabled=hot_path_enabled(), fast=self._fast)
        self._last_dict_plan = None  # the dict path's last plan (`hot_path.rehot`)
        config = PlannerConfig(self._kernels, policy, self._signature,
                               (lambda: tunings_dir(self.home)) if remember_tunings else None, self._counts.cell)
        self._cold = ColdPath(config, self._plans, self._hot_path, self._counts, settings=self._settings,
                              lock=self._lock, home=home)
        self._traced_shapes: set[tuple] = set()  # exact shapes traced into compiled graphs (`compiled`)

    # ------------------------------------------------------------------ configuration
    @property
    def kernels(self) -> list[Kernel]:
        return list(self._kernels.values())

    @property
    def memory_budget(self) -> int | None:
        """Workspace cap in bytes: the argument, else ``ATTN_DISPATCH_MEMORY_BUDGET``, else None."""
        return self._budget if self._budget is not None else environment.MEMORY_BUDGET.read()

    @property
    def measure(self) -> bool:
        """Measuring on a bucket's calls: the argument, else ``ATTN_DISPATCH_MEASURE`` (on unless 0)."""
        return self._measure if self._measure is not None else measure_from_env()

    # ------------------------------------------------------------------ the call
    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False, *,
                  scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
        """`torch.nn.functional.scaled_dot_product_attention`, run by the fastest kernel that fits; returns ``[...,
        Hq, L, Ev]`` in the query's dtype.

        Dropout, or inputs requiring grad with grad enabled, go to PyTorch's SDPA unless the chosen kernel supports
        backward. `fast_attention` serves hot plans in C++ and hands every other call here."""
        if _dynamo_compiling() or _compile_flags._is_compiling_flag:  # torch.compile: made and traced in `compiled`
            if dropout_p != 0.0 or (attn_mask is not None and attn_mask.__class__ is not torch.Tensor) or (
                    _grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad
                                         or (attn_mask is not None and attn_mask.requires_grad))):
                # the training route, and a CausalBias through PyTorch's own handling: PyTorch's SDPA
                return sdpa_context.pytorch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                      enable_gqa)
            return compiled_attention(self, query, key, value, attn_mask, is_causal, scale, enable_gqa)
        plan = None
        hot = self._hot_path.slots
        if hot and dropout_p == 0.0:  # `hot_path`: the plans called last, matched by one C++ check of the tensors
            entry = None  # no strided nested tensor may reach a check (it reads strides first: the process aborts)
            try:
                if not (query.is_nested or key.is_nested or value.is_nested
                        or (attn_mask is not None and attn_mask.is_nested)):
                    for entry in hot:
                        if (entry.is_causal is is_causal and entry.enable_gqa is enable_gqa and (  # bools: `is`
                                attn_mask is not None and entry.check(query, key, value, attn_mask) if entry.masked
                                else attn_mask is None and entry.check(query, key, value))):
                            break
                    else:
                        entry = None
            except AttributeError:  # not tensors: the dict path raises SDPA's TypeError
                entry = None
            if entry is not None and (entry.pytorch_call or not (_respecting[0] or entry.masked and is_causal) or (
                    _flash_on() and _efficient_on() and _math_on() and _cudnn_on())):  # else `route` below: a plan
                # that is one call of PyTorch's SDPA makes that same call (re-raising its error)
                plan, key_ = entry.plan, entry.key
                count = plan.count
                calls = count[0] + 1  # a hot plan is past HOT_AFTER: only its settling is checked
                count[0] = calls
                if calls == plan.settle_at:
                    plan = self._cold.settle(key_, plan)
                flags = plan.sdpa_flags
        if plan is None:
            # the caller's context, before any size is read: sdpa_kernel restrictions, CausalBias, a query subclass
            # (jagged nested). Meta and strided nested queries are found where the key misses or fails
            if (type(query) is not _Tensor or (attn_mask is not None and attn_mask.__class__ is not _Tensor)
                    or ((_respecting[0] or is_causal is True and attn_mask is not None)  # a mask with is_causal: route's
                        and not (_flash_on() and _efficient_on() and _math_on() and _cudnn_on()))):
                try:
                    routed = sdpa_context.route(self, query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                enable_gqa)
                except AttributeError:  # not tensors: validation raises SDPA's TypeError
                    Problem.from_tensors(query, key, value, attn_mask, is_causal, enable_gqa)
                    raise
                if routed is not None:
                    return routed
            if is_causal.__class__ is not bool or enable_gqa.__class__ is not bool:  # PyTorch's TypeError
                return _pytorch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            if _any_autocast():  # autocast's casts, which it makes for PyTorch's SDPA (`sdpa_context`)
                cast = autocast_inputs(query, key, value, attn_mask)
                if cast is not None:
                    return attention_under_autocast(self.attention, cast, dropout_p, is_causal, scale, enable_gqa)
            try:
                key_ = (  # `cache_key`, inlined: this is the warm path
                    query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype,
                    query.device, key.device, value.device,
                    query.is_contiguous() and key.is_contiguous() and value.is_contiguous(),
                    None if attn_mask is None else (attn_mask.shape, attn_mask.dtype, attn_mask.device, attn_mask.__class__),
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
            except RuntimeError:  # a strided nested tensor has no `.shape`
                if query.is_nested or key.is_nested or value.is_nested:
                    return _pytorch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
                raise
            if training:
                return self._cold.training(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, key_,
                                           self.memory_budget)
            try:
                plan = self._plan_table[key_]  # a subscript, not `.get`: the warm path
            except KeyError:
                plan = None
            if plan is None or plan.recheck:
                if (query.is_meta or key.is_nested or value.is_nested
                        or not all_strided(query, key, value, attn_mask)):
                    # shapes only, nested K/V with a dense query, or a sparse or mkldnn tensor (PyTorch's errors,
                    # not failures remembered against the bucket's kernels): PyTorch's SDPA (`sdpa_context`), no plan kept
                    return _pytorch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
                plan = self._cold.plan_for(key_, query, key, value, attn_mask, is_causal, enable_gqa)
                promote = shapes_called_again(plan.bucket)  # a decode step's next length: hot from its 1st call
            else:  # (back) on the hot path: its 2nd call, served twice in a row, powers of two (`hot_path.rehot`)
                promote = plan is self._last_dict_plan or plan.count[0] + 1 == HOT_AFTER or rehot(plan.count[0] + 1)
            self._last_dict_plan = plan
            count = plan.count
            calls = count[0] + 1  # the cell read once
            count[0] = calls
            if calls == plan.settle_at:
                plan = self._cold.settle(key_, plan)
            elif promote:  # after the count: a plan evicted while its guard is built keeps this call in `stats`
                self._hot_path.make_hot(key_, plan, query, key, value, attn_mask, is_causal, enable_gqa)
            flags = plan.sdpa_flags
        try:
            if flags is not None:  # PyTorch's SDPA on the call's tensors and scale, no frame of ours between (a
                # CausalBias never gets here: `route` makes an upper-left one is_causal, a lower-right one has no
                # `sdpa_call`); default keywords left out
                if scale is not None:
                    return _sdpa(query, key, value, attn_mask, scale=scale, **flags)
                if flags:
                    return _sdpa(query, key, value, attn_mask, **flags)
                return _sdpa(query, key, value, attn_mask)  # PyTorch parses even `**{}`
            return plan.run(query, key, value, attn_mask, scale, enable_gqa, plan.problem)
        except Exception as error:  # noqa: BLE001 - any kernel failure falls back to the next kernel
            if flags is not None and sdpa_context.backends_restricted():
                raise  # restricted backends: PyTorch's own call, its own error (as `route` gives)
            if not all_strided(query, key, value, attn_mask):  # sparse/mkldnn hit a warm plan: no
                return _pytorch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)  # failure kept
            return self._cold.recover(plan, key_, error, query, key, value, attn_mask, scale, enable_gqa)

    __call__ = attention

    # ------------------------------------------------------------------ planning
    def plan(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attn_mask: torch.Tensor | None = None, is_causal: bool = False, *, scale: float | None = None,
             enable_gqa: bool = False) -> PreparedAttention:
        """Decide once for these arguments' exact shape; the returned `PreparedAttention` runs the chosen kernel on
        later calls of that shape with no lookup. A call of another shape, dtype, device or layout raises ValueError."""
        try:
            key_ = cache_key(query, key, value, attn_mask, is_causal, enable_gqa)
        except AttributeError:  # not tensors: validation raises SDPA's TypeError
            Problem.from_tensors(query, key, value, attn_mask, is_causal, enable_gqa)
            raise
        check_scale(scale)
        plan = self._cold.plan_for(key_, query, key, value, attn_mask, is_causal, enable_gqa)
        return PreparedAttention(self, plan, key_, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    # ------------------------------------------------------------------ explaining
    def explain(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False, *,
                scale: float | None = None, enable_gqa: bool = False) -> Decision:
        """The decision `attention` makes for these arguments, without running it (restricted: PyTorch's backend)."""
        if sdpa_context.backends_restricted() and not (query.is_meta or query.is_nested):
            grad = _grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
            problem = Problem.from_tensors(query, key, value, attn_mask, is_causal, enable_gqa)
            return restricted_decision(problem, query.device, self.memory_budget, training=dropout_p != 0.0 or grad)
        attn_mask, is_causal = sdpa_context.explain_arguments(query, key, attn_mask, is_causal)  # the caller's context (`sdpa_context`)
        cast = autocast_inputs(query, key, value, attn_mask) if _any_autocast() else None
        if cast is not None:  # under torch.autocast: the inputs `attention` runs (`sdpa_context`)
            query, key, value, attn_mask = cast
        key_ = cache_key(query, key, value, attn_mask, is_causal, enable_gqa)
        plan = self._cold.plan_for(key_, query, key, value, attn_mask, is_causal, enable_gqa)
        from attn_dispatch.dispatcher.training_route import pytorch_route_reason

        grad = _grad_enabled()
        inputs_grad = grad and (query.requires_grad or key.requires_grad or value.requires_grad)
        why = pytorch_route_reason(dropout_p, False, grad and attn_mask is not None and attn_mask.requires_grad, plan.kernel)
        if why is None:
            if inputs_grad:
                return self._cold.training_route.decision(plan, self.memory_budget)
            return with_lossy_gain(plan.decision, self._cold.planner(query.device).state.ranking.prior, self.policy)
        return replace(plan.decision, kernel=TRAINING_KERNEL, params={}, route=ROUTE_TRAINING,
                       notes=(*plan.decision.notes, f"training: {why}"))

    def decide(self, problem: Problem, *, device: torch.device | str) -> Decision:
        """The decision for a `Problem` on `device` without tensors (``attn-dispatch explain``); not cached."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        planner = self._cold.planner(device)
        decision = planner.decide(problem, budget=self.memory_budget, measure=self.measure,
                                  on_failure=lambda name, error: None, defer_probes=False).explained()
        return with_lossy_gain(decision, planner.state.ranking.prior, self.policy)

    def use_table(self, table, path: str) -> None:
        """Rank with `table` (read from `path`) on every device instead of the lookup's; forgets every decision."""
        self._cold.ranking_options = {"given": (table, str(path))}
        self.reset()

    # ------------------------------------------------------------------ the parts
    @property
    def home(self) -> str | None:
        """The directory of threshold tables and measured buckets (None: ``ATTN_DISPATCH_HOME`` or the user cache)."""
        return self._home

    @property
    def fast_attention(self):
        """What to put where SDPA is looked up: the C++ fast path's builtin (`fast_path`), which serves hot plans
        with no Python frame and hands other calls to `attention`; `attention` itself where not built."""
        return self.attention if self._fast is None else self._fast.callable()

    def stats(self) -> dict[str, int]:
        """Calls per kernel since the last `reset` (training calls to PyTorch: ``"pytorch_sdpa (training)"``);
        approximate."""
        return self._counts.stats(self._plans.values())

    def _settings(self) -> tuple[int | None, bool]:
        return self.memory_budget, self.measure

    def reset(self) -> None:
        """Forget every decision, table, remembered failure and count (after recalibrating or changing the
        environment)."""
        with self._lock:
            self._plans.clear()
            self._hot_path.set(())  # every plan leaves
            self._last_dict_plan = None
            self._traced_shapes.clear()
            self._counts.clear()
            self._cold.reset()


# the kernels a dispatcher chooses from: a named set or the user's own list

KERNEL_SETS = ("all", "portable")
"""The named kernel sets (`Dispatcher(kernels=...)`, the CLI's ``--kernels``)."""


class LastResortDefault(SdpaDefaultKernel):
    """PyTorch's own SDPA as the portable set's last resort: never ranked, tried after every ranked kernel."""

    last_resort = True


def kernel_set(kernels: str | Sequence[Kernel | str], policy: AccuracyPolicy) -> dict[str, Kernel]:
    """Kernels by name: a named set plus its ``sdpa_default`` fallback, or the given kernels / names (ValueError /
    TypeError)."""
    if isinstance(kernels, str):
        if kernels not in KERNEL_SETS:
            raise ValueError(f"kernels={kernels!r}: pass 'all', 'portable' or a list of kernels / kernel names")
        if kernels == "all":
            chosen = [*serving(all_kernels(policy=policy)), SdpaDefaultKernel()]
        else:
            chosen = [*serving(portable_kernels(policy=policy)), LastResortDefault()]
    else:
        chosen = [kernel_from_name(k, policy=policy) if isinstance(k, str) else k for k in kernels]
        for kernel in chosen:
            if not isinstance(kernel, Kernel):
                raise TypeError(f"kernels must hold Kernel objects or kernel names, got {kernel!r}")
    by_name: dict[str, Kernel] = {}
    for kernel in chosen:
        by_name.setdefault(kernel.name, kernel)
    return by_name
