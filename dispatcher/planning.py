"""From a problem to an ordered list of kernels that can run it and fit in memory.

Two steps, so the memory step can be redone cheaply when free memory changes:
`rank_options` (what can run, fastest first: the ranker's order, then supported kernels it did
not rank) and `fit_options` (drop what does not fit in free memory or the budget; where nothing
fits, a chunked kernel with smaller chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from attn_dispatch.dispatcher.decision import Candidate
from attn_dispatch.dispatcher.memory import format_bytes
from attn_dispatch.dispatcher.ranking import FALLBACK_FIRST, DeviceRanking
from attn_dispatch.kernels import AccuracyPolicy, ChunkedKernel, Kernel, Problem, kernel_from_name
from attn_dispatch.kernels._blocks import key_count_aligned
from attn_dispatch.models.buckets import length_bucket
from attn_dispatch.models.measured import entry_key

MIN_CHUNK = 16
"""Smallest query or key block `shrink_chunked` goes down to: below 16 rows a block's matmul no
longer fills even a CPU SIMD tile and the Python loop over blocks dominates; by then the block
workspace is a few percent of the output, so halving further frees almost nothing."""

RECHECK_FRACTION = 0.25
"""A decision whose workspace is above this fraction of the memory free when it was made is
re-checked against free memory on every call: other allocations between calls (activations,
a growing KV cache) can plausibly take that much. Below it, the decision stands until `reset`.
A quarter is a judgement call, not a measurement: it keeps the re-check (tens of microseconds)
off every small problem, and small problems are where per-call overhead matters. A faster
kernel dropped for lack of free memory is not re-checked on every call (that would put the
re-check on exactly the calls that fit easily); `Dispatcher.reset` reconsiders it."""


FASTER_DID_NOT_FIT = "a faster kernel did not fit in the memory free now; dispatcher.reset() reconsiders it"


@dataclass(frozen=True)
class Option:
    """A kernel that can run the problem, with its predicted time and workspace."""

    kernel: Kernel
    predicted_s: float | None
    workspace_bytes: int

    def candidate(self) -> Candidate:
        return Candidate(self.kernel.name, self.predicted_s, self.workspace_bytes)


@dataclass(frozen=True)
class Ranked:
    """The problem's runnable kernels, fastest first, and why every other kernel cannot run."""

    problem: Problem
    options: tuple[Option, ...]
    dropped: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Fit:
    """The options that fit in memory now (try order) and those dropped for memory."""

    options: tuple[Option, ...]
    dropped: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]


def rank_options(
    problem: Problem,
    kernels: Mapping[str, Kernel],
    ranking: DeviceRanking,
    failed: Mapping[str, str],
    *,
    policy: AccuracyPolicy,
) -> Ranked:
    """Order the kernels for `problem`: the ranker's order, then supported kernels it did not
    rank (``sdpa_default`` first among them, so PyTorch's own choice is always a fallback).
    Kernels marked ``last_resort`` (`kernel_set.LastResortDefault`) are never ranked.

    Parameters
    ----------
    kernels: the dispatcher's kernel set by name.
    failed: kernel name -> why it failed at run time in this problem's bucket (dropped).
    """
    last_resort = {name for name, kernel in kernels.items() if getattr(kernel, "last_resort", False)}
    ranked = ranking.rank(problem, [kernel for name, kernel in kernels.items() if name not in last_resort])
    options: list[Option] = []
    dropped: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, predicted in ranked:
        if name in seen or name in last_resort:
            continue
        seen.add(name)
        kernel = kernels.get(name)
        if kernel is None:
            try:
                kernel = kernel_from_name(name, policy=policy)
            except ValueError as error:
                dropped.append((name, f"named by the ranker but not a kernel of this version: {error}"))
                continue
        _consider(kernel, predicted, problem, failed, options, dropped)
    unranked = [kernel for name, kernel in kernels.items() if name not in seen]
    unranked.sort(key=lambda kernel: (kernel.name in last_resort, kernel.name != FALLBACK_FIRST))
    for kernel in unranked:
        _consider(kernel, None, problem, failed, options, dropped)
    return Ranked(problem, tuple(options), tuple(dropped))


def _consider(kernel, predicted, problem, failed, options, dropped) -> None:
    why = kernel.reasons(problem)
    if why:
        dropped.append((kernel.name, "; ".join(why)))
    elif kernel.name in failed:
        dropped.append((kernel.name, f"failed at run time on a problem of this size: {failed[kernel.name]}"))
    else:
        options.append(Option(kernel, predicted, int(kernel.workspace_bytes(problem))))


def memory_limit(free: int | None, budget: int | None) -> int | None:
    """The most workspace one call may use: the smaller of free memory and the budget."""
    limits = [value for value in (free, budget) if value is not None]
    return min(limits) if limits else None


def over_limit_reason(workspace: int, free: int | None, budget: int | None) -> str | None:
    """Why `workspace` bytes do not fit (None when they do)."""
    if budget is not None and workspace > budget:
        return f"needs {format_bytes(workspace)} of workspace, over the memory budget of {format_bytes(budget)}"
    if free is not None and workspace > free:
        return f"needs {format_bytes(workspace)} of workspace, only {format_bytes(free)} free on the device"
    return None


def needs_recheck(workspace: int, free: int | None) -> bool:
    """Re-check free memory on every call for this decision? (see `RECHECK_FRACTION`)"""
    return free is not None and workspace > RECHECK_FRACTION * free


def fit_options(
    ranked: Ranked, *, free: int | None, budget: int | None, ranking: DeviceRanking, failed: Mapping[str, str]
) -> Fit:
    """Keep the options whose workspace fits; where none does, shrink a chunked kernel until one
    does. A last-resort option (`kernel_set.LastResortDefault`) comes after all of them."""
    fitting: list[Option] = []
    dropped: list[tuple[str, str]] = []
    dropped_for_free_memory = False
    last_resort = [o for o in ranked.options if getattr(o.kernel, "last_resort", False)]
    for option in (o for o in ranked.options if o not in last_resort):
        why = over_limit_reason(option.workspace_bytes, free, budget)
        if why is None:
            fitting.append(option)
        else:
            dropped.append((option.kernel.name, why))
            dropped_for_free_memory |= not fitting and (budget is None or option.workspace_bytes <= budget)
    notes: list[str] = []
    if dropped_for_free_memory:
        notes.append(FASTER_DID_NOT_FIT)
    if not fitting and dropped:  # something runs but nothing fits: smaller chunks fit in less
        shrunk = shrink_chunked(ranked.problem, memory_limit(free, budget), failed)
        if shrunk is not None:
            predicted = dict(ranking.rank(ranked.problem, [shrunk])).get(shrunk.name)
            fitting.append(Option(shrunk, predicted, int(shrunk.workspace_bytes(ranked.problem))))
            notes.append(f"no ranked kernel fits in memory: {shrunk.name} uses smaller chunks to fit")
    for option in last_resort:  # after everything else, even a shrunk chunked kernel
        why = over_limit_reason(option.workspace_bytes, free, budget)
        if why is None:
            fitting.append(option)
        else:
            dropped.append((option.kernel.name, why))
    return Fit(tuple(fitting), tuple(dropped), tuple(notes))


def shrink_chunked(problem: Problem, limit: int | None, failed: Mapping[str, str],
                   bytes_needed: Callable[[ChunkedKernel, Problem], int] | None = None) -> ChunkedKernel | None:
    """The largest-chunked `ChunkedKernel` whose memory (`bytes_needed(kernel, problem)`, default
    its forward workspace) fits `limit`, halving the larger of the query and key chunks from the
    kernel's defaults (clipped to the problem) down to `MIN_CHUNK`. None when even the smallest
    does not fit (the output alone may not)."""
    if limit is None:
        return None
    if bytes_needed is None:
        bytes_needed = ChunkedKernel.workspace_bytes
    default = ChunkedKernel()
    q = max(MIN_CHUNK, min(default.q_chunk, 1 << length_bucket(problem.q_len)))
    kv = max(MIN_CHUNK, min(default.kv_chunk, 1 << length_bucket(problem.kv_len)))
    while True:
        kernel = ChunkedKernel(q=q, kv=kv)
        if kernel.name not in failed and not kernel.reasons(problem) and bytes_needed(kernel, problem) <= limit:
            return kernel
        if q <= MIN_CHUNK and kv <= MIN_CHUNK:
            return None
        if kv >= q and kv > MIN_CHUNK:
            kv //= 2
        else:
            q //= 2


def failure_bucket(problem: Problem) -> tuple:
    """The bucket a run-time failure or a tuning is remembered for: the problem with batch and
    lengths rounded up to powers of two (`models.buckets.length_bucket`, the threshold tables'
    length buckets; the key holds the exponents), and the mask reduced to which of its dimensions
    broadcast. It is a table's measured-entry key (`models.measured.entry_key`), so a remembered
    tuning is a measured entry."""
    return entry_key(problem)


def decision_bucket(problem: Problem) -> tuple:
    """The bucket a decision is made once for (`planner.DevicePlanner`): `failure_bucket`, the
    causal alignment (a lower-right `CausalBias` runs on other kernels than top-left causality) and,
    on a GPU, whether the key count is a multiple of `KEY_COUNT_MULTIPLE` (our kernels' measured
    times carry only within one: `ranking.measured_alignment_carries`)."""
    return (*entry_key(problem), problem.causal_alignment, keys_aligned(problem))


def keys_aligned(problem: Problem) -> bool | None:
    """Whether `problem`'s key count is a multiple of `KEY_COUNT_MULTIPLE`; None on a CPU."""
    return None if problem.device_type == "cpu" else key_count_aligned(problem.kv_len)
