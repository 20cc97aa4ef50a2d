"""A table's decision map as plottable grids: per class, the winning kernel of each (log2 Lq,
log2 Lk) bucket and its predicted speed-up over PyTorch's default (``sdpa_default``).

The speed-up compares two predictions for the class's representative problem: the winner's
(the bucket's first candidate) and ``sdpa_default``'s, taken from the bucket's candidates when
listed there, else from the table's embedded cost model(s) (the median over a merged table's
cards), else from the analytic prior of the table's card. `models.decision_plot` draws them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attn_dispatch.kernels.sdpa_default import SdpaDefaultKernel
from attn_dispatch.models.buckets import ClassKey
from attn_dispatch.models.priors import prior_seconds
from attn_dispatch.models.table import TableClass, ThresholdTable

BASELINE = "sdpa_default"
# Family of a kernel name, for colours and legends: the part before "[" (a convert kernel becomes
# "convert+" and its inner family, "convert[fp16->fp32]+chunked[...]" -> "convert+chunked").
FAMILY_SEPARATOR = "["


def family_of(name: str) -> str:
    """``small_q[splits=8]`` -> ``small_q``; ``convert[bf16->fp32]+sdpa_flash`` -> ``convert+sdpa_flash``."""
    if name.startswith("convert["):
        inner = name.split("]+", 1)[1] if "]+" in name else name
        return "convert+" + inner.split(FAMILY_SEPARATOR, 1)[0]
    return name.split(FAMILY_SEPARATOR, 1)[0]


@dataclass(frozen=True)
class MapPanel:
    """One class of a table as grids over its buckets.

    Attributes
    ----------
    key: the class; title: its description.
    q_buckets, kv_buckets: the log2 lengths spanned (rows, columns).
    winners: bucket -> winning kernel name.
    speedup: bucket -> predicted sdpa_default seconds / winner seconds (None: not predictable).
    source: where sdpa_default's times came from ("table", "cost model", "prior").
    """

    key: ClassKey
    title: str
    q_buckets: tuple[int, ...]
    kv_buckets: tuple[int, ...]
    winners: dict[tuple[int, int], str]
    speedup: dict[tuple[int, int], float | None]
    source: str

    def grid(self, values: dict[tuple[int, int], float | None]) -> np.ndarray:
        """``[len(q_buckets), len(kv_buckets)]`` array of `values` (NaN where missing)."""
        out = np.full((len(self.q_buckets), len(self.kv_buckets)), np.nan)
        for (q, kv), value in values.items():
            if value is not None and math.isfinite(value):
                out[self.q_buckets.index(q), self.kv_buckets.index(kv)] = value
        return out


def _baseline_seconds(table: ThresholdTable, table_class: TableClass, buckets: list[tuple[int, int]]
                      ) -> tuple[dict[tuple[int, int], float], str]:
    """Predicted sdpa_default seconds per bucket not listing it, and where they came from."""
    device_type = table.identity.device_type
    problems = [table_class.problem_at(bucket, device_type) for bucket in buckets]
    if not problems:
        return {}, "table"
    if table.usable_models:
        seconds = table.model_seconds(problems, [BASELINE] * len(problems))
        return {b: float(s) for b, s in zip(buckets, seconds, strict=True)}, "cost model"
    kernel = SdpaDefaultKernel()
    return {b: prior_seconds(p, kernel, table.spec) for b, p in zip(buckets, problems, strict=True)}, "prior"


def class_panel(table: ThresholdTable, key: ClassKey) -> MapPanel:
    """The panel of one class of `table`."""
    table_class = table.classes[key]
    cells = {bucket: cell for bucket, cell in table_class.cells.items() if cell.ranking}
    listed = {bucket: dict(cell.ranking).get(BASELINE) for bucket, cell in cells.items()}
    missing = [bucket for bucket, seconds in listed.items() if seconds is None]
    predicted, source = _baseline_seconds(table, table_class, missing)
    speedup: dict[tuple[int, int], float | None] = {}
    for bucket, cell in cells.items():
        baseline = listed[bucket] if listed[bucket] is not None else predicted.get(bucket)
        winner_s = cell.ranking[0][1]
        speedup[bucket] = baseline / winner_s if baseline is not None and winner_s > 0 else None
    q_all = [b[0] for b in cells]
    kv_all = [b[1] for b in cells]
    t = table_class.template
    title = f"{key.describe()}\n(B{t.batch} H{t.q_heads}/{t.kv_heads} D{t.head_dim})"
    return MapPanel(
        key=key, title=title,
        q_buckets=tuple(range(min(q_all), max(q_all) + 1)) if cells else (),
        kv_buckets=tuple(range(min(kv_all), max(kv_all) + 1)) if cells else (),
        winners={bucket: cell.ranking[0][0] for bucket, cell in cells.items()},
        speedup=speedup, source=source if missing else "table",
    )


def decision_panels(table: ThresholdTable) -> list[MapPanel]:
    """One panel per class of `table`, in class order (dtype, causality, mask kind, ...)."""
    return [class_panel(table, key) for key in sorted(table.classes)]
