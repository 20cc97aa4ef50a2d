"""A table class's thresholds: where each kernel wins among its cells, as a bounding box of (log2 Lq, log2 Lk)
buckets and in words (`thresholds_for`): what a table stores per class (`table_build`, `merge`) and
`table_summary` shows."""

from __future__ import annotations

from collections import defaultdict

from attn_dispatch.models.table import Cell, Threshold


def _range_text(symbol: str, low: int, high: int, grid_low: int, grid_high: int) -> str:
    parts = []
    if low > grid_low:
        parts.append(f"{symbol} > {2 ** (low - 1) if low > 0 else 0}")
    if high < grid_high:
        parts.append(f"{symbol} <= {2 ** high}")
    return " and ".join(parts)


def thresholds_for(cells: dict[tuple[int, int], Cell]) -> tuple[Threshold, ...]:
    """One `Threshold` per winning kernel, most buckets first."""
    won: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for bucket, cell in cells.items():
        if cell.ranking:
            won[cell.ranking[0][0]].append(bucket)
    q_all = [b[0] for b in cells]
    kv_all = [b[1] for b in cells]
    result = []
    for kernel, buckets in won.items():
        q_low, q_high = min(b[0] for b in buckets), max(b[0] for b in buckets)
        kv_low, kv_high = min(b[1] for b in buckets), max(b[1] for b in buckets)
        in_box = sum(1 for q, kv in cells if q_low <= q <= q_high and kv_low <= kv <= kv_high)
        conditions = [
            text for text in (
                _range_text("Lq", q_low, q_high, min(q_all), max(q_all)),
                _range_text("Lk", kv_low, kv_high, min(kv_all), max(kv_all)),
            ) if text
        ]
        if conditions:
            text = f"{kernel} when {' and '.join(conditions)}"
            if in_box > len(buckets):
                text += f" ({len(buckets)} of {in_box} buckets)"
        elif in_box > len(buckets):  # wins across the whole grid, but not every bucket of it
            text = f"{kernel} in {len(buckets)} of {in_box} buckets, spread over the whole class"
        else:
            text = f"{kernel} everywhere in this class"
        result.append(Threshold(kernel, (q_low, q_high), (kv_low, kv_high), len(buckets), in_box, text))
    result.sort(key=lambda t: (-t.cells_won, t.kernel))
    return tuple(result)
