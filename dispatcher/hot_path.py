"""The hot path: the plans called most recently, matched by one C++ check of the call's tensors
instead of a key tuple built from their attributes and a dict lookup.

A warm call's key reads about a dozen tensor attributes and hashes the tuple for a dict lookup.
The loops users run call one shape many times in a row (every layer of a decode step, every block
of a denoising step), so the dispatcher keeps its last `HOT_SLOTS` plans with a guard each:
Dynamo's own tensor check (`torch._C._dynamo.guards.TensorGuards`, what a compiled graph runs
before each call), which compares in C++ the Python type, dispatch keys, dtype, device, exact sizes
and strides and ``requires_grad`` of every tensor. Where the fast path is not built, or the plan
runs one of our own kernels, this is what serves a warm call (its cost against the dict path's:
docs/RESULTS.md#warm-parity).

A guard is stricter than the plan's key (exact strides, not only contiguity; the dispatch keys
carry inference mode), so a match always falls in the plan's key, and a miss only means the dict
path. It records ``requires_grad`` as False on every tensor (only inference plans go hot), so a
match with no dropout is an inference call. Where a torch build lacks the class or refuses the
arguments, `tensor_guard` returns None and the dict path serves every call. A check reads each
tensor's strides before comparing anything, and a strided nested tensor's abort the process, so `Dispatcher.attention` sends a call with a nested tensor to the dict path first.

The fast path (`fast_path`) mirrors these slots in C++: an entry whose plan is exactly its call's own
PyTorch SDPA call, or one fused backend's bare operator call, gets a C++ record of its tensors
(``HotEntry.fast``), serving the key lengths of its bucket that a new shape would get the same call
at (`served_key_lengths`), and every change of the slots goes through `HotSlots.set`, which hands the
C++ side the new set.
"""

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
from attn_dispatch.models.measured import length_bucket
from attn_dispatch.models.environment import HOT_PATH

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.device_planner import DevicePlanner
    from attn_dispatch.dispatcher.plans import Plan
    from attn_dispatch.kernels import Problem

HOT_SLOTS = 2
"""Plans kept on the hot path, most recent first: two serve a model alternating two shapes (a
diffusion block's self- and cross-attention), one its decode step; each slot a call misses costs
one rejected check."""

HOT_AFTER = 2
"""Calls of one plan (its exact shape) before it goes hot: building a guard costs about four warm
calls' keys, so a shape called once (a decode step's first layer that never comes back) does not
pay it, and one called on every layer pays it once. A new shape of a bucket whose shapes are called
again (`shapes_called_again`) goes hot at its first call."""


def hot_path_enabled() -> bool:
    """``ATTN_DISPATCH_HOT_PATH`` (`models.environment.HOT_PATH`), read when a `Dispatcher` is made."""
    return HOT_PATH.read()


def rehot(calls: int) -> bool:
    """Whether a warm plan met on the dict path at its `calls`-th call goes (back) on the hot path:
    at every power of two past `HOT_AFTER`. A plan pushed off by others, or first made hot in
    another mode (inference mode, autocast: the guard's dispatch keys differ), comes back after a
    number of calls that doubles each time, so a rotation of more shapes than `HOT_SLOTS` builds
    about log2(calls) guards per plan instead of one per call.

    A warm plan the dict path serves twice in a row also goes back on at once
    (`Dispatcher.attention`): a repeated decode loop meets each key length for one run of calls (one
    per layer) per pass, which the power-of-two rule alone would leave on the dict path. A rotation
    of shapes never serves one plan twice in a row, so it builds no more guards."""
    return calls > HOT_AFTER and not calls & (calls - 1)


def shapes_called_again(bucket) -> bool:
    """Whether a new exact shape of `bucket` goes hot at its first call: where the bucket's earlier
    shapes got `HOT_AFTER` calls or more each (`selection.calls_per_shape`: a decode loop calls every
    layer at each new key length), its guard would be built at the second call anyway, and building
    it at the first spares the second call the dict path. A shape of a bucket with no such history
    waits for its second call."""
    expected = calls_per_shape(cell[0] for cell in bucket.history)
    return expected is not None and expected >= HOT_AFTER


def tensor_guard(tensors: tuple[torch.Tensor, ...]) -> Callable[..., bool] | None:
    """``check(*tensors) -> bool``: True only for tensors of these Python types, dispatch keys
    (under the calling thread's state), dtypes, devices, sizes, strides and ``requires_grad``;
    None where this torch has no usable `TensorGuards`.

    A tensor passed twice (``key is value``, self-attention on one tensor) fails `TensorGuards`'s
    own check: the guard then covers each distinct tensor once and the check also requires the same
    positions to hold the same tensor (a Python wrapper, on such calls only)."""
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
    """The Python check of an entry only the fast path's C++ check serves (no guard could be built)."""
    return False


class HotEntry:
    """One hot plan: ``check`` (`tensor_guard` over query, key, value and the mask when there is
    one), the plan and its cache key, and the call's ``is_causal``, ``enable_gqa`` and whether it
    had a mask. ``pytorch_call``: the plan is one call of PyTorch's SDPA with the call's own
    arguments (`Plan.sdpa_flags`, ``enable_gqa`` not dropped), the same call `route` would make
    under `sdpa_kernel` restrictions. ``fast``: its `fast_path` entry (served in C++), or None."""

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
    """A dispatcher's hot path: its last `HOT_SLOTS` plans with their guards (`slots`, most recent
    first), mirrored into the fast path's C++ slots where it is loaded (`fast`). Reads the plan table
    (`table`: exact shape key -> `Plan`) to make sure a plan is still cached when it goes hot, and the
    device planners (`planners`) for the key lengths a C++ entry may serve (`hot_path`)."""

    def __init__(self, table: dict, lock, planners: dict, *, enabled: bool, fast=None) -> None:
        self.slots: tuple[HotEntry, ...] = ()
        self.table = table
        self.lock = lock
        self.planners = planners
        self.enabled = enabled
        self.fast = fast

    def make_hot(self, key_, plan: Plan, query, key, value, attn_mask, is_causal, enable_gqa) -> None:
        """Put `plan` first on the hot path, guarded by this call's tensors: only an inference plan
        (no tensor requiring grad: a match is then no training call) kept under `key_`, with no mask
        or a plain tensor one (`sdpa_context.route` reads a `CausalBias`'s variant, which no tensor
        guard sees)."""
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
        """`plan` leaves the hot path (evicted, replaced, or its bucket decided again)."""
        self.set(tuple(entry for entry in self.slots if entry.plan is not plan))

    def drop(self, key_: tuple) -> None:
        """The plan cached under `key_` is replaced or removed: it leaves the hot path (the others stay)."""
        self.set(tuple(entry for entry in self.slots if entry.key != key_))

    def set(self, slots: tuple) -> None:
        """The one place the hot path changes: the fast path's C++ slots mirror it, so they never
        serve a plan dropped here."""
        self.slots = slots
        if self.fast is not None:
            self.fast.mirror(slots)


# key-length ranges: the lengths one hot plan's C++ entry may serve, where a new exact shape of its
# bucket would get the very same call (a decode loop's next key length then needs no Python). That
# holds where the plan runs its bucket's first option with nothing passed over, no settling, failure,
# measuring or memory re-check pending; every length lies in the bucket and, on a GPU running one of
# our kernels, on one side of the key-count alignment (`selection.keys_aligned`); where causal, on one
# side of the query length; and at both ends the kernel takes the problem, makes the same call
# (`Kernel.sdpa_call`, `bare_call`) and its workspace fits.


def bucket_key_lengths(kv_len: int) -> tuple[int, int]:
    """The key lengths sharing `kv_len`'s bucket (`length_bucket`: rounded up to a power of two),
    lowest and highest."""
    exponent = length_bucket(kv_len)
    if exponent == 0:
        return kv_len, kv_len
    return (1 << (exponent - 1)) + 1, 1 << exponent


def served_key_lengths(planner: DevicePlanner, plan: Plan) -> tuple[int, int] | None:
    """``(lowest, highest)`` key lengths over which `plan`'s call stands for the plan its bucket
    would give a new exact shape (see the comment above), or None where it does not hold for
    any other length."""
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
    """`problem` at another key length, its mask's last size following (or None where the mask's
    last size is neither 1 nor the key length: no range)."""
    mask_shape = problem.mask_shape
    if mask_shape:
        if mask_shape[-1] == problem.kv_len and problem.kv_len != 1:
            mask_shape = (*mask_shape[:-1], kv_len)
        elif mask_shape[-1] != 1:
            return None
    return problem.at_key_length(kv_len, mask_shape)
