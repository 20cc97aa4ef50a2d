"""The hot path: the plans called most recently, matched by one C++ check of the call's tensors (Dynamo's
`TensorGuards`: Python type, dispatch keys, dtype, device, sizes, strides, ``requires_grad``) instead of a key tuple
and a dict lookup (docs/RESULTS.md#warm-parity). A guard is stricter than the plan's key, so a miss only means the
dict path; only inference plans go hot. A check reads strides first, which aborts on a strided nested tensor:
`Dispatcher.attention` sends nested calls to the dict path. The C++ fast path (`fast_path`) mirrors these slots
(`HotSlots.set`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from attn_dispatch.dispatcher.selection import (
    calls_per_shape,
    decision_bucket,
    keys_aligned,
    needs_recheck,
    over_limit_reason,
)
from attn_dispatch.kernels.registry import uses_fused_backend
from attn_dispatch.models.environment import HOT_PATH
from attn_dispatch.models.measured import length_bucket

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.device_planner import DevicePlanner
    from attn_dispatch.dispatcher.plans import Plan
    from attn_dispatch.kernels import Problem

HOT_SLOTS = 2
"""Plans kept on the hot path, most recent first; each miss costs one rejected check."""

HOT_AFTER = 2
"""Calls of one exact shape before it goes hot (a guard costs a few warm calls); see also `shapes_called_again`."""


def hot_path_enabled() -> bool:
    """``ATTN_DISPATCH_HOT_PATH``, read when a `Dispatcher` is made."""
    return HOT_PATH.read()


def rehot(calls: int) -> bool:
    """Whether a warm plan met on the dict path at its `calls`-th call goes (back) on the hot path: at every power of
    two past `HOT_AFTER`, so a rotation of more shapes than `HOT_SLOTS` builds about log2(calls) guards per plan.
    (`Dispatcher.attention` also re-promotes a plan served twice in a row.)"""
    return calls > HOT_AFTER and not calls & (calls - 1)


def shapes_called_again(bucket) -> bool:
    """Whether a new shape of `bucket` goes hot at its first call: earlier shapes got `HOT_AFTER` calls each."""
    expected = calls_per_shape(cell[0] for cell in bucket.history)
    return expected is not None and expected >= HOT_AFTER


def tensor_guard(tensors: tuple[torch.Tensor, ...]) -> Callable[..., bool] | None:
    """``check(*tensors) -> bool``: True only for tensors like these (type, dispatch keys under the thread's state,
    dtype, device, sizes, strides, ``requires_grad``); None where this torch has no usable `TensorGuards`. A tensor
    passed twice is guarded once and the check also requires the same aliasing."""
    firsts = tuple(next(j for j, u in enumerate(tensors) if u is t) for t in tensors)
    distinct = tuple(sorted(set(firsts)))
    try:
        from torch._C._dynamo.guards import TensorGuards

        unique = tuple(tensors[j] for j in distinct)
        guard = TensorGuards(*unique, dynamic_dims_sizes=[list(t.shape) for t in unique],
                             dynamic_dims_strides=[list(t.stride()) for t in unique])
        if not guard.check(*unique):  # a build whose guards mean something else
            return None
    except Exception:  # noqa: BLE001 - no hot path on this torch: the dict path serves
        return None
    if len(distinct) == len(tensors):
        return guard.check
    inner = guard.check

    def check_aliased(*given: torch.Tensor) -> bool:
        return (len(given) == len(firsts) and all(given[i] is given[j] for i, j in enumerate(firsts))
                and inner(*(given[j] for j in distinct)))

    return check_aliased


def _never_matches(*_tensors: torch.Tensor) -> bool:
    """The Python check of an entry only the C++ fast path serves."""
    return False


class HotEntry:
    """One hot plan with its guard, cache key and call flags. ``pytorch_call``: the plan is one call of PyTorch's
    SDPA with the call's own arguments (`Plan.sdpa_flags`); ``fast``: its `fast_path` entry or None."""

    __slots__ = ("check", "plan", "key", "is_causal", "enable_gqa", "masked", "pytorch_call", "fast")

    def __init__(self, check: Callable[..., bool], plan, key: tuple, is_causal: bool, enable_gqa: bool,
                 masked: bool, fast=None) -> None:
        self.check = check
        self.plan = plan
        self.key = key
        self.is_causal = is_causal
        self.enable_gqa = enable_gqa
        self.masked = masked
        flags = plan.sdpa_flags
        self.pytorch_call = flags is not None and (not enable_gqa or "enable_gqa" in flags)
        self.fast = fast


def promoted(slots: tuple, entry: HotEntry) -> tuple:
    """`slots` with `entry` first, the least recent dropped past `HOT_SLOTS`."""
    return (entry, *(e for e in slots if e.plan is not entry.plan))[:HOT_SLOTS]


class HotSlots:
    """A dispatcher's hot path: its last `HOT_SLOTS` plans with guards (`slots`, most recent first), mirrored into
    the C++ slots where loaded (`fast`). Reads the plan `table` and the device `planners`."""

    def __init__(self, table: dict, lock, planners: dict, *, enabled: bool, fast=None) -> None:
        self.slots: tuple[HotEntry, ...] = ()
        self.table = table
        self.lock = lock
        self.planners = planners
        self.enabled = enabled
        self.fast = fast

    def make_hot(self, key_, plan: Plan, query, key, value, attn_mask, is_causal, enable_gqa) -> None:
        """Put `plan` first on the hot path, guarded by this call's tensors: only an inference plan still cached
        under `key_`, with no mask or a plain tensor one (no guard sees a `CausalBias`'s variant)."""
        tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
        if (not self.enabled or plan.recheck or plan.unguardable or any(t.requires_grad for t in tensors)
                or self.table.get(key_) is not plan
                or (attn_mask is not None and attn_mask.__class__ is not torch.Tensor)):
            return
        check = tensor_guard(tensors)
        fast = lengths = None
        if self.fast is not None:
            planner = self.planners.get(plan.device)
            lengths = None if planner is None else served_key_lengths(planner, plan)
            fast = self.fast.entry(plan, tensors, is_causal, enable_gqa, lengths)
        if check is None and fast is None:  # nothing can guard these tensors: not tried on every call
            plan.unguardable = True
            return
        with self.lock:  # another thread may have reset, evicted or replaced the plan meanwhile
            if self.table.get(key_) is plan:
                if lengths is not None and served_key_lengths(planner, plan) != lengths:
                    # or failed or re-decided its bucket: the range no longer holds, only the exact shape
                    fast = self.fast.entry(plan, tensors, is_causal, enable_gqa)
                self.set(promoted(self.slots, HotEntry(check or _never_matches, plan, key_, is_causal, enable_gqa,
                                                       attn_mask is not None, fast)))

    def drop_plan(self, plan: Plan) -> None:
        self.set(tuple(entry for entry in self.slots if entry.plan is not plan))

    def drop(self, key_: tuple) -> None:
        self.set(tuple(entry for entry in self.slots if entry.key != key_))

    def set(self, slots: tuple) -> None:
        """The one place the hot path changes; the C++ slots mirror it."""
        self.slots = slots
        if self.fast is not None:
            self.fast.mirror(slots)


# key-length ranges a hot plan's C++ entry may serve: where a new shape of its bucket would get the same call. It holds
# where the plan runs the bucket's first option with nothing passed over and no settling, failure, measuring or re-check
# pending; lengths lie in the bucket, on one side of the key-count alignment (our kernels on a GPU) and, causal, of the
# query length; at both ends the kernel takes the problem, makes the same call and its workspace fits.


def bucket_key_lengths(kv_len: int) -> tuple[int, int]:
    """The lowest and highest key lengths of `kv_len`'s bucket (`length_bucket`)."""
    exponent = length_bucket(kv_len)
    if exponent == 0:
        return kv_len, kv_len
    return (1 << (exponent - 1)) + 1, 1 << exponent


def served_key_lengths(planner: DevicePlanner, plan: Plan) -> tuple[int, int] | None:
    """``(lowest, highest)`` key lengths `plan`'s call serves for its bucket's new shapes (comment above), or None."""
    bucket = plan.bucket
    if (plan.settle_at or plan.recheck or plan.skipped or plan.trial is not None or bucket.trial is not None
            or not bucket.options
            or bucket.options[0].kernel is not plan.kernel or planner.state.failures.get(bucket.key)
            or not bucket.new_shapes_run_first(planner.cold_costs)):
        return None
    problem = plan.problem
    if keys_aligned(problem) is not None and not uses_fused_backend(plan.kernel):
        return None  # its bucket holds only the lengths of one key-count alignment
    if planner.buckets.get(decision_bucket(problem)) is not bucket:
        return None  # the bucket was decided again since: its new shapes get another plan
    low, high = bucket_key_lengths(problem.kv_len)
    if problem.causal and low <= problem.q_len <= high:
        if problem.kv_len == problem.q_len:
            return None
        low, high = (problem.q_len + 1, high) if problem.kv_len > problem.q_len else (low, problem.q_len - 1)
    if low >= high:
        return None
    kernel = plan.kernel
    call, bare = kernel.sdpa_call(problem), kernel.bare_call(problem)
    for length in (low, high):
        other = _at_key_length(problem, length)
        if other is None or kernel.reasons(other) or kernel.sdpa_call(other) != call or kernel.bare_call(other) != bare:
            return None
    workspace = int(kernel.workspace_bytes(other))  # the loop's last: the longest, the largest workspace
    if needs_recheck(workspace, bucket.free) or over_limit_reason(workspace, bucket.free, bucket.budget) is not None:
        return None
    return low, high


def _at_key_length(problem: Problem, kv_len: int) -> Problem | None:
    """`problem` at another key length, its mask following; None where the mask's last size is neither 1 nor S."""
    mask_shape = problem.mask_shape
    if mask_shape:
        if mask_shape[-1] == problem.kv_len and problem.kv_len != 1:
            mask_shape = (*mask_shape[:-1], kv_len)
        elif mask_shape[-1] != 1:
            return None
    return problem.at_key_length(kv_len, mask_shape)
