"""The threshold table: a card's decisions, small enough to share, safe to load, and a ranker.
Per problem class, a decision map over (log2 Lq, log2 Lk) buckets with readable thresholds
(`models.thresholds`; docs/TABLE_FORMAT.md; validated by `models.table_schema`, read and written
by `models.table_io`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import tuned_siblings
from attn_dispatch.models._json_checks import LazySection, _spec_dict
from attn_dispatch.models.features import feature_matrix
from attn_dispatch.models.forest import EmbeddedModel, LazyModels
from attn_dispatch.models.identity import CardSpec, DeviceIdentity
from attn_dispatch.models.measured import (
    DEFAULT_CLASS_FIELDS,
    DEFAULT_KERNEL,
    WORK_STEP,
    ClassKey,
    MeasuredEntry,
    bucket_of,
    class_key,
    entry_key,
)
from attn_dispatch.models.priors import (
    UNPRICED,
    PriorRanker,
    kernel_named,
    priceable,
    prior_seconds,
    supported,
)
from attn_dispatch.models.quality import Guard

FORMAT_VERSION = 2
"""The one version read and written (version 1 is refused)."""
TABLE_KIND = "attn-dispatch threshold table"
Candidate = tuple[str, float]
# Measured statuses that bar a kernel from a bucket (it ran and was wrong, or it raised): a
# cell's ``excluded`` entries carry one of them.
EXCLUDING_STATUSES = ("inaccurate", "failed")


def quality_kind(key: str) -> str:
    """How a number of a table's ``quality`` section reads (`models.quality.Quality.to_dict`):
    "count" (``n_*``: a non-negative integer), "seed" (an integer), "fraction" (accuracies, in
    [0, 1]), "holdout_fraction" (in [0, 1]), "correlation" (Spearman, in [-1, 1]), "slowdown"
    (>= 0) or "number" (any other, >= 0). The schema checks by it and a merge pools by it."""
    if key.startswith("n_") or "_n_" in key:
        return "count"
    if key in ("seed", "holdout_fraction"):
        return key
    if "accuracy" in key or "within" in key:
        return "fraction"
    if "spearman" in key:
        return "correlation"
    return "slowdown" if "slowdown" in key else "number"


def carried_seconds(seconds: float, kernel: Kernel, source: Problem, target: Problem, spec: CardSpec) -> float:
    """`seconds` of `kernel` on `source`, carried to `target` by the ratio of their prior times on
    `spec`; unchanged when that ratio is not a finite positive number."""
    before = prior_seconds(source, kernel, spec)
    ratio = prior_seconds(target, kernel, spec) / before if math.isfinite(before) and before > 0 else math.nan
    return seconds * ratio if math.isfinite(ratio) and ratio > 0 else seconds


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
    """The batch, heads and head dims the cells' predictions were made for (lengths vary per
    cell): the most common layout among the class's measured problems."""

    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
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
            t.batch, t.q_heads, t.kv_heads, 2 ** bucket[0], 2 ** bucket[1], t.head_dim, t.value_dim,
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
    """Where a table's decisions come from. `timing_threads`: the torch intra-op threads a CPU
    calibration timed with (``calibrate --threads``); None where unknown (a GPU table, an older
    table, or a merge of tables timed with different counts)."""

    identity: DeviceIdentity
    created: str
    points_measured: int
    calibration_wall_s: float | None = None
    software: dict[str, str] = field(default_factory=dict)
    merged_from: tuple[DeviceIdentity, ...] = ()
    notes: tuple[str, ...] = ()
    timing_threads: int | None = None

    @property
    def identities(self) -> tuple[DeviceIdentity, ...]:
        """Every card whose measurements went into the table."""
        return (self.identity, *self.merged_from)


@dataclass(frozen=True)
class ThresholdTable:
    """A card's decision table (docs/TABLE_FORMAT.md names each field). `spec`'s prior ranks what
    the table does not list; `models` (one per card of a merge) predict exact problems; `entries`
    (by `entry_key`) are consulted first; `guard` is None for tables older than the guard. A loaded
    table may hold classes, models and entries unvalidated until first used (`models.table_io`).
    """

    provenance: Provenance
    spec: CardSpec
    quality: dict[str, float | int | str | None]
    classes: Mapping[ClassKey, TableClass]
    models: Sequence[EmbeddedModel] = ()
    class_fields: tuple[str, ...] = DEFAULT_CLASS_FIELDS
    work_step: int = WORK_STEP
    entries: Mapping[tuple, MeasuredEntry] = field(default_factory=dict)
    guard: Guard | None = None
    format_version: int = FORMAT_VERSION

    def __repr__(self) -> str:
        cells = sum(len(c.cells) for c in self.classes.values())
        return (
            f"ThresholdTable({self.identity.model_key!r}, {len(self.classes)} classes, {cells} buckets, "
            f"{len(self.entries)} measured entries, {len(self.models)} embedded models, "
            f"verdict {self.verdict!r}, created {self.provenance.created})"
        )

    @property
    def verdict(self) -> str:
        """What ranks outside measured entries: "table", "prior" or "default" (`models.quality`)."""
        return self.guard.verdict if self.guard is not None else "table"

    @property
    def identity(self) -> DeviceIdentity:
        return self.provenance.identity

    # ------------------------------------------------------------------ ranking
    def find_class(self, problem: Problem) -> TableClass | None:
        """The problem's class, else the nearest class of the same dtype, causality and mask kind
        (`ClassKey.distance`), else None."""
        key = class_key(problem, fields=self.class_fields, work_step=self.work_step)
        found = self.classes.get(key)
        if found is not None:
            return found
        keys = self.classes.listed() if isinstance(self.classes, LazySection) else self.classes
        same = sorted((k for k in keys if k.base() == key.base()), key=lambda k: (k.distance(key, work_step=self.work_step), k))
        return next((found for k in same if (found := self.classes.get(k)) is not None), None)

    @property
    def usable_models(self) -> tuple[EmbeddedModel, ...]:
        """The embedded models this attn-dispatch can evaluate: it computes every feature they read
        (`EmbeddedModel.compatible`)."""
        return tuple(model for model in self.models if model.compatible)

    def model_seconds(self, problems: Sequence[Problem], kernel_names: Sequence[str]) -> np.ndarray:
        """Predicted seconds of each (problem, kernel name) pair: the median over the usable models
        fitted with the kernel's family (features built once per distinct spec). A pair no model
        knows is priced by the prior carried onto the models' scale (`_prior_beside_models`).
        ValueError without a usable model."""
        models = self.usable_models
        if not models:
            raise ValueError("this table has no usable embedded cost model; rank by the analytic prior")
        features: list[tuple[dict, np.ndarray]] = []
        predictions = np.full((len(models), len(kernel_names)), np.nan)
        for index, model in enumerate(models):
            known = np.array([model.knows(name) for name in kernel_names], dtype=bool)
            if not known.any():
                continue
            spec = _spec_dict(model.spec)
            X = next((rows for seen, rows in features if seen == spec), None)
            if X is None:
                X = feature_matrix(problems, kernel_names, model.spec)
                features.append((spec, X))
            predictions[index, known] = model.seconds_from_features(X[known])
        priced = ~np.isnan(predictions).all(axis=0)
        seconds = np.empty(len(kernel_names))
        seconds[priced] = _column_medians(predictions[:, priced])
        if not priced.all():
            unknown = np.flatnonzero(~priced)
            seconds[unknown] = self._prior_beside_models([problems[row] for row in unknown],
                                                         [kernel_names[row] for row in unknown])
        return seconds

    def _prior_beside_models(self, problems: Sequence[Problem], kernel_names: Sequence[str]) -> np.ndarray:
        """The prior's seconds of kernels no embedded model knows, each times the models' seconds
        of PyTorch's default on its problem over the prior's (no factor where no model knows the
        default either)."""
        prior = np.array([prior_seconds(problem, kernel_named(name), self.spec)
                          for problem, name in zip(problems, kernel_names, strict=True)])
        if not any(model.knows(DEFAULT_KERNEL) for model in self.usable_models):
            return prior
        modelled = self.model_seconds(problems, [DEFAULT_KERNEL] * len(problems))
        default = kernel_named(DEFAULT_KERNEL)
        baseline = np.array([prior_seconds(problem, default, self.spec) for problem in problems])
        return prior * modelled / baseline

    def rank(self, problem: Problem, kernels: Iterable[Kernel]) -> list[tuple[str, float]]:
        """Supported kernels with predicted seconds, fastest first: the exact bucket's measured entry
        (`rank_measured`), then the rest as the guard's verdict says (`rank_unmeasured`)."""
        kernels = list(kernels)
        measured = self.rank_measured(problem, kernels)
        listed = {name for name, _ in measured}
        return measured + self.rank_unmeasured(problem, [k for k in kernels if k.name not in listed])

    def measured_entry(self, problem: Problem) -> MeasuredEntry | None:
        """The measured decision of `problem`'s exact bucket, if any."""
        return self.entries.get(entry_key(problem)) if self.entries else None

    def rank_measured(self, problem: Problem, kernels: Iterable[Kernel]) -> list[tuple[str, float]]:
        """The kernels the problem's measured entry timed that `kernels` holds (or tuned configurations of its
        families, `kernels.registry.tuned_siblings`) and can run here,
        the entry's winner first (`models.measured.pick`), seconds carried from the measured
        problem by the prior's ratio; empty without an entry."""
        entry = self.measured_entry(problem)
        if entry is None:
            return []
        kernels = [*kernels, *tuned_siblings((t.kernel for t in entry.times), kernels)]
        usable = {kernel.name: kernel for kernel in supported(problem, kernels) if priceable(kernel)}
        source = entry.problem()
        return [(t.kernel, carried_seconds(t.median_s, usable[t.kernel], source, problem, self.spec))
                for t in entry.ordered() if t.kernel in usable]

    def rank_unmeasured(self, problem: Problem, kernels: Iterable[Kernel]) -> list[tuple[str, float]]:
        """By the guard's verdict: the analytic prior ("prior"), PyTorch's default then the prior
        ("default"), else the embedded model (`rank_by_model`)."""
        kernels = list(kernels)
        if self.verdict != "table":
            ranked = PriorRanker(self.spec).rank(problem, kernels)
            return _default_first(ranked) if self.verdict == "default" else ranked
        table_class = self.find_class(problem)
        cell = table_class.nearest_cell(bucket_of(problem))[1] if table_class is not None else None
        return self.rank_by_model(problem, kernels, cell)

    def rank_by_model(self, problem: Problem, kernels: list[Kernel], cell: Cell | None) -> list[tuple[str, float]]:
        """Supported kernels priced by the embedded models (`model_seconds`) for this exact problem,
        less those calibration measured inaccurate or failing in `cell`; without a usable model, by
        the prior (the decision map ranked no better: docs/RESULTS.md#ablations)."""
        barred = {name for name, _ in cell.excluded} if cell is not None else set()
        usable = [kernel for kernel in supported(problem, kernels) if kernel.name not in barred]
        models = self.usable_models
        if not models:
            return PriorRanker(self.spec).rank(problem, usable)
        names = [kernel.name for kernel in usable if priceable(kernel)]
        foreign = [(kernel.name, UNPRICED) for kernel in usable if not priceable(kernel)]
        if not names:
            return foreign
        seconds = self.model_seconds([problem] * len(names), names)
        ranked = sorted(zip(names, (float(s) for s in seconds), strict=True), key=lambda item: (item[1], item[0]))
        return _prior_priced_behind_default(ranked, models) + foreign

    # ------------------------------------------------------------------ transforms
    def scaled(self, factor: float, *, spec: CardSpec, note: str) -> ThresholdTable:
        """A copy with every predicted and measured time multiplied by `factor` and ranked by
        `spec`'s prior (a table of one card serving another of its family)."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale factor must be a finite positive number, got {factor}")

        def scale(entries):
            return tuple((name, seconds * factor) for name, seconds in entries)

        def scale_class(table_class: TableClass) -> TableClass:
            return replace(table_class, cells={
                bucket: replace(
                    cell, ranking=scale(cell.ranking), measured=scale(cell.measured),
                    spread={n: (lo * factor, hi * factor) for n, (lo, hi) in cell.spread.items()},
                )
                for bucket, cell in table_class.cells.items()
            })

        provenance = replace(self.provenance, notes=(*self.provenance.notes, note))
        return replace(self, spec=spec, provenance=provenance, classes=_mapped(self.classes, scale_class),
                       models=_mapped(self.models, lambda model: model.scaled(factor)),
                       entries=_mapped(self.entries, lambda entry: entry.scaled(factor)))

    def with_entries(self, entries: Iterable[MeasuredEntry]) -> ThresholdTable:
        """A copy holding `entries` too (a key both hold: combined, `models.measured.union`)."""
        from attn_dispatch.models.measured import union

        return replace(self, entries=union([*self.entries.values(), *entries]))

    def to_dict(self) -> dict:
        from attn_dispatch.models.table_io import table_to_dict

        return table_to_dict(self)

    @classmethod
    def from_dict(cls, data: object) -> ThresholdTable:
        """Validate and build (raises `models.table_schema.TableError`)."""
        from attn_dispatch.models.table_schema import table_from_dict

        return table_from_dict(data)


def _column_medians(values: np.ndarray) -> np.ndarray:
    """`np.nanmedian(values, axis=0)` for columns holding a number, without importing numpy.ma
    (~0.1 s on a first call, docs/RESULTS.md#first-call-cpu)."""
    if len(values) == 1:
        return values[0]
    ordered = np.sort(values, axis=0)  # NaN last
    count = (~np.isnan(values)).sum(axis=0)
    low, high = (np.take_along_axis(ordered, index[None, :], axis=0)[0] for index in ((count - 1) // 2, count // 2))
    return (low + high) / 2


def _mapped(items, function):
    """`function` of each value of a mapping or item of a sequence; a lazily read section stays lazy."""
    if isinstance(items, (LazySection, LazyModels)):
        return items.mapped(function)
    if isinstance(items, Mapping):
        return {key: function(value) for key, value in items.items()}
    return tuple(map(function, items))


def _prior_priced_behind_default(ranked: list[tuple[str, float]],
                                 models: Sequence[EmbeddedModel]) -> list[tuple[str, float]]:
    """`ranked` with the kernels no model knows (priced by the prior, never measured on the card) that come before
    PyTorch's default moved to just behind it, keeping their order and seconds: the prior, unchecked on this card,
    does not displace the card's measured choice (docs/RESULTS.md#held-out-draws)."""
    names = [name for name, _ in ranked]
    if DEFAULT_KERNEL not in names:
        return ranked
    at = names.index(DEFAULT_KERNEL)
    ahead = ranked[:at]
    known = [item for item in ahead if any(model.knows(item[0]) for model in models)]
    return known + [ranked[at]] + [item for item in ahead if item not in known] + ranked[at + 1:]


def _default_first(ranked: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """`ranked` with PyTorch's default (when listed) moved to the front."""
    return [item for item in ranked if item[0] == DEFAULT_KERNEL] + [item for item in ranked if item[0] != DEFAULT_KERNEL]
