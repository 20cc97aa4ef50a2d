"""Tiny threshold tables for the CLI tests: one or two classes, a handful of buckets, rankings
chosen by the test (so a test can plant a wrong decision)."""

from __future__ import annotations

from dataclasses import replace

from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measured import ClassKey
from attn_dispatch.models.probe_store import FALLBACK_CPU_SPEC
from attn_dispatch.models.table import Cell, Provenance, TableClass, Template, ThresholdTable
from attn_dispatch.models.thresholds import thresholds_for

# The representative problem of every tiny class: small enough that each kernel runs in
# microseconds to milliseconds on a CI core.
TEMPLATE = Template(batch=1, q_heads=4, kv_heads=4, head_dim=32, value_dim=32)
QUALITY = {"top1_accuracy": 0.75, "top1_within_noise": 0.8, "mean_slowdown": 0.05, "worst_slowdown": 0.4,
           "spearman": 0.9, "n_problems": 8, "description": "hand-written for the CLI tests"}
# A kernel that is far slower than math on short problems on any CPU: 16x16 blocks make a Python
# loop of (Lq/16) x (Lk/16) block steps.
SLOW = "chunked[q=16,kv=16]"
FAST = "math"


def tiny_table(rankings: dict[tuple[int, int], list[tuple[str, float]]], *, dtype: str = "float32",
               identity: DeviceIdentity | None = None, causal: bool = False, created: str = "2026-11-30T00:00:00Z",
               extra_class: bool = False) -> ThresholdTable:
    """A table of this CPU (or `identity`) with one class (two with `extra_class`: the same cells,
    causal) whose buckets rank as given."""
    identity = identity or DeviceIdentity.detect("cpu")
    cells = {bucket: Cell(ranking=tuple(ranking), measured=tuple(ranking)) for bucket, ranking in rankings.items()}
    key = ClassKey(dtype, causal, "none")
    classes = {key: TableClass(key=key, template=TEMPLATE, cells=cells, thresholds=thresholds_for(cells))}
    if extra_class:
        other = ClassKey(dtype, not causal, "none")
        classes[other] = TableClass(key=other, template=TEMPLATE, cells=cells, thresholds=thresholds_for(cells))
    provenance = Provenance(identity=identity, created=created, points_measured=4 * len(cells), calibration_wall_s=1.0,
                            software={"torch": "test"})
    spec = replace(FALLBACK_CPU_SPEC, memory_bytes=identity.memory_bytes or FALLBACK_CPU_SPEC.memory_bytes)
    return ThresholdTable(provenance=provenance, spec=spec, quality=dict(QUALITY), classes=classes)


def honest_table(**options) -> ThresholdTable:
    """Buckets ranking math first and the slow chunked kernel second (true on any CPU)."""
    return tiny_table({(6, 8): [(FAST, 5e-5), (SLOW, 2e-3)], (4, 7): [(FAST, 3e-5), (SLOW, 6e-4)]}, **options)


def drifted_table(**options) -> ThresholdTable:
    """The same buckets with the slow kernel planted first: a decision no CPU agrees with."""
    return tiny_table({(6, 8): [(SLOW, 1e-5), (FAST, 5e-5)], (4, 7): [(SLOW, 1e-5), (FAST, 3e-5)]}, **options)
