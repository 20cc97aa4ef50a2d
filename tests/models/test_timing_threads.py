"""A CPU table's timing threads are a recorded field (``provenance.timing_threads``): written,
validated and read back; a table without it (an older one) loads as before; a merge keeps a
count every part agrees on; the words say a mismatch only for CPU tables that record one."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.merge import merge_tables
from attn_dispatch.models.table_io import dumps_table, loads_table
from attn_dispatch.models.table_schema import TableError
from attn_dispatch.models.table_summary import threads_line
from tests.cli.tables import honest_table

H200 = DeviceIdentity(device_type="cuda", name="NVIDIA H200", vendor="NVIDIA", arch="sm_90", compute_units=132,
                      memory_bytes=141 * 2**30, torch_version="2.5.0", cuda_version="12.4")


def timed_with(threads: int | None, **options):
    table = honest_table(**options)
    return replace(table, provenance=replace(table.provenance, timing_threads=threads))


def test_the_timing_threads_round_trip_and_are_written_only_where_known():
    text = dumps_table(timed_with(1))
    assert json.loads(text)["provenance"]["timing_threads"] == 1
    assert loads_table(text.encode()).provenance.timing_threads == 1
    unknown = dumps_table(timed_with(None))
    assert "timing_threads" not in json.loads(unknown)["provenance"]
    assert loads_table(unknown.encode()).provenance.timing_threads is None


def test_an_older_table_without_the_field_loads_as_before():
    data = json.loads(dumps_table(honest_table()))
    assert "timing_threads" not in data["provenance"]
    table = loads_table(json.dumps(data).encode())
    assert table.provenance.timing_threads is None
    assert threads_line(table, 2) is None


@pytest.mark.parametrize("bad", [0, -1, "2", True, 1.5])
def test_a_bad_count_is_refused_naming_the_field(bad):
    data = json.loads(dumps_table(honest_table()))
    data["provenance"]["timing_threads"] = bad
    with pytest.raises(TableError, match=r"provenance\.timing_threads"):
        loads_table(json.dumps(data).encode())


def test_a_merge_keeps_a_count_every_part_agrees_on():
    one, other = timed_with(1), timed_with(1, created="2026-11-30T01:00:00Z")
    assert merge_tables([one, other]).provenance.timing_threads == 1
    assert merge_tables([one, timed_with(2, created="2026-11-30T01:00:00Z")]).provenance.timing_threads is None


def test_the_line_states_the_count_the_timings_hold_for_and_what_always_works():
    table = timed_with(1)
    line = threads_line(table, 2)
    assert line == ("timing threads: 1 torch thread, its timings hold for that count; this process runs 2 torch "
                    "threads and is served the table all the same (torch.set_num_threads(1) matches it)")
    assert "calibrate" not in line  # a busy machine that took a --threads 1 table refuses more threads
    assert threads_line(table, 1) == "timing threads: 1 torch thread, as this process runs"


def test_a_gpu_tables_count_is_informational_only():
    table = timed_with(4, identity=H200)
    assert threads_line(table, 1) is None


def test_a_check_fix_refit_records_the_count_only_where_both_point_sets_share_it():
    import torch

    from attn_dispatch.dispatcher.commands.check import refit_threads

    now = torch.get_num_threads()
    cpu = torch.device("cpu")
    assert refit_threads(timed_with(now), cpu) == now
    assert refit_threads(timed_with(now + 1), cpu) is None  # the table's points and the new ones differ
    assert refit_threads(timed_with(None), cpu) is None  # an older table: its points' count is unknown
    assert refit_threads(timed_with(now, identity=H200), torch.device("cuda")) is None
