"""The threshold table: a card's decisions, small enough to share, safe to load.

Per problem class (`models.buckets.ClassKey`) a decision map over (log2 Lq, log2 Lk) buckets
holds the top candidates with predicted seconds (and measured seconds where a bucket was
measured), plus readable crossover thresholds. The JSON form is documented in
docs/TABLE_FORMAT.md and validated by `models.table_schema`; files are read and written by
`models.table_io`. A table is a ranker: ``rank(problem, kernels)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from kernels.base import Kernel
from kernels.problem import Problem
from models.buckets import WORK_STEP, ClassKey, bucket_of, class_key
from models.cards import CardSpec
from models.identity import DeviceIdentity
from models.priors import PriorRanker, prior_seconds

FORMAT_VERSION = 1
TABLE_KIND = "attn-dispatch threshold table"
Candidate = tuple[str, float]


@dataclass(frozen=True)
class Cell:
    """One (q bucket, kv bucket) of a class: ranked candidates and what was measured there."""

    ranking: tuple[Candidate, ...]
    measured: tuple[Candidate, ...] = ()
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)
    excluded: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Threshold:
    """Where one kernel wins inside a class: a bounding box of buckets, in words too."""

    kernel: str
    q_log2: tuple[int, int]
    kv_log2: tuple[int, int]
    cells_won: int
    cells_in_box: int
    text: str


@dataclass(frozen=True)
class Template:
    """The batch / head counts the cells' predictions were made for (lengths vary per cell)."""

    batch: int
    q_heads: int
    kv_heads: int
    value_dim: int


@dataclass(frozen=True)
class TableClass:
    key: ClassKey
    template: Template
    cells: dict[tuple[int, int], Cell]
    thresholds: tuple[Threshold, ...] = ()

    def problem_at(self, bucket: tuple[int, int], device_type: str) -> Problem:
        """The problem a cell's predictions describe."""
        k, t = self.key, self.template
        return Problem(
            t.batch, t.q_heads, t.kv_heads, 2 ** bucket[0], 2 ** bucket[1], k.head_dim, t.value_dim,
            k.dtype, k.causal, k.mask_kind, (1, 1, 2 ** bucket[0], 2 ** bucket[1]) if k.mask_kind != "none" else (),
            device_type,
        )

    def nearest_cell(self, bucket: tuple[int, int]) -> tuple[tuple[int, int], Cell]:
        """The cell of `bucket`, else the closest one (squared bucket distance, then smaller)."""
        if bucket in self.cells:
            return bucket, self.cells[bucket]
        best = min(self.cells, key=lambda b: ((b[0] - bucket[0]) ** 2 + (b[1] - bucket[1]) ** 2, b))
        return best, self.cells[best]


@dataclass(frozen=True)
class Provenance:
    identity: DeviceIdentity
    created: str
    points_measured: int
    calibration_wall_s: float | None = None
    software: dict[str, str] = field(default_factory=dict)
    merged_from: tuple[DeviceIdentity, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def identities(self) -> tuple[DeviceIdentity, ...]:
        """Every card whose measurements went into the table."""
        return (self.identity, *self.merged_from)


@dataclass(frozen=True)
class ThresholdTable:
    """A card's decision table (see module docstring).

    Attributes
    ----------
    provenance: which card, software and calibration it comes from.
    spec: the card spec whose prior ranks kernels the table does not list.
    quality: the cost model's held-out quality (`models.quality.Quality.to_dict`).
    classes: decision maps by class.
    work_step: width of the work-size buckets the classes were built with.
    """

    provenance: Provenance
    spec: CardSpec
    quality: dict[str, float | int | str | None]
    classes: dict[ClassKey, TableClass]
    work_step: int = WORK_STEP
    format_version: int = FORMAT_VERSION

    @property
    def identity(self) -> DeviceIdentity:
        return self.provenance.identity

    # ------------------------------------------------------------------ ranking
    def find_class(self, problem: Problem) -> TableClass | None:
        """The problem's class, else the same class at the nearest work size, else None."""
        key = class_key(problem, work_step=self.work_step)
        if key in self.classes:
            return self.classes[key]
        same = [k for k in self.classes if k.base() == key.base()]
        if not same:
            return None
        return self.classes[min(same, key=lambda k: (abs(k.work_log2 - key.work_log2), k.work_log2))]

    def rank(self, problem: Problem, kernels: Iterable[Kernel]) -> list[tuple[str, float]]:
        """Supported kernels of `kernels` with predicted seconds: the table's candidates for the
        problem's bucket first (fastest first, times carried from the bucket's representative
        problem to this one by the prior's ratio), then every other supported kernel ranked by
        the prior. Classes the table lacks are ranked by the prior alone."""
        kernels = list(kernels)
        prior = PriorRanker(self.spec)
        table_class = self.find_class(problem)
        if table_class is None:
            return prior.rank(problem, kernels)
        by_name = {kernel.name: kernel for kernel in kernels}
        bucket, cell = table_class.nearest_cell(bucket_of(problem))
        template = table_class.problem_at(bucket, problem.device_type)
        listed = []
        for name, seconds in cell.ranking:
            kernel = by_name.get(name)
            if kernel is None or kernel.reasons(problem):
                continue
            ratio = prior_seconds(problem, kernel, self.spec) / prior_seconds(template, kernel, self.spec)
            listed.append((name, seconds * ratio if math.isfinite(ratio) and ratio > 0 else seconds))
        listed.sort(key=lambda item: (item[1], item[0]))
        names = {name for name, _ in listed}
        return listed + prior.rank(problem, [k for k in kernels if k.name not in names])

    # ------------------------------------------------------------------ transforms
    def scaled(self, factor: float, *, spec: CardSpec, note: str) -> ThresholdTable:
        """A copy with every predicted and measured time multiplied by `factor` and ranked by
        `spec`'s prior (a table of one card serving another of its family)."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale factor must be a finite positive number, got {factor}")

        def scale(entries):
            return tuple((name, seconds * factor) for name, seconds in entries)

        classes = {
            key: replace(table_class, cells={
                bucket: replace(
                    cell, ranking=scale(cell.ranking), measured=scale(cell.measured),
                    spread={n: (lo * factor, hi * factor) for n, (lo, hi) in cell.spread.items()},
                )
                for bucket, cell in table_class.cells.items()
            })
            for key, table_class in self.classes.items()
        }
        provenance = replace(self.provenance, notes=(*self.provenance.notes, note))
        return replace(self, classes=classes, spec=spec, provenance=provenance)

    def to_dict(self) -> dict:
        from models.table_io import table_to_dict

        return table_to_dict(self)

    @classmethod
    def from_dict(cls, data: object) -> ThresholdTable:
        """Validate and build (raises `models.table_schema.TableError`)."""
        from models.table_schema import table_from_dict

        return table_from_dict(data)
