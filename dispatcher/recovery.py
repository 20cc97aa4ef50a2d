"""What a `Dispatcher` does when a kernel raises at run time: remember the failure for the kernel's
bucket, decide again without it, and run the next candidate (`RecoveringDispatcher`). A call with a
forward-AD dual tensor gets PyTorch's SDPA instead, nothing remembered (`dual_calls`)."""

from __future__ import annotations

import torch

from attn_dispatch.dispatcher import _log
from attn_dispatch.dispatcher.dual_calls import carries_tangent, pytorch_dual_call
from attn_dispatch.dispatcher.errors import NoKernelError
from attn_dispatch.dispatcher.memory import release_cached_memory
from attn_dispatch.dispatcher.plans import Plan, check_scale
from attn_dispatch.dispatcher.sdpa_context import some_backend_off
from attn_dispatch.kernels import Problem
from attn_dispatch.kernels.failures import is_out_of_memory
from attn_dispatch.kernels.registry import uses_fused_backend


class RecoveringDispatcher:
    """The failure handling of `core.Dispatcher` (a base class of it: it uses the dispatcher's
    plans, planners, lock and counts)."""

    def _recover(self, plan, key_, error, query, key, value, attn_mask, scale, enable_gqa) -> torch.Tensor:
        """`plan`'s kernel raised: remember it for the bucket, run the next candidate (repeatedly)."""
        plan.count[0] -= 1  # count calls that returned, not attempts (a bad `scale` raises here, uncounted)
        if carries_tangent(query, key, value, attn_mask):  # PyTorch's answer to a dual tensor, nothing remembered
            return pytorch_dual_call(key_, query, key, value, attn_mask, scale, enable_gqa)
        check_scale(scale)
        switched: list[tuple[Problem, str]] = []
        try:
            return self._recover_from(plan, key_, error, query, key, value, attn_mask, scale, enable_gqa, switched)
        finally:
            if switched:
                self._forget_switched(plan, key_, switched)

    def _forget_switched(self, plan: Plan, key_: tuple, switched: list[tuple[Problem, str]]) -> None:
        """Forget failures a switched-off backend may have caused (reached inside ``sdpa_kernel(...)``
        where restrictions are not respected: ``ATTN_DISPATCH_IGNORE_SDPA_KERNEL=1``; a 3-D call under
        flash only fails for the switch alone), and the plans made without those kernels, so the
        bucket decides anew at its next call. Kept, such a failure made a later call of the bucket
        that PyTorch serves raise `NoKernelError` (helper nu13, session 13)."""
        with self._lock:
            for problem, name in switched:
                self._state(plan.device).forget_failure(problem, name)
            old = self._plans.pop(key_, None)
            self._drop_hot(key_)
            if old is not None:
                self._fold_count(old)
                self._drop_bucket_plans(old.bucket)
            self._planner(plan.device).forget_bucket(plan.problem)

    def _recover_from(self, plan, key_, error, query, key, value, attn_mask, scale, enable_gqa,
                      switched: list) -> torch.Tensor:
        """The recovery loop of `_recover`; a failure of a kernel running PyTorch's SDPA while some
        backend is switched off is also appended to `switched` as ``(problem, name)``."""
        planner = self._planner(plan.device)
        while True:
            failed = plan.kernel.name
            self._remember(plan.device, plan.problem, failed, error)
            if uses_fused_backend(plan.kernel) and some_backend_off():
                switched.append((plan.problem, failed))
            try:
                with self._lock:
                    old = self._plans.pop(key_, None)
                    self._drop_hot(key_)
                    if old is not None:
                        self._fold_count(old)
                    self._drop_bucket_plans(plan.bucket)
                    planner.forget_bucket(plan.problem)
                    plan, decided = planner.plan(plan.problem, key_, settings=self._settings,
                                                 on_failure=self._failure_handler(plan.device, plan.problem),
                                                 new_shape=False)
                    self._keep_plan(key_, plan)
            except NoKernelError as no_kernel:
                self._forget_out_of_memory(plan)
                raise no_kernel from error
            _log.fallback(failed, error, plan.kernel.name)
            plan.count[0] += 1
            try:
                return plan.run(query, key, value, attn_mask, scale, enable_gqa, plan.problem)
            except Exception as next_error:  # noqa: BLE001
                plan.count[0] -= 1
                error = next_error

    def _drop_bucket_plans(self, bucket) -> None:
        """A kernel of `bucket` failed and the bucket decides again: its other exact shapes' plans
        leave too, and the hot path with them (as evicted ones do: their calls stay in `stats`; a C++
        range entry leaves with the plan it was made for), so every shape of the bucket,
        planned on the Python path or served by a C++ range entry (`length_range`), is planned anew
        from the new decision, whichever path its next call takes."""
        for key_, plan in list(self._plans.table.items()):
            if plan.bucket is bucket:
                self._plans.pop(key_)
                self._evicted(key_, plan)

    def _keep_plan(self, key_: tuple, plan: Plan) -> None:
        """Cache `plan` under `key_`, unless it is a meta device's (from `explain` or `plan`): a meta
        call must miss, since `Dispatcher.attention` sends it to PyTorch's SDPA on a miss only. A plan
        it replaces leaves the hot path (`hot_path`)."""
        if plan.device.type != "meta":
            if self._plans.get(key_) is not None:
                self._drop_hot(key_)  # a plan replaced leaves the hot path
            self._plans.put(key_, plan)

    def _failure_handler(self, device: torch.device, problem: Problem):
        """Where tuning reports a contender that raised on `problem`."""
        return lambda name, error: self._remember(device, problem, name, error)

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
