"""A table with parts of its quality guard taken out: which guard decided a pick, and what it costs.

`ablations(table)`: the table as fitted; without the margin (`Guard.default_margin` 0); without
the regions kept for PyTorch's default (`Cell.keep_default`); without either; and without
measured entries, margin or regions (the model alone, then the decision map). Used by
`bench.guard_rescore` and `bench.table_cv --ablate`.
"""

from __future__ import annotations

from dataclasses import replace

from attn_dispatch.models.table import ThresholdTable


def without_regions(table: ThresholdTable) -> ThresholdTable:
    """`table` with no cell kept for PyTorch's default."""
    return replace(table, classes={
        key: replace(tc, cells={b: replace(c, keep_default=False) for b, c in tc.cells.items()})
        for key, tc in table.classes.items()})


def without_margin(table: ThresholdTable) -> ThresholdTable:
    """`table` whose model's pick replaces PyTorch's default wherever predicted faster at all."""
    return table if table.guard is None else replace(table, guard=replace(table.guard, default_margin=0.0))


def ablations(table: ThresholdTable) -> list[tuple[str, ThresholdTable]]:
    """(label, table) for the table as fitted and with each guard taken out."""
    return [
        ("as fitted", table),
        ("no margin", without_margin(table)),
        ("no regions", without_regions(table)),
        ("no margin or regions", without_regions(without_margin(table))),
        ("model alone (no entries, margin or regions)", without_regions(replace(table, entries={}, guard=None))),
    ]
