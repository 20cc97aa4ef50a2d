"""Kernel selection: `decide` decides a size bucket (`decision_bucket`) once, in stages `rank`, `fit`,
`keep_default_unmeasured`, `measured_order` / `measured_candidates`; each exact shape then gets one more stage,
`new_shape_order` / `compile_deferred_order` (set-up cost). Why each stage exists: docs/RESULTS.md#ablations."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from attn_dispatch.dispatcher.call_clock import clock_for
from attn_dispatch.dispatcher.decision import Candidate, NoKernelError, format_bytes, format_seconds
from attn_dispatch.dispatcher.device_ranking import FALLBACK_FIRST, MEASURED_LEVELS, DeviceRanking
from attn_dispatch.kernels import AccuracyPolicy, ChunkedKernel, Kernel, Problem, kernel_from_name
from attn_dispatch.kernels._blocks import key_count_aligned
from attn_dispatch.kernels.base import compile_seconds
from attn_dispatch.kernels.registry import uses_fused_backend, working_family
from attn_dispatch.kernels.sdpa_default import default_backend_choice, probes_deferred
from attn_dispatch.models.measured import entry_key, length_bucket
from attn_dispatch.models.probe_store import kind_of

# ------------------------------------------------------------------------------------ the options


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


@dataclass(frozen=True)
class Tuned:
    """A bucket's result measured on its calls: the serving kernel and each candidate's median seconds (inf: failed)."""

    kernel: str
    seconds: tuple[tuple[str, float], ...]

    def timings(self) -> str:
        return ", ".join(f"{name} {s * 1e3:.3g} ms" if math.isfinite(s) else f"{name} failed" for name, s in self.seconds)

    def note(self) -> str:
        return f"measured on this bucket's calls (kept in the home's tuning store): {self.timings()}; {self.kernel} serves it"


@dataclass(frozen=True)
class Selection:
    """A bucket's decision: options in try order, drops, notes, the seconds that ordered them, the candidates to
    measure."""

    ranked: Ranked
    options: tuple[Option, ...]
    dropped: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]
    seconds: Mapping[str, float]
    candidates: tuple[Option, ...]


def put_first(options: tuple[Option, ...], name: str) -> tuple[Option, ...]:
    """`options` with kernel `name` moved to the front (unchanged when absent)."""
    chosen = [o for o in options if o.kernel.name == name]
    return tuple(chosen + [o for o in options if o.kernel.name != name])


def is_default(kernel: Kernel) -> bool:
    """PyTorch's own choice as a contender (not the portable set's last resort)."""
    return kernel.name == FALLBACK_FIRST and not getattr(kernel, "last_resort", False)


# ------------------------------------------------------------------------------------ the buckets


def failure_bucket(problem: Problem) -> tuple:
    """The bucket a run-time failure or measured result is kept for (`models.measured.entry_key`)."""
    return entry_key(problem)


def decision_bucket(problem: Problem) -> tuple:
    """`failure_bucket` plus causal alignment and, on a GPU, `keys_aligned` (docs/RESULTS.md#ablations)."""
    return (*entry_key(problem), problem.causal_alignment, keys_aligned(problem))


def keys_aligned(problem: Problem) -> bool | None:
    """Whether the key count is a multiple of `KEY_COUNT_MULTIPLE`; None on a CPU."""
    return None if problem.device_type == "cpu" else key_count_aligned(problem.kv_len)


# ------------------------------------------------------------------------------------ stage 1: rank


def rank(problem: Problem, kernels: Mapping[str, Kernel], ranking: DeviceRanking, failed: Mapping[str, str], *,
         policy: AccuracyPolicy) -> Ranked:
    """Stage 1: runnable kernels in ranker order, then unranked supported ones (``sdpa_default`` first);
    ``last_resort`` kernels never; `failed` (name -> why) dropped."""
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


# ------------------------------------------------------------------------------------ stage 2: fit

MIN_CHUNK = 16
"""Smallest query or key block `shrink_chunked` goes down to."""

RECHECK_FRACTION = 0.25
"""A decision whose workspace exceeds this fraction of free memory re-checks it on every call."""

FASTER_DID_NOT_FIT = "a faster kernel did not fit in the memory free now; dispatcher.reset() reconsiders it"


def memory_limit(free: int | None, budget: int | None) -> int | None:
    """The most workspace one call may use: the smaller of free memory and the budget."""
    return min((value for value in (free, budget) if value is not None), default=None)


def over_limit_reason(workspace: int, free: int | None, budget: int | None) -> str | None:
    """Why `workspace` bytes do not fit (None when they do)."""
    if budget is not None and workspace > budget:
        return f"needs {format_bytes(workspace)} of workspace, over the memory budget of {format_bytes(budget)}"
    if free is not None and workspace > free:
        return f"needs {format_bytes(workspace)} of workspace, only {format_bytes(free)} free on the device"
    return None


def needs_recheck(workspace: int, free: int | None) -> bool:
    """Re-check free memory on every call for this decision? (`RECHECK_FRACTION`)"""
    return free is not None and workspace > RECHECK_FRACTION * free


def workspace_bound(kernel: Kernel, problem: Problem) -> int:
    """`kernel`'s workspace without running a probe (`sdpa_default.probes_deferred`): never under the call's."""
    with probes_deferred():
        return int(kernel.workspace_bytes(problem))


def fit(ranked: Ranked, *, free: int | None, budget: int | None, ranking: DeviceRanking,
        failed: Mapping[str, str]) -> Fit:
    """Stage 2: options fitting free memory and the budget, else a shrunk chunked kernel; last-resort options last."""
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
    """The largest-chunked `ChunkedKernel` whose `bytes_needed` (default: workspace) fits `limit`, down to
    `MIN_CHUNK`; else None."""
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


# ------------------------------------------------------------------------------------ stage 3: nothing measured

UNMEASURED_LEVELS = ("prior", "none")
"""Ranking sources that measured nothing on this card."""

DEFAULT_KEPT_UNMEASURED = ("no table measured on this card: PyTorch's own choice (sdpa_default) runs wherever it fits "
                           "until the bucket's calls measured another kernel faster; the prior only orders the kernels "
                           "behind it")


def default_kept_first(kernel: Kernel, level: str) -> bool:
    """Whether stage 3 puts `kernel` first where it fits (stage 2): PyTorch's own choice (`is_default`), with nothing
    measured on this card (`level`)."""
    return level in UNMEASURED_LEVELS and is_default(kernel)


def keep_default_unmeasured(options: tuple[Option, ...], level: str) -> tuple[tuple[Option, ...], str | None]:
    """Stage 3: with nothing measured on this card, PyTorch's own choice first (`default_kept_first`), with a note
    (docs/RESULTS.md#h100-without-tables)."""
    if not any(default_kept_first(o.kernel, level) for o in options[1:]):
        return options, None
    return tuple(sorted(options, key=lambda o: not is_default(o.kernel))), DEFAULT_KEPT_UNMEASURED  # a stable sort


# ------------------------------------------------------------------------------------ stage 4: measured on calls

MIN_WIN_MARGIN = 0.03
"""A candidate replaces the baseline only when faster by more than this fraction (median of paired rounds)."""

RANKED_CANDIDATES = 2
"""The ranking's first choices measured besides the baseline (docs/RESULTS.md#ablations)."""

GPU_ALSO_MEASURED = "sdpa_flash"
"""Measured on a GPU bucket wherever it can run (docs/RESULTS.md#h200-grid)."""

SETUP_FREE_MEASURED = 1
"""Set-up-free options also measured where the baseline sets up per shape and flash cannot run."""

MAX_CANDIDATES = 7
"""Candidates of one bucket at most, the baseline included."""


def measuring_wanted(device: torch.device, *, entry_decides: bool, level: str) -> bool:
    """Whether a bucket measures on its calls: its device can be timed without waiting and no same-card entry decides
    it."""
    return clock_for(device) is not None and not (entry_decides and level in MEASURED_LEVELS)


def measured_candidates(options: tuple[Option, ...], device: torch.device, problem: Problem, *,
                        portable: bool = False, setup_s: Mapping[str, float] | None = None,
                        own_table: bool = True) -> tuple[Option, ...]:
    """The options a bucket measures on its calls, baseline first, then ranking order; empty when nothing to choose:

    - baseline: PyTorch's default where a contender, else the ranking's first (portable set);
    - the first `RANKED_CANDIDATES` others; GPU: `GPU_ALSO_MEASURED`; CPU: each own family's first
      (`own_family_options`);
    - where the baseline sets up per shape (`costly_setups` of `setup_s`, seconds by name): flash, else the first
      set-up-free option;
    - GPU decode with PyTorch's backends ranked by this card's own table (`own_table`): only the ranking's first,
      when not the default; ranked by the prior or another card's table, decode is measured like any shape.
    At most `MAX_CANDIDATES`."""
    setup_s = setup_s or {}
    sets_up = costly_setups(setup_s)
    default = next((option for option in options if is_default(option.kernel)), None)
    baseline = options[0] if portable or default is None else default
    others = [option for option in options if option is not baseline]
    if device.type == "cuda" and problem.q_len == 1 and not portable and own_table:
        picked = [options[0]] if options[0] is not baseline else []
    else:
        picked = others[:RANKED_CANDIDATES]
        if device.type == "cuda":
            picked += [option for option in others if option.kernel.name == GPU_ALSO_MEASURED]
        elif device.type == "cpu":
            picked += own_family_options(others, [baseline, *picked])
    if baseline.kernel.name in sets_up:
        free = [option for option in others if option.kernel.name not in sets_up]
        picked += [option for option in free if option.kernel.name == GPU_ALSO_MEASURED] or free[:SETUP_FREE_MEASURED]
    names = {option.kernel.name for option in picked}
    chosen = (baseline, *(option for option in others if option.kernel.name in names))[:MAX_CANDIDATES]
    return chosen if len(chosen) > 1 else ()


def own_family_options(options: list[Option], picked: list[Option]) -> list[Option]:
    """The first option of each of our own kernel families that `picked` lacks, in ranking order."""
    families = {working_family(option.kernel) for option in picked}
    chosen = []
    for option in options:
        family = working_family(option.kernel)
        if not uses_fused_backend(option.kernel) and family not in families:
            families.add(family)
            chosen.append(option)
    return chosen


def measured_order(options: tuple[Option, ...], tuned: Tuned | None) -> tuple[tuple[Option, ...], dict[str, float]]:
    """Stage 4: `tuned`'s kernel first (when among `options`) with its seconds; else `options` and no seconds."""
    if tuned is None or not any(option.kernel.name == tuned.kernel for option in options):
        return options, {}
    return put_first(options, tuned.kernel), dict(tuned.seconds)


def decide(problem: Problem, *, kernels: Mapping[str, Kernel], policy: AccuracyPolicy, ranking: DeviceRanking,
           failed: Mapping[str, str], free: int | None, budget: int | None, tuned: Tuned | None,
           measure: bool, device: torch.device, portable: bool,
           cold_costs: Mapping[str, Mapping[str, float]], notice: str | None = None) -> Selection:
    """Stages 1-4 for `problem`'s bucket; `NoKernelError` when nothing fits. `free`/`budget`: bytes (None:
    unknown/none); `tuned`: the bucket's earlier result; `portable`: the default is a last resort; `cold_costs`:
    `models.probe_store`."""
    ranked = rank(problem, kernels, ranking, failed, policy=policy)
    fitted = fit(ranked, free=free, budget=budget, ranking=ranking, failed=failed)
    if not fitted.options:
        raise NoKernelError.nothing_fits(ranked, fitted, str(device), free=free, budget=budget)
    options, notes = fitted.options, fitted.notes
    options, kept = keep_default_unmeasured(options, ranking.source.level)
    notes = (*notes, *(line for line in (kept, notice) if line is not None))
    options, seconds = measured_order(options, tuned)
    candidates: tuple[Option, ...] = ()
    if seconds:
        notes = (*notes, tuned.note())
    elif measure and measuring_wanted(device, entry_decides=ranking.entry_decides(problem), level=ranking.source.level):
        measured, doubt = ranking.measured_note(problem), ranking.entry_doubt(problem)
        if measured is not None and doubt is not None:  # an entry that does not decide: say why
            notes = (*notes, f"{measured}: {doubt}")
        candidates = measured_candidates(options, device, problem, portable=portable,
                                         setup_s=first_call_setups(options, problem, cold_costs),
                                         own_table=ranking.source.level in MEASURED_LEVELS)
        if candidates:  # the baseline serves until the measuring decides (`measuring.Trial`)
            options = put_first(options, candidates[0].kernel.name)
    return Selection(ranked, options, (*fitted.dropped, *ranked.dropped), notes, seconds, candidates)


# ------------------------------------------------------------------------------------ stage 5: set-up cost

CUDNN_COLD_SHAPE_PRIOR_S = 8e-3
"""cuDNN's unmeasured first-call set-up at a new shape (docs/RESULTS.md#per-shape-set-up-costs)."""

MATERIAL_SETUP_S = 1e-3
"""A per-shape set-up worth timing another kernel against (docs/RESULTS.md#per-shape-set-up-costs)."""

MIN_SHAPES_OF_HISTORY = 1
"""Earlier exact shapes needed before a bucket's calls per shape are estimated."""

HISTORY = 8
"""Recent exact shapes whose median call count estimates the next one's."""

TIED_LOSS_SHARE = 0.05
"""Least per-call loss assumed for a kernel run in place of the decided one, as a share of its time."""

SETTLED = ("this exact shape has been called often enough to pay the chosen kernel's per-shape set-up "
           "(selection.settle_after): it now runs the bucket's decided kernel")


def cold_kernel_family(kernel: Kernel, problem: Problem) -> str | None:
    """The backend making `kernel` pay a per-shape set-up (``"sdpa_cudnn"``), through defaults and conversions; else
    None."""
    inner = getattr(kernel, "inner", None)
    if inner is not None:
        return cold_kernel_family(inner, problem)
    family = kernel.family
    if family == "sdpa_default" and problem.device_type == "cuda":
        family = default_backend_choice(problem)
    return family if family == "sdpa_cudnn" and problem.device_type == "cuda" else None


def cold_seconds(kernel: Kernel, problem: Problem, measured: Mapping[str, Mapping[str, float]]) -> float:
    """First-call set-up seconds at a new exact shape: `shape_setup_seconds` plus `compile_seconds`."""
    return shape_setup_seconds(kernel, problem, measured) + compile_seconds(kernel, problem)


def shape_setup_seconds(kernel: Kernel, problem: Problem, measured: Mapping[str, Mapping[str, float]]) -> float:
    """Per-shape set-up seconds: measured on this card, else the paying backend's prior, else 0."""
    kind = kind_of(problem.q_len)
    by_kind = measured.get(kernel.name)
    if by_kind is not None and kind in by_kind:
        return by_kind[kind]
    family = cold_kernel_family(kernel, problem)
    if family is None:
        return 0.0
    return measured.get(family, {}).get(kind, CUDNN_COLD_SHAPE_PRIOR_S)


def first_call_setups(options: Iterable[Option], problem: Problem,
                      measured: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Each option's first-call set-up seconds at a new exact shape (`cold_seconds`), by kernel name."""
    return {o.kernel.name: cold_seconds(o.kernel, problem, measured) for o in options}


def costly_setups(setup_s: Mapping[str, float]) -> frozenset[str]:
    """Names whose set-up (`first_call_setups`) is at least `MATERIAL_SETUP_S`."""
    return frozenset(name for name, seconds in setup_s.items() if seconds >= MATERIAL_SETUP_S)


def calls_per_shape(counts: Iterable[int]) -> float | None:
    """Median calls the bucket's earlier exact shapes got (None: too little history)."""
    history = [count for count in counts if count > 0]
    if len(history) < MIN_SHAPES_OF_HISTORY:
        return None
    return float(statistics.median(history))


def expected_seconds(warm_s: float | None, cold_s: float, expected_calls: float | None) -> float | None:
    """Per-call seconds over a shape's life: warm time plus set-up over the expected calls; None when unknown."""
    extra = cold_s / expected_calls if cold_s and expected_calls else 0.0
    if warm_s is None:
        return extra or None
    return warm_s + extra


def settle_after(cold_s: float, warm_first_s: float | None, warm_chosen_s: float | None) -> int:
    """Calls after which a shape moves to the set-up-paying kernel (0: never): once the loss matches the set-up (ski
    rental)."""
    if not cold_s or warm_first_s is None or warm_chosen_s is None:
        return 0
    loss = max(warm_chosen_s - warm_first_s, TIED_LOSS_SHARE * warm_first_s)
    if not (loss > 0 and math.isfinite(loss)):  # a zero or infinite (unpriced) time: nothing to weigh
        return 0
    return max(1, math.ceil(round(cold_s / loss, 6)))  # 1e-3 / 1e-6 is 1000.0000000000001


def floor_seconds(kernel: Kernel, floors: Mapping[str, Mapping[str, float]]) -> float | None:
    """`kernel`'s (or its family's) smallest measured back-to-back time; None if unmeasured or a fused backend."""
    if uses_fused_backend(kernel):
        return None
    inner = getattr(kernel, "inner", None)
    if inner is not None:  # a conversion: its own floor, else its inner kernel's (which it only adds to)
        own = floors.get(kernel.name)
        return min(own.values()) if own else floor_seconds(inner, floors)
    prefix = kernel.family + "["
    measured = [seconds for name, by_kind in floors.items() if name == kernel.name or name == kernel.family
                or name.startswith(prefix) for seconds in by_kind.values()]
    return min(measured) if measured else None


def new_shape_order(options: tuple[Option, ...], warm: Sequence[float | None], cold: Sequence[float],
                    measured: frozenset[str], history: Iterable[int], is_set_up: Callable[[str], bool],
                    floors: Mapping[str, Mapping[str, float]]) -> tuple[tuple[Option, ...], tuple[str, ...], int]:
    """Stage 5: options in try order for a new shape, notes, and the calls before it settles (0: never).

    A first option with an unpaid set-up (`is_set_up`) moves behind the option fastest over a shape's expected calls
    (`history`), until `settle_after`; only `may_replace_first` options may take its place."""
    if not cold or not cold[0]:
        return options, (), 0
    expected_calls = calls_per_shape(history)
    first = options[0]
    if expected_calls is None or is_set_up(first.kernel.name):
        return options, (), 0
    warm = [None if w is None else w if o.kernel.name in measured  # a floor bounds predictions only
            else max(w, floor_seconds(o.kernel, floors) or 0.0)
            for o, w in zip(options, warm, strict=True)]
    costs = [
        expected_seconds(w, 0.0 if c and is_set_up(o.kernel.name) else c, expected_calls)
        if i == 0 or may_replace_first(o, measured) else None
        for i, (o, w, c) in enumerate(zip(options, warm, cold, strict=True))
    ]
    best = min((i for i, cost in enumerate(costs) if cost is not None), key=costs.__getitem__, default=0)
    if best == 0:
        return options, (), 0
    chosen = options[best]
    settle = settle_after(cold[0], warm[0], warm[best])
    note = (f"{first.kernel.name} sets up per exact shape (~{format_seconds(cold[0])} on a new shape) and this "
            f"bucket's shapes get ~{expected_calls:g} calls each: {chosen.kernel.name} is faster over a shape's "
            f"life ({format_seconds(costs[best])} against {format_seconds(costs[0])} per call)")
    if settle:
        note += f"; a shape called {settle} times settles on {first.kernel.name}"
    return (chosen, *(o for o in options if o is not chosen)), (note,), settle


def compile_deferred_order(options: tuple[Option, ...], warm: Sequence[float | None], cold: Sequence[float],
                           compiling: float, measured: frozenset[str],
                           ) -> tuple[tuple[Option, ...], tuple[str, ...], int]:
    """Stage 5 when the first option would compile now (`compiling` s): the fastest set-up-free option runs first
    until its calls lost what the compile costs (`settle_after`); returns options, notes and those calls (0: decided
    order)."""
    if not compiling or warm[0] is None:
        return options, (), 0
    free = [i for i in range(1, len(options))
            if not cold[i] and warm[i] is not None and may_replace_first(options[i], measured)]
    if not free:
        return options, (), 0
    best = min(free, key=warm.__getitem__)
    calls = settle_after(compiling, warm[0], warm[best])
    if not calls:
        return options, (), 0
    first, chosen = options[0], options[best]
    note = (f"{first.kernel.name} compiles on its first run in this process (~{format_seconds(compiling)}): "
            f"{chosen.kernel.name} runs until this bucket's calls have lost that much to it ({calls} calls)")
    return (chosen, *(o for o in options if o is not chosen)), (note,), calls


def may_replace_first(option: Option, measured: frozenset[str]) -> bool:
    """Whether `option` may replace the decided kernel on a new shape: any, or only measured ones where any were."""
    return not measured or option.kernel.name in measured
