"""`Decision` (what `explain` returns and the log prints), free memory (`free_bytes`), `NoKernelError`, the
lossy-conversion note (`with_lossy_gain`) and the decision log (INFO when ``ATTN_DISPATCH_LOG=1``, else DEBUG;
fallbacks WARNING)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from attn_dispatch.kernels import AccuracyPolicy, Kernel, Problem
from attn_dispatch.kernels.convert import ConvertKernel
from attn_dispatch.models.environment import (  # noqa: F401 (public here too: `ad.parse_memory_size`, `format_bytes`)
    LOG,
    MAX_MEMORY_BUDGET,
    MEMORY_BUDGET,
    format_bytes,
    parse_memory_size,
)
from attn_dispatch.models.identity import CardSpec
from attn_dispatch.models.priors import kernel_named, prior_seconds

ROUTE_DISPATCH = "dispatch"
ROUTE_TRAINING = "training"
TRAINING_KERNEL = "pytorch_sdpa"
"""What runs on the training route: PyTorch's own `scaled_dot_product_attention`, unchanged."""


@dataclass(frozen=True)
class Candidate:
    """A kernel that can run the problem and fits in memory, with its predicted time."""

    name: str
    predicted_s: float | None
    workspace_bytes: int

    def to_dict(self) -> dict:
        return {"name": self.name, "predicted_s": self.predicted_s, "workspace_bytes": self.workspace_bytes}


@dataclass(frozen=True)
class RankingSource:
    """Where the predicted times came from. `level`: ``"exact" | "model" | "family"`` (a table at that lookup level),
    ``"prior"`` (the card's analytic prior) or ``"none"`` (kernel order)."""

    level: str
    description: str
    path: str | None = None
    identity: str | None = None
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"level": self.level, "description": self.description, "path": self.path,
                "identity": self.identity, "warnings": list(self.warnings)}


@dataclass(frozen=True)
class Decision:
    """The kernel that runs a problem on a device, and why.

    `route`: ``"dispatch"`` or ``"training"`` (dropout or inputs requiring grad: PyTorch's SDPA unless the kernel
    supports backward; `kernel` is then ``"pytorch_sdpa"``). `candidates`: what runs and fits, in try order, the
    chosen first; `dropped`: ``(name, reason)`` for every other kernel; `free_bytes` / `budget_bytes`: the limits
    decided under (None: unknown / none)."""

    kernel: str
    params: dict
    problem: Problem
    device: str
    source: RankingSource
    route: str = ROUTE_DISPATCH
    candidates: tuple[Candidate, ...] = ()
    dropped: tuple[tuple[str, str], ...] = ()
    free_bytes: int | None = None
    budget_bytes: int | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def predicted_s(self) -> float | None:
        return next((c.predicted_s for c in self.candidates if c.name == self.kernel), None)

    def reason_dropped(self, name: str) -> str | None:
        return dict(self.dropped).get(name)

    def summary(self, *, source: bool = True) -> str:
        """One line: device, shape, kernel, predicted time and (`source`) what ranked it."""
        p = self.problem
        shape = (
            f"B={p.batch} Hq={p.q_heads} Hkv={p.kv_heads} Lq={p.q_len} Lk={p.kv_len} D={p.head_dim} "
            f"{p.dtype}{' causal' if p.causal else ''}{'' if p.mask_kind == 'none' else ' mask=' + p.mask_kind}"
        )
        predicted = format_seconds(self.predicted_s)
        ranked = f"; {self.source.description}" if source else ""
        return f"{self.device} [{shape}] -> {self.kernel} (predicted {predicted}{ranked})"

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "params": dict(self.params), "route": self.route,
                "device": self.device, "problem": self.problem.to_dict(), "source": self.source.to_dict(),
                "candidates": [c.to_dict() for c in self.candidates],
                "dropped": [{"name": name, "reason": reason} for name, reason in self.dropped],
                "free_bytes": self.free_bytes, "budget_bytes": self.budget_bytes, "notes": list(self.notes)}

    def __str__(self) -> str:
        lines = [f"attention on {self.device}: {self.summary(source=False)}"]  # the source has its own line
        if self.route == ROUTE_TRAINING:
            lines.append("  route: training (dropout or inputs requiring grad)")
        lines.append(f"  ranked by: {self.source.description}")
        if self.source.path:
            lines.append(f"  table: {self.source.path} (lookup level: {self.source.level})")
        lines.append(f"  memory: free {format_bytes(self.free_bytes)}, budget "
                     f"{format_bytes(self.budget_bytes) if self.budget_bytes is not None else 'none'}")
        lines.append(f"  candidates, in the order they are tried{self._order_remark()}:")
        width = max((len(c.name) for c in self.candidates), default=0)
        for rank, candidate in enumerate(self.candidates, 1):
            lines.append(f"    {rank:2d}. {candidate.name:<{width}}  "
                         f"{format_seconds(candidate.predicted_s):>10}  workspace "
                         f"{format_bytes(candidate.workspace_bytes)}")
        if self.dropped:
            lines.append("  dropped:")
            by_reason: dict[str, list[str]] = {}
            for name, reason in self.dropped:
                by_reason.setdefault(reason, []).append(name)
            lines.extend(f"    {_compact(names)}: {reason}" for reason, names in by_reason.items())
        for note in (*self.notes, *self.source.warnings):
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def _order_remark(self) -> str:
        """Where the first candidate is not the fastest predicted: which one is, and where the reason is written."""
        timed = [c for c in self.candidates if c.predicted_s is not None]
        if not self.candidates or self.candidates[0].predicted_s is None or not timed:
            return ""
        first, fastest = self.candidates[0], min(timed, key=lambda c: c.predicted_s)
        if first.predicted_s <= fastest.predicted_s:
            return ""
        return f" ({first.name} first although {fastest.name} is predicted faster: the ranked-by line or a note says why)"


def format_seconds(seconds: float | None) -> str:
    """``1.2e-5`` -> ``"12.0 us"``; None -> ``"unknown"``."""
    if seconds is None:
        return "unknown"
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= factor:
            return f"{seconds / factor:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


MAX_INNER_NAMED = 3
"""A conversion over more inner kernels than this is listed with their count, not their names."""


def _compact(names: list[str]) -> str:
    """``["convert[x]+a", "convert[x]+b", "math"]`` -> ``"convert[x]+{a, b}, math"``; more than `MAX_INNER_NAMED`
    inner kernels -> ``"convert[x]+{7 kernels}"``."""
    by_prefix: dict[str, list[str]] = {}
    for name in names:
        prefix, plus, inner = name.partition("]+")
        key, rest = (prefix + plus, inner) if plus else (name, "")
        by_prefix.setdefault(key, []).append(rest)

    def inner_text(inners: list[str]) -> str:
        if len(inners) == 1:
            return inners[0]
        return "{" + (", ".join(inners) if len(inners) <= MAX_INNER_NAMED else f"{len(inners)} kernels") + "}"

    return ", ".join(key + inner_text(inners) for key, inners in by_prefix.items())


# memory

MEMINFO_PATH = "/proc/meminfo"


def free_bytes(device: torch.device) -> int | None:
    """Bytes a new allocation on `device` can get now (GPU: driver free plus cached-unused; CPU: ``MemAvailable``)."""
    if device.type == "cuda":
        return _cuda_free_bytes(device)
    if device.type == "cpu":
        return _cpu_available_bytes()
    backend = getattr(torch, device.type, None)
    mem_get_info = getattr(backend, "mem_get_info", None)
    if mem_get_info is None:
        return None
    try:
        return int(mem_get_info(device)[0])
    except (RuntimeError, TypeError, ValueError):
        return None


def _cuda_free_bytes(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    free, _total = torch.cuda.mem_get_info(index)
    stats = torch.cuda.memory_stats(index)  # one call for both counters (each getter builds this dict)
    cached_unused = stats.get("reserved_bytes.all.current", 0) - stats.get("allocated_bytes.all.current", 0)
    return int(free + max(cached_unused, 0))


def _cpu_available_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError), open(MEMINFO_PATH) as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file counts kB (KiB)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def release_cached_memory(device: torch.device) -> None:
    """Give the caching allocator's unused blocks back (after an out-of-memory error)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
        return
    backend = getattr(torch, device.type, None)
    empty_cache = getattr(backend, "empty_cache", None)
    if empty_cache is not None:
        with contextlib.suppress(RuntimeError):
            empty_cache()


# the error an attention call raises when no kernel can run it: the cause first, then the problem


class NoKernelError(RuntimeError):
    """No kernel can run the problem (each unsupported, over the memory limit or failed). `reasons`: ``(kernel,
    why)`` for every kernel; `cause`: the message's first line (why, and the fix)."""

    def __init__(self, problem: Problem, device: str, reasons: Sequence[tuple[str, str]], *,
                 smallest: tuple[str, int] | None = None, budget: int | None = None,
                 free: int | None = None) -> None:
        """`smallest`: (kernel, workspace) needing least when all were dropped for memory; `budget`, `free`: limits."""
        self.problem = problem
        self.device = device
        self.reasons = tuple(reasons)
        self.cause = _cause(device, self.reasons, smallest, budget, free)
        if smallest is not None and (_over(smallest, budget) or _over(smallest, free)):
            over = sum("of workspace" in why for _, why in self.reasons)
            details = (f"  {over} kernels need more workspace than that; the other {len(self.reasons) - over} do "
                       f"not support this problem here (NoKernelError.reasons lists every kernel's reason)")
        else:
            details = "\n".join(f"  {name}: {why}" for name, why in self.reasons)
        super().__init__(f"{self.cause}\n  problem: {problem} on {device}\n{details}")

    @classmethod
    def nothing_fits(cls, ranked, fit, device: str, *, free: int | None, budget: int | None) -> NoKernelError:
        """The error for a `selection.Ranked` whose `selection.Fit` kept no option."""
        return cls(ranked.problem, device, ranked.dropped + fit.dropped, smallest=smallest_workspace(ranked),
                   budget=budget, free=free)


def smallest_workspace(ranked) -> tuple[str, int] | None:
    """(name, workspace bytes) of the `selection.Ranked` option needing least, counting the chunked kernel at
    `selection.MIN_CHUNK` chunks (ties by name); None when nothing supports the problem."""
    from attn_dispatch.dispatcher.selection import MIN_CHUNK
    from attn_dispatch.kernels import ChunkedKernel

    sizes = [(option.kernel.name, int(option.workspace_bytes)) for option in ranked.options]
    tiniest = ChunkedKernel(q=MIN_CHUNK, kv=MIN_CHUNK)
    if sizes and not tiniest.reasons(ranked.problem):
        sizes.append((tiniest.name, int(tiniest.workspace_bytes(ranked.problem))))
    return min(sizes, key=lambda item: (item[1], item[0]), default=None)  # ties by name: one message whatever the ranking


BUDGET_FIX = f"raise {MEMORY_BUDGET.name} or Dispatcher(memory_budget=...)"
"""A `NoKernelError`'s fix over the memory budget, for Python users (the CLI names its flag)."""


def _over(smallest: tuple[str, int], limit: int | None) -> bool:
    return limit is not None and smallest[1] > limit


def _cause(device: str, reasons: Sequence[tuple[str, str]], smallest: tuple[str, int] | None,
           budget: int | None, free: int | None) -> str:
    """The first line of a `NoKernelError`: the real reason, then the fix."""
    if not reasons:
        return "no attention kernel can run this problem: the dispatcher has no kernels; pass kernels='all'"
    if smallest is not None and _over(smallest, budget):
        name, need = smallest
        return (f"no attention kernel fits the memory budget of {format_bytes(budget)}: the smallest workspace this "
                f"problem needs is {format_bytes(need)} ({name}); {BUDGET_FIX} to at least that")
    if smallest is not None and _over(smallest, free):
        name, need = smallest
        return (f"no attention kernel fits in the {format_bytes(free)} free on {device}: the smallest workspace this "
                f"problem needs is {format_bytes(need)} ({name}); free device memory or split the batch")
    return (f"no attention kernel in this dispatcher's set can run this problem on {device} (first reason: "
            f"{reasons[0][0]}: {reasons[0][1]}); pass a kernel set that includes one for it")


# a lossy conversion the caller has not allowed, and what the analytic prior says it would gain

NOTED_CONVERSIONS = ("bf16->fp16", "fp16->bf16")
"""Lossy conversions whose gain `explain` states: between the half dtypes, gaining the card's rate, not memory."""
MIN_GAIN = 1.25
"""Least predicted speed-up worth a note (the prior's margin, `models.priors.FORCED_BACKEND_FACTOR`)."""
RANGE_LOSS = {
    "bf16->fp16": "fp16's range ends at 65504 where bf16's reaches 3.4e38: larger activations overflow to inf",
    "fp16->bf16": "bf16 keeps 8 bits of mantissa where fp16 keeps 11: about 3 significant digits fewer",
}


def lossy_gain_note(decision: Decision, spec: CardSpec | None, policy: AccuracyPolicy) -> str | None:
    """An `explain` line when a `NOTED_CONVERSIONS` conversion `policy` disallows was dropped, could run, and
    `spec`'s prior predicts it `MIN_GAIN` times faster than the chosen kernel; else None."""
    if spec is None:
        return None
    problem = decision.problem
    try:
        chosen_s = prior_seconds(problem, kernel_named(decision.kernel), spec)
    except ValueError:  # the training route's PyTorch call, or a kernel that is not ours
        return None
    best: tuple[float, Kernel] | None = None
    for name, _ in decision.dropped:
        kernel = _noted_conversion(name)
        if kernel is None or policy.allows(kernel.source, kernel.target) or kernel.reasons(problem):
            continue  # not ours or not noted, allowed (dropped for another reason), or its inner cannot run
        seconds = prior_seconds(problem, kernel, spec)
        if best is None or seconds < best[0]:
            best = (seconds, kernel)
    if best is None or chosen_s < MIN_GAIN * best[0]:
        return None
    seconds, kernel = best
    return (f"{kernel.name} would take {format_seconds(seconds)} against {format_seconds(chosen_s)} for "
            f"{decision.kernel}, {chosen_s / seconds:.1f}x faster (predicted by the analytic prior of {spec.name}, "
            f"unmeasured); it stays off because {kernel.conversion} is lossy ({RANGE_LOSS[kernel.conversion]}): "
            f"opt in with --allow-lossy {kernel.conversion} (AccuracyPolicy.allowing({kernel.conversion!r}))")


def with_lossy_gain(decision: Decision, prior: object, policy: AccuracyPolicy) -> Decision:
    """`decision` with `lossy_gain_note` added when there is one (`prior`: a `models.priors.PriorRanker` or None)."""
    note = lossy_gain_note(decision, getattr(prior, "spec", None), policy)
    return decision if note is None else replace(decision, notes=(*decision.notes, note))


def _noted_conversion(name: str) -> ConvertKernel | None:
    """Kernel `name` (every conversion allowed) when it converts by a `NOTED_CONVERSIONS`; else None."""
    try:
        kernel = kernel_named(name)
    except ValueError:
        return None
    if isinstance(kernel, ConvertKernel) and kernel.source is not None and kernel.conversion in NOTED_CONVERSIONS:
        return kernel
    return None


MAX_MESSAGE = 200
"""Characters of a failure's message kept in `explain`."""


def failure_message(error: BaseException) -> str:
    """``"RuntimeError: first line of the message"``."""
    text = str(error).strip().splitlines()
    first = text[0][:MAX_MESSAGE] if text else ""
    return f"{type(error).__name__}: {first}"


# logging: each new decision once, every run-time fallback as a WARNING

logger = logging.getLogger("attn_dispatch")
_TOP_CANDIDATES = 3  # candidates shown in the one-line log of a decision (explain shows them all)


def _ensure_handler() -> None:
    """Give the logger a stderr INFO handler when nothing would print its records."""
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)


def _decision_level() -> int:
    """The level a new decision is logged at: INFO with ``ATTN_DISPATCH_LOG=1`` (a handler made sure of), else DEBUG."""
    if LOG.read():
        _ensure_handler()
        return logging.INFO
    return logging.DEBUG


def decision_logged() -> bool:
    """Whether `log_decision` prints (a caller may then skip making the decision it would log)."""
    return logger.isEnabledFor(_decision_level())


def log_decision(decision: Decision) -> None:
    level = _decision_level()
    if not logger.isEnabledFor(level):
        return
    others = ", ".join(c.name for c in decision.candidates[1:_TOP_CANDIDATES + 1]) or "none"
    logger.log(level, "%s; next: %s; %d kernels dropped", decision.summary(), others, len(decision.dropped))
    logger.debug("%s", decision)


def log_fallback(failed: str, error: BaseException, replacement: str) -> None:
    logger.warning("%s raised %s; falling back to %s (remembered for problems of this size)", failed,
                   failure_message(error), replacement)


def log_settled(kernel: str, previous: str, calls: int) -> None:
    """An exact shape called `calls` times moves from `previous` to `kernel` (`selection.settle_after`)."""
    logger.log(_decision_level(),
               "a shape called %d times now runs %s instead of %s (its per-shape set-up pays off)",
               calls, kernel, previous)
