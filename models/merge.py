"""Pooling the tables of several cards of one model (or family) into one.

Per bucket, each card's times are carried to a common problem (the prior's ratio) and the first
card's speed (`card_scale`), ranked by their median with the spread across cards kept; each card's
model is kept, scaled alike. Measured entries are unioned (`models.measured.union`); the merged
verdict is the most cautious (`merged_guard`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone

from attn_dispatch.models._json_checks import MAX_CANDIDATES
from attn_dispatch.models.forest import MAX_MODELS
from attn_dispatch.models.identity import CardSpec
from attn_dispatch.models.measured import union
from attn_dispatch.models.paths import software_versions
from attn_dispatch.models.priors import kernel_named
from attn_dispatch.models.quality import Guard
from attn_dispatch.models.table import (
    Cell,
    Provenance,
    TableClass,
    ThresholdTable,
    carried_seconds,
    quality_kind,
)
from attn_dispatch.models.table_build import round_seconds
from attn_dispatch.models.table_io import MAX_TABLE_BYTES, table_bytes
from attn_dispatch.models.table_schema import TableError
from attn_dispatch.models.thresholds import thresholds_for

# A card's attention time scales with both its matrix rate and its bandwidth (the unfused
# kernels gfx906 runs are partly each): the scale is their geometric mean (weight 1/2 each).
COMPUTE_WEIGHT = 0.5


def card_scale(source: CardSpec, target: CardSpec) -> float:
    """Factor turning `source`'s times into `target`'s: (rate ratio)^w x (bandwidth ratio)^(1-w),
    with the fp16 matrix rate standing for CU count x clock."""
    compute = source.flops("float16") / target.flops("float16")
    memory = source.bandwidth / target.bandwidth
    return compute**COMPUTE_WEIGHT * memory ** (1 - COMPUTE_WEIGHT)


def _check_mergeable(tables: Sequence[ThresholdTable]) -> None:
    if not tables:
        raise ValueError("merge_tables needs at least one table")
    families = {i.family_key for t in tables for i in t.provenance.identities}
    if len(families) > 1:
        models = sorted({f"{t.identity.model_key} ({t.identity.family_key})" for t in tables})
        raise TableError(
            f"cannot merge tables of {', '.join(models)}: tables pool only within one card model or one "
            "family (e.g. gfx906: MI50, MI60, Radeon VII); merge each family separately"
        )
    layouts = {(t.class_fields, t.work_step) for t in tables}
    if len(layouts) > 1:
        raise TableError(
            f"cannot merge tables split into different classes {sorted(layouts)} (class_fields, work_step); "
            "rebuild them with the same settings"
        )


def _pool(samples: dict[str, list[float]], limit: int) -> tuple[tuple, dict]:
    ranked = sorted(((n, statistics.median(v)) for n, v in samples.items()), key=lambda e: (e[1], e[0]))[:limit]
    spread = {n: (min(samples[n]), max(samples[n])) for n, _ in ranked if len(samples[n]) > 1}
    return tuple((n, round_seconds(s)) for n, s in ranked), spread


def _merge_class(key, parts: list[tuple[TableClass, float]], spec: CardSpec, device_type: str, limit: int) -> TableClass:
    base = parts[0][0]
    ranking: dict = defaultdict(lambda: defaultdict(list))
    measured: dict = defaultdict(lambda: defaultdict(list))
    excluded: dict = defaultdict(dict)
    for table_class, scale in parts:
        for bucket, cell in table_class.cells.items():
            source = table_class.problem_at(bucket, device_type)
            target = base.problem_at(bucket, device_type)
            for entries, pooled in ((cell.ranking, ranking), (cell.measured, measured)):
                for name, seconds in entries:
                    pooled[bucket][name].append(carried_seconds(seconds * scale, kernel_named(name), source, target, spec))
            excluded[bucket].update(dict(cell.excluded))
    cells = {}
    for bucket, samples in ranking.items():
        ranked, spread = _pool(samples, limit)
        cells[bucket] = Cell(
            ranking=ranked, measured=_pool(measured[bucket], MAX_CANDIDATES)[0] if bucket in measured else (),
            spread=spread, excluded=tuple(sorted(excluded[bucket].items())),
        )
    return TableClass(key=key, template=base.template, cells=cells, thresholds=thresholds_for(cells))


def _merged_quality(tables: Sequence[ThresholdTable]) -> dict:
    """The worst card's quality per metric (accuracies: min; slowdowns: max; counts: sum)."""
    quality: dict = {}
    keys = set.intersection(*(set(t.quality) for t in tables)) if tables else set()
    for key in sorted(keys):
        values = [t.quality[key] for t in tables]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        kind = quality_kind(key)
        if len(numbers) != len(values):
            quality[key] = values[0]
        elif kind == "count":
            quality[key] = sum(numbers)
        elif kind == "slowdown":
            quality[key] = max(numbers)
        elif kind in ("fraction", "correlation"):
            quality[key] = min(numbers)
        else:
            quality[key] = numbers[0]
    quality["description"] = f"merged from {len(tables)} tables: the worst card's quality per metric"
    return quality


CAUTION = ("default", "prior", "table")
"""Verdicts from most to least cautious: a merged table trusts its models only if every part did."""


def merged_guard(tables: Sequence[ThresholdTable]) -> Guard | None:
    """The most cautious verdict of `tables` (None when none was evaluated), with its reason."""
    guards = [t.guard for t in tables if t.guard is not None]
    if not guards:
        return None
    worst = min(guards, key=lambda g: CAUTION.index(g.verdict))
    return Guard(worst.verdict, f"merged from {len(tables)} tables, the most cautious verdict; {worst.reason}"[:400])


def merge_tables(tables: Sequence[ThresholdTable]) -> ThresholdTable:
    """Pool tables of one card model or family (module docstring); `TableError` for other families,
    other work-size buckets, over `MAX_MODELS` models or a result over `MAX_TABLE_BYTES`."""
    tables = list(tables)
    _check_mergeable(tables)
    first = tables[0]
    spec, device_type = first.spec, first.identity.device_type
    limit = max(len(c.ranking) for t in tables for tc in t.classes.values() for c in tc.cells.values())
    by_class: dict = defaultdict(list)
    models = []
    for table in tables:
        scale = card_scale(table.spec, spec)
        models += [model.scaled(scale) for model in table.models]
        for key, table_class in table.classes.items():
            by_class[key].append((table_class, scale))
    if len(models) > MAX_MODELS:
        raise TableError(f"merging {len(models)} cost models is over the {MAX_MODELS}-model cap of one table; merge fewer tables")
    classes = {key: _merge_class(key, parts, spec, device_type, limit) for key, parts in sorted(by_class.items())}
    cards: dict = {}  # each card once, by key, in order: the first table's own identity first
    for identity in (i for t in tables for i in t.provenance.identities):
        cards.setdefault(identity.key, identity)
    walls = [t.provenance.calibration_wall_s for t in tables]
    threads = {t.provenance.timing_threads for t in tables}  # kept where every part was timed alike
    provenance = Provenance(
        identity=first.identity, created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        points_measured=sum(t.provenance.points_measured for t in tables),
        calibration_wall_s=None if None in walls else sum(walls), software=software_versions(),
        merged_from=tuple(cards.values())[1:],
        notes=(f"merged from {len(tables)} tables of {len(cards)} cards; times carried to {first.identity.model_key}",),
        timing_threads=threads.pop() if len(threads) == 1 else None,
    )
    entries = union(entry.scaled(card_scale(t.spec, spec)) if t.identity.model_key != first.identity.model_key else entry
                    for t in tables for entry in t.entries.values())
    merged = replace(first, provenance=provenance, quality=_merged_quality(tables), classes=classes, models=tuple(models),
                     entries=entries, guard=merged_guard(tables))
    size = table_bytes(merged)
    if size > MAX_TABLE_BYTES:
        raise TableError(
            f"merging these {len(tables)} tables gives a {size}-byte table, over the {MAX_TABLE_BYTES}-byte cap of "
            "one table (a merged table keeps each card's cost model); merge fewer tables"
        )
    return merged
