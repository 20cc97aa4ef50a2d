"""Problem classes, length buckets, and measured decisions (docs/TABLE_FORMAT.md).

A class (`ClassKey`): dtype, causality, mask kind and, per table (``class_fields``), head dim, GQA
ratio and work size ``log2(batch * q_heads)``. A bucket is ``(ceil(log2 Lq), ceil(log2 Lk))``.
A `MeasuredEntry` is one exact bucket (`entry_key`, the dispatcher's per-bucket key) with each
timed kernel's median, spread and samples, consulted before any model. Its `winner`: the fastest
median, unless spreads overlap: then ``sdpa_default`` if tied, else the one with more samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from attn_dispatch.kernels.problem import Problem

if TYPE_CHECKING:
    from attn_dispatch.models.measurement import Measurement

OPTIONAL_FIELDS = ("head_dim", "gqa_ratio", "work")
# Which optional fields tables split on by default: none (finer classes hold one measured problem
# each; docs/RESULTS.md#where-the-priors-constants-come-from).
DEFAULT_CLASS_FIELDS: tuple[str, ...] = ()
# Work-size buckets are this many powers of two wide when "work" is a class field (2: 1, 4, 16,
# 64, ... rows x heads).
WORK_STEP = 2


def length_bucket(length: int) -> int:
    """``ceil(log2(length))``; 0 for lengths 0 and 1."""
    return 0 if length <= 1 else math.ceil(math.log2(length))


def work_bucket(problem: Problem, *, step: int = WORK_STEP) -> int:
    """``log2(batch * q_heads)`` rounded up to a multiple of `step` (0 when step is 0)."""
    if step <= 0:
        return 0
    return step * math.ceil(length_bucket(problem.batch * problem.q_heads) / step)


@dataclass(frozen=True, order=True)
class ClassKey:
    """What a table's decision map is split by (0 in an optional field: any value)."""

    dtype: str
    causal: bool
    mask_kind: str
    head_dim: int = 0
    gqa_ratio: int = 0
    work_log2: int = 0

    def describe(self) -> str:
        parts = [self.dtype, "causal" if self.causal else "non-causal", f"mask {self.mask_kind}"]
        if self.head_dim:
            parts.append(f"head dim {self.head_dim}")
        if self.gqa_ratio:
            parts.append(f"GQA {self.gqa_ratio}")
        if self.work_log2:
            parts.append(f"batch x heads ~2^{self.work_log2}")
        return ", ".join(parts)

    def base(self) -> tuple[str, bool, str]:
        """The fields every table splits on."""
        return (self.dtype, self.causal, self.mask_kind)

    def distance(self, other: ClassKey, *, work_step: int) -> float:
        """How far apart two classes of one base are (log2 head dim, log2 GQA, and work buckets of
        `work_step` powers of two: the table's)."""
        return (
            abs(math.log2(max(self.head_dim, 1)) - math.log2(max(other.head_dim, 1)))
            + abs(math.log2(max(self.gqa_ratio, 1)) - math.log2(max(other.gqa_ratio, 1)))
            + abs(self.work_log2 - other.work_log2) / max(work_step, 1)
        )


def check_class_fields(fields: tuple[str, ...]) -> tuple[str, ...]:
    unknown = set(fields) - set(OPTIONAL_FIELDS)
    if unknown:
        raise ValueError(f"unknown class fields {sorted(unknown)}: choose among {OPTIONAL_FIELDS}")
    return tuple(f for f in OPTIONAL_FIELDS if f in fields)


def class_key(
    problem: Problem, *, fields: tuple[str, ...] = DEFAULT_CLASS_FIELDS, work_step: int = WORK_STEP
) -> ClassKey:
    """The class of `problem` in a table that splits on `fields`."""
    return ClassKey(
        problem.dtype, problem.causal, problem.mask_kind,
        head_dim=problem.head_dim if "head_dim" in fields else 0,
        gqa_ratio=problem.gqa_ratio if "gqa_ratio" in fields else 0,
        work_log2=work_bucket(problem, step=work_step) if "work" in fields else 0,
    )


def bucket_of(problem: Problem) -> tuple[int, int]:
    """``(q bucket, kv bucket)`` of a problem."""
    return length_bucket(problem.q_len), length_bucket(problem.kv_len)


DEFAULT_KERNEL = "sdpa_default"
"""PyTorch's own choice: what the user had before the dispatcher; it wins every tie."""

SPREAD_STANDARD_ERRORS = 2.0
"""A measured median's spread is +-2 standard errors (a two-sided ~95% interval), as
`models.quality.TIE_STANDARD_ERRORS` judges ties."""

MIN_RELATIVE_SPREAD = 0.01
"""... and at least +-1%: below what repeated calibrations of one point reproduce
(`models.quality.TIE_TOLERANCE`)."""

KERNELS_PER_ENTRY = 8
"""Times an entry keeps: the fastest 8 (plus PyTorch's default where timed): the winner and
fallbacks for memory; a tuned calibration times up to ~70 kernels a problem, the tail never wins."""

SOURCES = ("calibration", "tuning", "merged")
KEY_FIELDS = (
    "batch_log2", "q_heads", "kv_heads", "q_log2", "kv_log2", "head_dim", "value_dim", "dtype", "causal",
    "mask_kind", "mask_broadcast", "device_type", "strided", "broadcast_inputs",
)
"""The fields of `entry_key`, in order (the JSON names of a table's ``measured_entries[i].key``)."""


def entry_key(problem: Problem) -> tuple:
    """The exact bucket of `problem`: batch and lengths rounded up to powers of two (their
    exponents), the mask reduced to which of its dimensions broadcast, every other field exact.
    Equal to the dispatcher's per-bucket key (`dispatcher.selection.failure_bucket`), so a
    remembered tuning's bucket is an entry key."""
    return (
        length_bucket(problem.batch), problem.q_heads, problem.kv_heads,
        length_bucket(problem.q_len), length_bucket(problem.kv_len), problem.head_dim,
        problem.value_dim, problem.dtype, problem.causal, problem.mask_kind,
        tuple(size > 1 for size in problem.mask_shape), problem.device_type, problem.strided,
        problem.broadcast_inputs,
    )


@dataclass(frozen=True)
class MeasuredTime:
    """One kernel's measured seconds in an entry: median, spread ``[low, high]`` and how many
    timed samples (repetitions) stand behind it."""

    kernel: str
    median_s: float
    low_s: float
    high_s: float
    samples: int

    def overlaps(self, other: MeasuredTime) -> bool:
        """True when the two spreads overlap: the measurements cannot order the kernels."""
        return self.low_s <= other.high_s and other.low_s <= self.high_s

    def scaled(self, factor: float) -> MeasuredTime:
        return replace(self, median_s=self.median_s * factor, low_s=self.low_s * factor, high_s=self.high_s * factor)


def spread_of(median_s: float, relative_error: float) -> tuple[float, float]:
    """``(low, high)`` seconds: a factor of 1 + `SPREAD_STANDARD_ERRORS` relative standard errors
    either side (at least 1 + `MIN_RELATIVE_SPREAD`)."""
    factor = 1.0 + max(SPREAD_STANDARD_ERRORS * relative_error, MIN_RELATIVE_SPREAD)
    return median_s / factor, median_s * factor


def pick(times: Sequence[MeasuredTime]) -> str:
    """The winner of a set of measured times (see module docstring)."""
    fastest = min(times, key=lambda t: (t.median_s, t.kernel))
    tied = [t for t in times if t.overlaps(fastest)]
    if any(t.kernel == DEFAULT_KERNEL for t in tied):
        return DEFAULT_KERNEL
    return min(tied, key=lambda t: (-t.samples, t.median_s, t.kernel)).kernel


@dataclass(frozen=True)
class MeasuredEntry:
    """What was measured in one exact bucket: the measured problem's sizes (times carry from it by
    the prior's ratio), `times` fastest median first, `source` "calibration", "tuning" or "merged"."""

    key: tuple
    batch: int
    q_len: int
    kv_len: int
    times: tuple[MeasuredTime, ...]
    source: str = "calibration"

    @property
    def winner(self) -> str:
        return pick(self.times)

    @property
    def default_by_tie(self) -> bool:
        """PyTorch's default wins only because its spread overlaps a kernel with a faster median:
        the entry says the two cannot be told apart, not that the default is faster."""
        fastest = min(self.times, key=lambda t: (t.median_s, t.kernel))
        return fastest.kernel != DEFAULT_KERNEL and self.winner == DEFAULT_KERNEL

    def faster_than_default(self) -> tuple[str, ...]:
        """The kernels whose median is below PyTorch's default's (() where the default was not timed)."""
        default = next((t for t in self.times if t.kernel == DEFAULT_KERNEL), None)
        if default is None:
            return ()
        return tuple(t.kernel for t in self.times if t.median_s < default.median_s)

    def ordered(self) -> tuple[MeasuredTime, ...]:
        """The times with the winner first, then the others fastest first."""
        first = self.winner
        return tuple(sorted(self.times, key=lambda t: (t.kernel != first, t.median_s, t.kernel)))

    def problem(self) -> Problem:
        """The measured problem (mask sizes rebuilt from which dimensions broadcast)."""
        k = dict(zip(KEY_FIELDS, self.key, strict=True))
        sizes = (self.batch, k["q_heads"], self.q_len, self.kv_len)
        broadcast = k["mask_broadcast"]
        mask_shape = tuple(size if full else 1 for size, full in zip(sizes[len(sizes) - len(broadcast):], broadcast, strict=True))
        return Problem(
            self.batch, k["q_heads"], k["kv_heads"], self.q_len, self.kv_len, k["head_dim"], k["value_dim"],
            k["dtype"], k["causal"], k["mask_kind"], mask_shape, k["device_type"], k["strided"], k["broadcast_inputs"],
        )

    def scaled(self, factor: float) -> MeasuredEntry:
        return replace(self, times=tuple(t.scaled(factor) for t in self.times))


def combine(first: MeasuredEntry, second: MeasuredEntry) -> MeasuredEntry:
    """Two entries of one key (two owners, or two problems of one bucket): the union of their
    kernels; a kernel both measured keeps the median with more samples (tie: the first's) and a
    spread widened to cover both. Times are taken as they are (same card: no carrying)."""
    if first.key != second.key:
        raise ValueError("combine() needs two entries of the same key")
    by_name = {t.kernel: t for t in first.times}
    for other in second.times:
        mine = by_name.get(other.kernel)
        if mine is None:
            by_name[other.kernel] = other
            continue
        kept = other if other.samples > mine.samples else mine
        by_name[other.kernel] = MeasuredTime(
            kept.kernel, kept.median_s, min(mine.low_s, other.low_s), max(mine.high_s, other.high_s),
            mine.samples + other.samples,
        )
    times = _trimmed(by_name.values())
    source = first.source if first.source == second.source else "merged"
    return replace(first, times=times, source=source)


def union(entries: Iterable[MeasuredEntry]) -> dict[tuple, MeasuredEntry]:
    """Entries by key, those sharing a key combined (`combine`) in order."""
    out: dict[tuple, MeasuredEntry] = {}
    for entry in entries:
        out[entry.key] = combine(out[entry.key], entry) if entry.key in out else entry
    return out


def entries_from_measurements(measurements: Iterable[Measurement]) -> dict[tuple, MeasuredEntry]:
    """One entry per measured bucket from calibration's points (status "ok" only); a problem
    with fewer than two timed kernels decides nothing and makes no entry."""
    by_problem: dict[Problem, dict[str, MeasuredTime]] = {}
    for m in measurements:
        if not (m.ok and m.median_s > 0):
            continue
        low, high = spread_of(m.median_s, median_standard_error(m.median_s, m.iqr_s, m.reps))
        time = MeasuredTime(m.kernel, m.median_s, low, high, max(m.reps, 1))
        times = by_problem.setdefault(m.problem, {})
        if m.kernel in times:  # a point measured twice (a resumed run): combine as owners do
            time = combine(_single(m.problem, times[m.kernel]), _single(m.problem, time)).times[0]
        times[m.kernel] = time
    entries = [_single(problem, *times.values()) for problem, times in by_problem.items() if len(times) >= 2]
    return union(sorted(entries, key=lambda e: -sum(t.samples for t in e.times)))


def _trimmed(times: Iterable[MeasuredTime]) -> tuple[MeasuredTime, ...]:
    """The fastest `KERNELS_PER_ENTRY` times, fastest first, and PyTorch's default's if timed."""
    ordered = sorted(times, key=lambda t: (t.median_s, t.kernel))
    kept = ordered[:KERNELS_PER_ENTRY]
    return tuple(kept + [t for t in ordered[KERNELS_PER_ENTRY:] if t.kernel == DEFAULT_KERNEL])


def _single(problem: Problem, *times: MeasuredTime) -> MeasuredEntry:
    return MeasuredEntry(entry_key(problem), problem.batch, problem.q_len, problem.kv_len, _trimmed(times))


def entry_from_tuning(key: tuple, seconds: Sequence[tuple[str, float]], *, rounds: int) -> MeasuredEntry | None:
    """A remembered first-call tuning (`dispatcher.selection.Tuned.seconds` of bucket `key`) as an
    entry: each contender's median over `rounds` interleaved samples, its spread the minimum
    (`MIN_RELATIVE_SPREAD`: a tuning keeps no spread). Contenders that failed are left out;
    None when fewer than two ran. The bucket's sizes stand for the problem (lengths ``2^b``)."""
    finite = [(name, s) for name, s in seconds if math.isfinite(s) and s > 0]
    if len(finite) < 2:
        return None
    k = dict(zip(KEY_FIELDS, key, strict=True))
    times = _trimmed(MeasuredTime(name, s, *spread_of(s, 0.0), rounds) for name, s in finite)
    return MeasuredEntry(tuple(key), 2 ** k["batch_log2"], 2 ** k["q_log2"], 2 ** k["kv_log2"], times, "tuning")


# The median of n samples has standard error ~1.2533 sigma / sqrt(n) (normal samples), and
# sigma ~ IQR / 1.349: so ~0.93 IQR / sqrt(n).
MEDIAN_SE_PER_IQR = 1.2533 / 1.349


def median_standard_error(median_s: float, iqr_s: float, reps: int) -> float:
    """Relative standard error of a median time."""
    if median_s <= 0 or reps < 1:
        return 0.0
    return MEDIAN_SE_PER_IQR * (iqr_s / median_s) / math.sqrt(reps)
