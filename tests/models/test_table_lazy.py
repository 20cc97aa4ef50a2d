"""Tables loaded for the dispatcher (`load_table(..., lazy=True)`): classes, models and measured
entries validated on first use, a malformed one dropped with a warning then, and a table of
another card never parsed."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from attn_dispatch.kernels import all_kernels
from attn_dispatch.models import sharing, table_io, table_schema
from attn_dispatch.models.sharing import TableWarning, head_identities
from attn_dispatch.models.table_io import dumps_table, load_table, save_table
from attn_dispatch.models.table_schema import TableError
from tests.models.test_table import DECODE, PREFILL
from tests.models.test_table_header import BUNDLED_H200


def _lines(path) -> list[str]:
    return path.read_text().split("\n")


def _entry_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if line.startswith('{"key":')]


def _entry_of(line: str):
    return table_schema._entry(json.loads(line.removesuffix(",")), "")


def test_round_trip_lazy_and_whole(mi50_table, tmp_path):
    path = save_table(mi50_table, tmp_path / "table.json")
    for lazy in (True, False):
        again = load_table(path, lazy=lazy)
        assert dumps_table(again) == dumps_table(mi50_table)
        assert again.entries == mi50_table.entries and again.classes == mi50_table.classes
        for problem in (DECODE, PREFILL, *(e.problem() for e in list(mi50_table.entries.values())[:5])):
            assert again.rank(problem, all_kernels()) == mi50_table.rank(problem, all_kernels())
    assert dumps_table(load_table(BUNDLED_H200, lazy=True)) == BUNDLED_H200.read_text()


def test_a_file_of_another_layout_loads_whole(mi50_table, tmp_path):
    path = tmp_path / "indented.json"
    path.write_text(json.dumps(json.loads(dumps_table(mi50_table)), indent=1))
    again = load_table(path, lazy=True)
    assert type(again.entries) is dict and dumps_table(again) == dumps_table(mi50_table)


def test_a_malformed_entry_is_reported_and_skipped_when_its_bucket_is_looked_up(mi50_table, tmp_path):
    path = save_table(mi50_table, tmp_path / "table.json")
    lines = _lines(path)
    first, second = _entry_lines(lines)[:2]
    entry, good = _entry_of(lines[first]), _entry_of(lines[second])
    bad = json.loads(lines[first].removesuffix(","))
    bad["times"][0][1] = -1.0
    lines[first] = json.dumps(bad, separators=(",", ":")) + ","
    path.write_text("\n".join(lines))
    with pytest.raises(TableError, match=r"measured_entries\[0\]\.times\[0\]"):
        load_table(path)  # validated whole: refused
    with warnings.catch_warnings():
        warnings.simplefilter("error", TableWarning)
        table = load_table(path, lazy=True)  # nothing validated yet: nothing to say
        assert table.measured_entry(good.problem()) == good
    problem = entry.problem()
    with pytest.warns(TableWarning, match=r"skipped measured_entries\[0\]: .*times\[0\]\[1\]"):
        assert table.measured_entry(problem) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", TableWarning)
        ranked = table.rank(problem, all_kernels())  # reported once; the model ranks the bucket
    assert ranked and len(table.entries) == len(mi50_table.entries) - 1


def test_a_malformed_class_or_model_is_dropped_with_a_warning(mi50_table, tmp_path):
    path = save_table(mi50_table, tmp_path / "table.json")
    lines = _lines(path)
    lines[1] = lines[1].replace('"ranking":[[', '"ranking":[["no_such_kernel",1e-3],[', 1)
    models = lines.index('],"models":[') + 1
    lines[models] = lines[models].replace('"trees":{', '"trees":{"extra":1,', 1)
    path.write_text("\n".join(lines))
    table = load_table(path, lazy=True)
    with pytest.warns(TableWarning) as caught:
        ranked = table.rank(PREFILL, all_kernels())
        ranked += table.rank(DECODE, all_kernels())
    said = " ".join(str(w.message) for w in caught)
    assert "skipped its models" in said and "models[0].trees" in said and ranked
    assert len(table.models) == 0
    with pytest.warns(TableWarning, match=r"skipped classes\[0\]"):
        assert len(list(table.classes)) == len(mi50_table.classes) - 1


def test_entries_are_validated_only_when_looked_up(mi50_table, tmp_path, monkeypatch):
    path = save_table(mi50_table, tmp_path / "table.json")
    built = []
    real = table_schema._entry
    monkeypatch.setattr(table_schema, "_entry", lambda *args: built.append(args[1]) or real(*args))
    table = load_table(path, lazy=True)
    assert built == [] and len(table.entries) == len(mi50_table.entries)
    entry = _entry_of(path.read_text().split("\n")[_entry_lines(_lines(path))[3]])
    built.clear()
    table.rank(entry.problem(), all_kernels())
    assert built == ["measured_entries[3]"]
    scaled = table.scaled(2.0, spec=table.spec, note="x")  # a family stand-in stays lazy
    assert scaled.measured_entry(entry.problem()).times[0].median_s == 2 * entry.times[0].median_s
    assert built == ["measured_entries[3]"]


def test_the_dispatchers_lookup_parses_no_table_of_another_device(tmp_path, monkeypatch):
    """On a CPU the bundled H200 table is skipped from its head: `table_io` never parses it."""
    from attn_dispatch.dispatcher.device_ranking import resolve_ranking

    parsed = []
    real = table_io._parse
    monkeypatch.setattr(table_io, "_parse", lambda text, source, lazy: parsed.append(source) or real(text, source, lazy))
    monkeypatch.setattr(sharing, "BUNDLED_TABLES_DIR", BUNDLED_H200.parent)
    sharing._load_version.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranking = resolve_ranking(torch.device("cpu"), home=tmp_path)
    assert ranking.table is None and parsed == []
    (card,) = head_identities(BUNDLED_H200)
    found = sharing.lookup_table(card, home=tmp_path, warn=False)
    assert found.path == BUNDLED_H200 and parsed == [str(BUNDLED_H200)]
    assert type(found.table.entries) is not dict  # loaded lazily


def test_a_class_line_with_a_malformed_head_never_fails_a_lookup(mi50_table, tmp_path):
    path = save_table(mi50_table, tmp_path / "table.json")
    lines = _lines(path)
    index = next(i for i, line in enumerate(lines) if ',"template":' in line)
    lines[index] = lines[index].replace("{", '{"broken', 1)
    path.write_text("\n".join(lines))
    with pytest.raises(TableError, match=r"classes\["):
        load_table(path, lazy=True)
