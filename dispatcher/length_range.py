"""The key lengths one hot plan's C++ entry may serve (`fast_path`): every length over which the
plan's bucket would give a new exact shape the very same call.

A decode loop with a growing cache calls every layer at a key length one longer than the last
step's. Served per exact shape, each new length would take the dict path twice before its plan
went hot (a plan made from the bucket, then a guard built); a range entry serves the next lengths
in C++ from the first.

A range holds where a new exact shape of the bucket would be planned exactly as this one was, with
nothing that changes between lengths (`served_key_lengths`):
- the plan runs the bucket's first option, with no option passed over and no settling ahead, and a
  new shape runs that option whatever the bucket's history (`Bucket.new_shapes_run_first`);
- no failure is remembered for the bucket, nor its measuring pending, nor a memory re-check asked;
- every length lies in the bucket (`models.measured.length_bucket`: the powers of two that bound it)
  and, on a GPU where the plan runs one of our kernels, nowhere: such lengths are decided apart by
  whether they are a multiple of `KEY_COUNT_MULTIPLE` (`selection.keys_aligned`), which every run of
  consecutive lengths crosses (PyTorch's fused backends are taken alike on both sides, as their
  measured entries are: `device_ranking.measured_alignment_carries`); where causal, on one side of the query length (square and rectangular causality are probed
  as different features: `SdpaBackendKernel._features`);
- at both ends of the range the kernel takes the problem and makes the same call (`Kernel.sdpa_call`,
  `bare_call`), and at the longest its workspace fits as the planner would check it (`planning`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attn_dispatch.dispatcher.selection import decision_bucket, keys_aligned, needs_recheck, over_limit_reason
from attn_dispatch.kernels.registry import uses_fused_backend
from attn_dispatch.models.measured import length_bucket

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.device_planner import DevicePlanner
    from attn_dispatch.dispatcher.plans import Plan
    from attn_dispatch.kernels import Problem


def bucket_key_lengths(kv_len: int) -> tuple[int, int]:
    """The key lengths sharing `kv_len`'s bucket (`length_bucket`: rounded up to a power of two),
    lowest and highest."""
    exponent = length_bucket(kv_len)
    if exponent == 0:
        return kv_len, kv_len
    return (1 << (exponent - 1)) + 1, 1 << exponent


def served_key_lengths(planner: DevicePlanner, plan: Plan) -> tuple[int, int] | None:
    """``(lowest, highest)`` key lengths over which `plan`'s call stands for the plan its bucket
    would give a new exact shape (see the module's docstring), or None where it does not hold for
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

