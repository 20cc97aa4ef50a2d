"""Table files: round trip, atomic writes, and rejection of corrupt, truncated, oversized and
hostile tables with messages that name the problem."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from attn_dispatch.kernels import all_kernels
from attn_dispatch.models.table_io import MAX_TABLE_BYTES, dumps_table, load_table, loads_table, save_table
from attn_dispatch.models.table_schema import TableError
from tests.models.test_table import DECODE, PREFILL


@pytest.fixture(scope="module")
def table_json(mi50_table) -> dict:
    return json.loads(dumps_table(mi50_table))


def _load(data: dict):
    return loads_table(json.dumps(data).encode())


def test_round_trip(mi50_table, tmp_path):
    path = save_table(mi50_table, tmp_path / "sub" / "table.json")
    again = load_table(path)
    assert dumps_table(again) == dumps_table(mi50_table)
    for problem in (DECODE, PREFILL):
        assert again.rank(problem, all_kernels()) == mi50_table.rank(problem, all_kernels())
    assert [p.name for p in path.parent.iterdir()] == ["table.json"]  # no temporary file left
    assert path.stat().st_size < MAX_TABLE_BYTES / 16
    items = len(mi50_table.classes) + len(mi50_table.models) + len(mi50_table.entries)
    assert path.read_text().count("\n") <= 4 + items  # compact: a line per section item, not per tree node


def test_failed_write_leaves_the_old_file(mi50_table, tmp_path, monkeypatch):
    path = save_table(mi50_table, tmp_path / "table.json")
    before = path.read_bytes()
    monkeypatch.setattr("attn_dispatch.models.table_io.dumps_table", lambda table: (_ for _ in ()).throw(TableError("boom")))
    with pytest.raises(TableError):
        save_table(mi50_table, path)
    assert path.read_bytes() == before and len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "empty"),
        (b"\x80\x04\x95\x00\x00", "pickle"),
        (pickle.dumps({"format_version": 1}), "pickle"),
        (b"\xff\xfe{\x00", "UTF-8"),
        (b'{"format_version": 1, "kind": "attn-dispatch thr', r"truncated.*starting at line 1 column"),
        (b"[" * 100000, "nested too deeply|truncated"),
        (b'{"a": 1, "a": 2}', "repeats the key"),
        (b'{"format_version": NaN}', "non-JSON number NaN"),
        (b"[1, 2, 3]", "JSON object"),
        (b'{"format_version": 99}', "format_version 99"),
        (b'{"format_version": true}', "format_version True"),
    ],
)
def test_malformed_bytes_are_rejected(raw, message):
    with pytest.raises(TableError, match=message):
        loads_table(raw)


def test_oversized_file_is_refused_unread(tmp_path):
    path = tmp_path / "huge.json"
    path.write_bytes(b" " * (MAX_TABLE_BYTES + 10))
    with pytest.raises(TableError, match="cap"):
        load_table(path)
    with pytest.raises(TableError, match="cannot read"):
        load_table(tmp_path / "missing.json")


def _first_cell(data: dict) -> dict:
    return data["classes"][0]["cells"][0]


def _set_node(data: dict, field: str, value: object, *, leaf: bool) -> None:
    """Set `field` of the first leaf (or the first inner node) of the first tree."""
    trees = data["models"][0]["trees"]
    node = next(i for i, left in enumerate(trees["left"][0]) if (left == 0) == leaf)
    trees[field][0][node] = value


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: _first_cell(d)["ranking"][0].__setitem__(0, "os.system('rm -rf /')"), "not an attn-dispatch kernel"),
        (lambda d: _first_cell(d)["ranking"][0].__setitem__(0, "flash_attn_3"), "not an attn-dispatch kernel"),
        (lambda d: _first_cell(d)["ranking"][0].__setitem__(1, -1.0), r"ranking\[0\]\[1\]"),
        (lambda d: _first_cell(d)["ranking"][0].__setitem__(1, 1e9), "finite number"),
        (lambda d: _first_cell(d)["ranking"][0].__setitem__(1, "0.1"), "must be a number"),
        (lambda d: _first_cell(d).__setitem__("q", 1000), r"cells\[0\]\.q"),
        (lambda d: _first_cell(d).__setitem__("q", 2.5), "integer"),
        (lambda d: d["classes"][0].__setitem__("dtype", "int8"), "dtype"),
        (lambda d: d["classes"][0].__setitem__("causal", "yes"), "true or false"),
        (lambda d: d.__setitem__("extra", {}), "unknown fields"),
        (lambda d: d.pop("spec"), "missing fields"),
        (lambda d: d["spec"].__setitem__("bandwidth", 0), "spec.bandwidth"),
        (lambda d: d["provenance"]["identity"].__setitem__("compute_units", "60"), "compute_units"),
        (lambda d: d["quality"].__setitem__("top1_accuracy", 1.5), "quality.top1_accuracy"),
        (lambda d: d.__setitem__("kind", "something else"), "kind"),
        (lambda d: d["classes"].append(copy.deepcopy(d["classes"][0])), "repeats the class"),
        (lambda d: d["classes"][0]["cells"].append(copy.deepcopy(_first_cell(d))), "appears twice"),
        (lambda d: d["models"][0]["trees"]["left"][0].__setitem__(0, 0), "leaf"),
        (lambda d: d["models"][0]["trees"]["right"][0].__setitem__(1, 1), "after their parent"),
        (lambda d: d["models"][0]["trees"]["feature"][0].__setitem__(0, 10**6), "feature"),
        (lambda d: d["models"][0]["trees"]["value"][0].pop(), "equal lengths"),
        (lambda d: d["models"][0].__setitem__("scale", 1e12), r"models\[0\]\.scale"),
        (lambda d: d["provenance"].__setitem__("created", "yesterday"), r"provenance\.created: must be an ISO 8601"),
        (lambda d: d["provenance"].__setitem__("created", "2026-13-01T00:00:00Z"), r"provenance\.created"),
        (lambda d: _first_cell(d).__setitem__("excluded", [["math", "slow"]]), r"excluded\[0\]\[1\]: must be one of"),
        (lambda d: d["classes"][0]["thresholds"][0].__setitem__("q_log2", [5, 2]), r"thresholds\[0\]\.q_log2: low 5 exceeds"),
        (lambda d: d["classes"][0]["thresholds"][0].__setitem__("kv_log2", [9, 1]), r"thresholds\[0\]\.kv_log2"),
        # malformed trees: every one a TableError naming the field, never a ValueError from numpy
        (lambda d: _set_node(d, "feature", "x", leaf=True), "node [0-9]+ feature: a leaf must have feature 0"),
        (lambda d: _set_node(d, "feature", 2**70, leaf=True), "node [0-9]+ feature"),
        (lambda d: _set_node(d, "feature", [1, 2], leaf=True), "node [0-9]+ feature"),
        (lambda d: _set_node(d, "feature", 3, leaf=True), "node [0-9]+ feature"),
        (lambda d: _set_node(d, "threshold", "x", leaf=True), "node [0-9]+ threshold"),
        (lambda d: _set_node(d, "threshold", 0.5, leaf=True), "node [0-9]+ threshold"),
        (lambda d: _set_node(d, "missing_left", True, leaf=True), "node [0-9]+ missing_left"),
        (lambda d: _set_node(d, "missing_left", 0, leaf=True), "node [0-9]+ missing_left"),
        (lambda d: _set_node(d, "value", "x", leaf=True), "node [0-9]+ value"),
        (lambda d: _set_node(d, "value", "x", leaf=False), "node [0-9]+ value"),
        (lambda d: _set_node(d, "value", [1, 2], leaf=False), "node [0-9]+ value"),
        (lambda d: _set_node(d, "threshold", "x", leaf=False), "node [0-9]+ threshold"),
        (lambda d: _set_node(d, "feature", 2**70, leaf=False), "node [0-9]+ feature"),
        (lambda d: _set_node(d, "missing_left", "yes", leaf=False), "node [0-9]+ missing_left"),
        (lambda d: _set_node(d, "threshold", int(1e300) + 1, leaf=False), "node [0-9]+ threshold"),  # rounds onto 1e300
        (lambda d: _set_node(d, "threshold", 10**309, leaf=False), "node [0-9]+ threshold"),  # not an OverflowError
        (lambda d: _set_node(d, "value", -(10**309), leaf=True), "node [0-9]+ value"),
    ],
)
def test_corrupt_and_hostile_fields_are_named(table_json, edit, message):
    data = copy.deepcopy(table_json)
    edit(data)
    with pytest.raises(TableError, match=message) as error:
        _load(data)
    assert "attn-dispatch calibrate" in str(error.value) or "format_version" in str(error.value)


@pytest.mark.parametrize("created", ["2026-11-30T00:00:00Z", "2026-11-30T00:00:00+00:00", "2026-11-30T00:00:00.123456Z"])
def test_iso_timestamps_load(table_json, created):
    data = copy.deepcopy(table_json)
    data["provenance"]["created"] = created
    assert _load(data).provenance.created == created


def test_nan_cannot_be_written(mi50_table):
    bad = copy.deepcopy(mi50_table.quality)
    bad["mean_slowdown"] = float("nan")
    from dataclasses import replace

    with pytest.raises((TableError, ValueError)):
        dumps_table(replace(mi50_table, quality=bad))


def test_the_collector_is_paused_only_while_a_table_is_parsed():
    """`loads_table` pauses Python's cyclic collector for the parse and restores its state after,
    also when the table is refused."""
    import gc

    from attn_dispatch.models import table_io

    seen = []
    parse = table_io._parse

    def spying(*args):
        seen.append(gc.isenabled())
        return parse(*args)

    was = gc.isenabled()
    try:
        gc.enable()
        table_io._parse = spying
        with pytest.raises(TableError):
            table_io.loads_table(b'{"kind": "attn-dispatch-threshold-table"}')
        assert seen == [False] and gc.isenabled()
        gc.disable()
        with pytest.raises(TableError):
            table_io.loads_table(b'{"kind": "attn-dispatch-threshold-table"}')
        assert not gc.isenabled()  # a caller's paused collector stays paused
    finally:
        table_io._parse = parse
        if was:
            gc.enable()
