"""`attn-dispatch show` says when a class's winners are lossy conversions (`models.table_summary`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from attn_dispatch.models.table_io import load_table
from attn_dispatch.models.table_summary import LOSSY_NOTE, is_lossy_conversion, threshold_lines

BUNDLED_H200 = Path(__file__).resolve().parents[2] / "models" / "tables" / "nvidia-h200-140gb.json"


def test_lossy_conversions_are_told_from_lossless_ones():
    assert is_lossy_conversion("convert[fp32->bf16]+sdpa_flash")
    assert not is_lossy_conversion("convert[bf16->fp32]+sdpa_flash")  # widening loses nothing
    assert not is_lossy_conversion("convert[contiguous]+sdpa_flash")
    assert not is_lossy_conversion("sdpa_flash")
    assert not is_lossy_conversion("a_kernel_of_another_version[x=1]")


def test_show_notes_lossy_winners_only_where_a_class_lists_one():
    table = load_table(BUNDLED_H200)  # calibrated with --allow-lossy any: fp32 classes won by fp32->bf16
    assert LOSSY_NOTE in threshold_lines(table)

    def lists_lossy(classes) -> bool:
        return any(is_lossy_conversion(line.split()[1]) for line in threshold_lines(replace(table, classes=classes))
                   if line.lstrip().startswith("- "))

    def lossless(key) -> bool:
        return not lists_lossy({key: table.classes[key]})

    clean = {key: c for key, c in table.classes.items() if lossless(key)}
    assert clean and LOSSY_NOTE not in threshold_lines(replace(table, classes=clean))
    for dtype in ("bfloat16", "float16"):  # the note follows the classes' winners, whatever the refit lists
        classes = {key: c for key, c in table.classes.items() if key.describe().startswith(dtype)}
        assert classes and (LOSSY_NOTE in threshold_lines(replace(table, classes=classes))) == lists_lossy(classes)
