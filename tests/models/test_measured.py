"""Measured entries: an exact bucket's measured winner comes before the model; export, import and
merge carry entries and resolve conflicts by the measured times and spread; version 1 tables
(before entries and the guard) are refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from attn_dispatch.kernels import Problem
from attn_dispatch.models import sharing
from attn_dispatch.models.measured import (
    DEFAULT_KERNEL,
    KERNELS_PER_ENTRY,
    MeasuredEntry,
    MeasuredTime,
    combine,
    entries_from_measurements,
    entry_from_tuning,
    entry_key,
    pick,
)
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.merge import merge_tables
from attn_dispatch.models.priors import kernel_named
from attn_dispatch.models.sharing import export_table, import_table, lookup_table
from attn_dispatch.models.table_io import load_table, loads_table, save_table, table_to_dict
from attn_dispatch.models.table_schema import TableError
from tests.models.conftest import fake_identity

PROBLEM = Problem(2, 8, 2, 300, 3000, 64, 64, "float32")
KERNELS = ("math", "chunked[q=64,kv=512]", "small_q[splits=8]", DEFAULT_KERNEL)


def _time(kernel: str, median: float, *, spread: float = 0.01, samples: int = 10) -> MeasuredTime:
    return MeasuredTime(kernel, median, median / (1 + spread), median * (1 + spread), samples)


def _entry(*times: MeasuredTime, problem: Problem = PROBLEM, source: str = "calibration") -> MeasuredEntry:
    return MeasuredEntry(entry_key(problem), problem.batch, problem.q_len, problem.kv_len,
                         tuple(sorted(times, key=lambda t: t.median_s)), source)


def test_the_fastest_wins_unless_the_default_is_within_its_spread():
    assert pick([_time("math", 1e-3), _time(DEFAULT_KERNEL, 2e-3)]) == "math"
    assert pick([_time("math", 1.000e-3), _time(DEFAULT_KERNEL, 1.015e-3)]) == DEFAULT_KERNEL  # spreads overlap
    tied = [_time("math", 1.000e-3, samples=3), _time("chunked[q=64,kv=512]", 1.01e-3, samples=30)]
    assert pick(tied) == "chunked[q=64,kv=512]"  # no default among the tied: more samples


def test_a_measured_entry_comes_before_the_model(cpu_fit):
    table = replace(cpu_fit[0], entries={})
    kernels = [kernel_named(name) for name in KERNELS]
    model_order = [name for name, _ in table.rank(PROBLEM, kernels)]
    loser = model_order[-1]  # what the model ranks last measured fastest here
    entry = _entry(_time(loser, 1e-4), _time(model_order[0], 5e-4))
    measured = table.with_entries([entry])
    ranked = measured.rank(PROBLEM, kernels)
    assert [name for name, _ in ranked[:2]] == [loser, model_order[0]]
    assert sorted(name for name, _ in ranked) == sorted(model_order)  # the rest still ranked, once each
    assert ranked[0][1] == pytest.approx(1e-4)  # the measured problem itself: no carrying
    other = replace(PROBLEM, q_len=400)  # same bucket (2^9): the entry serves, times carried
    assert measured.rank(other, kernels)[0][0] == loser and measured.rank(other, kernels)[0][1] > 1e-4
    outside = replace(PROBLEM, q_heads=16)  # another exact bucket: the model
    assert measured.rank(outside, kernels) == table.rank(outside, kernels)


def test_a_tuned_configuration_an_entry_names_is_served_beside_the_set(cpu_fit):
    """An entry's winner that is a configuration of a family in the set (a calibration's tuned
    ``small_q[splits=64]``) is ranked first though the set holds only ``small_q[splits=8]``; a family
    the set lacks is not added."""
    table = replace(cpu_fit[0], entries={})
    kernels = [kernel_named(name) for name in ("math", "small_q[splits=8]", DEFAULT_KERNEL)]
    entry = _entry(_time("small_q[splits=64]", 1e-4), _time("chunked[q=64,kv=512]", 2e-4), _time("math", 5e-4))
    ranked = [name for name, _ in table.with_entries([entry]).rank(PROBLEM, kernels)]
    assert ranked[:2] == ["small_q[splits=64]", "math"]
    assert "chunked[q=64,kv=512]" not in ranked


def test_entries_from_calibration_points_keep_the_fastest_and_the_default():
    names = [f"chunked[q={q},kv={kv}]" for q in (16, 32, 64, 128) for kv in (256, 512, 1024)]
    points = [Measurement(PROBLEM, name, median_s=(i + 1) * 1e-4, iqr_s=1e-6, reps=20) for i, name in enumerate(names)]
    points.append(Measurement(PROBLEM, DEFAULT_KERNEL, median_s=1.0, iqr_s=1e-3, reps=20))
    points.append(Measurement(PROBLEM, "math", status="failed"))
    (entry,) = entries_from_measurements(points).values()
    assert [t.kernel for t in entry.times] == names[:KERNELS_PER_ENTRY] + [DEFAULT_KERNEL]
    assert entry.winner == names[0] and entry.problem() == PROBLEM


def test_combining_owners_unions_kernels_and_widens_spreads():
    mine = _entry(_time("math", 1.0e-3, samples=10), _time(DEFAULT_KERNEL, 3e-3))
    theirs = _entry(_time("math", 1.4e-3, samples=40), _time("small_q[splits=8]", 2e-3))
    both = combine(mine, theirs)
    by_name = {t.kernel: t for t in both.times}
    assert set(by_name) == {"math", DEFAULT_KERNEL, "small_q[splits=8]"}
    assert by_name["math"].median_s == 1.4e-3 and by_name["math"].samples == 50  # more samples' median
    assert by_name["math"].low_s < 1.0e-3 < 1.4e-3 < by_name["math"].high_s
    assert both.winner == "math"


def _owner_table(table, card: str, entries):
    return replace(table, provenance=replace(table.provenance, identity=fake_identity(card)), entries={e.key: e for e in entries})


def test_merge_of_one_card_unions_entries_and_resolves_conflicts(mi50_table, tmp_path):
    cuda = replace(PROBLEM, device_type="cuda")
    only_mine = _entry(_time("math", 1e-3), _time(DEFAULT_KERNEL, 2e-3), problem=replace(cuda, q_heads=16))
    mine = _entry(_time("math", 1.00e-3), _time(DEFAULT_KERNEL, 1.5e-3), problem=cuda)
    theirs = _entry(_time("math", 1.60e-3, spread=0.3), _time(DEFAULT_KERNEL, 1.5e-3), problem=cuda)
    merged = merge_tables([_owner_table(mi50_table, "mi50_32", [only_mine, mine]),
                           _owner_table(mi50_table, "mi50_16", [theirs])])
    assert set(merged.entries) == {only_mine.key, mine.key}
    # their wide spread on math overlaps the default: the default wins the conflict
    assert merged.entries[mine.key].winner == DEFAULT_KERNEL
    again = load_table(save_table(merged, tmp_path / "merged.json"))
    assert again.entries == merged.entries


def test_export_and_import_carry_entries_and_the_guard(mi50_table, tmp_path, monkeypatch):
    from attn_dispatch.models.quality import Guard

    monkeypatch.setattr(sharing, "BUNDLED_TABLES_DIR", tmp_path / "bundled")
    entry = _entry(_time("math", 1e-3), _time(DEFAULT_KERNEL, 2e-3), problem=replace(PROBLEM, device_type="cuda"))
    table = replace(mi50_table, entries={entry.key: entry}, guard=Guard("default", "held-out mean slowdown: test"))
    shared = export_table(table, tmp_path / "shared.json")
    stored = import_table(shared, home=tmp_path / "home")
    found = lookup_table(table.identity, home=tmp_path / "home", warn=False)
    assert found.path == stored and found.table.entries == table.entries and found.table.guard == table.guard
    assert json.loads(shared.read_text())["format_version"] == 2


def test_only_version_2_tables_are_read(mi50_table):
    data = table_to_dict(replace(mi50_table, entries={}, guard=None))
    unguarded = loads_table(json.dumps(data).encode())
    assert unguarded.entries == {} and unguarded.guard is None and unguarded.verdict == "table"
    data["format_version"] = 1
    with pytest.raises(TableError, match="format_version 1 is not supported .* recalibrate"):
        loads_table(json.dumps(data).encode())
    data["format_version"] = 3
    with pytest.raises(TableError, match="format_version 3 is not supported"):
        loads_table(json.dumps(data).encode())


def test_bad_entries_are_refused_naming_the_field(mi50_table):
    entry = _entry(_time("math", 1e-3), _time(DEFAULT_KERNEL, 2e-3), problem=replace(PROBLEM, device_type="cuda"))
    data = table_to_dict(replace(mi50_table, entries={entry.key: entry}))
    data["measured_entries"][0]["times"][0][2] = 1.0  # low above the median
    with pytest.raises(TableError, match=r"measured_entries\[0\]\.times\[0\]"):
        loads_table(json.dumps(data).encode())
    data = table_to_dict(replace(mi50_table, entries={entry.key: entry}))
    data["measured_entries"].append(data["measured_entries"][0])
    with pytest.raises(TableError, match="repeats the key"):
        loads_table(json.dumps(data).encode())


def test_a_remembered_tuning_is_an_entry():
    key = entry_key(PROBLEM)
    entry = entry_from_tuning(key, (("math", 2e-3), (DEFAULT_KERNEL, 1e-3), ("chunked[q=64,kv=512]", float("inf"))),
                              rounds=5)
    assert entry.source == "tuning" and entry.winner == DEFAULT_KERNEL and entry.key == key
    assert [t.kernel for t in entry.times] == [DEFAULT_KERNEL, "math"]  # the failed contender is left out
    assert entry_from_tuning(key, (("math", 2e-3),), rounds=5) is None  # nothing was settled
