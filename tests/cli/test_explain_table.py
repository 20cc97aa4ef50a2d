"""`attn-dispatch explain --table FILE` explains the decision that table makes (read as `show` and
`check` read theirs; a bad file is one line naming --table, exit 2); `explain` and `devices` state
the torch thread count a CPU table was timed with, beside this process's (the CLI tests run one
thread), and the table serves quietly."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from attn_dispatch.models import DeviceIdentity, save_table, store_table
from tests.cli.tables import honest_table, tiny_table

# One float32 bucket (Lq 2^6, Lk 2^8) ranking PyTorch's math backend first: no prior picks it there.
PLANTED = {(6, 8): [("sdpa_math", 1e-5), ("math", 5e-5)]}
SHAPE = ("--lq", "64", "--lk", "256", "--heads", "4", "--head-dim", "32", "--dtype", "float32", "--device", "cpu")


def timed_with(table, threads: int):
    return replace(table, provenance=replace(table.provenance, timing_threads=threads))


def test_explain_uses_the_table_file_given(cli, tmp_path):
    code, out, _ = cli("explain", *SHAPE)
    assert code == 0 and "-> sdpa_math" not in out  # no table here: the prior decides otherwise
    path = save_table(tiny_table(PLANTED), tmp_path / "planted.json")
    code, out, _ = cli("explain", *SHAPE, "--table", path)
    assert code == 0 and "-> sdpa_math (" in out.splitlines()[0]
    assert "ranked by: threshold table given with --table (calibrated on this card)" in out
    assert f"table: {path} (lookup level: exact)" in out
    code, out, _ = cli("explain", *SHAPE, "--table", path, "--json")
    decision = json.loads(out)
    assert decision["kernel"] == "sdpa_math" and decision["source"]["path"] == str(path)


@pytest.mark.measuring  # explain times nothing: only what a pending measurement is said to be
def test_a_pending_measurement_under_this_cards_table_reads_consistently(cli, tmp_path):
    """With this card's own table and measuring on, the ranked-by line says whose table it is (not "exact match",
    read as a match of the bucket beside "measurement pending"), and the pending note says what serves the calls
    meanwhile and that the times listed are predictions."""
    path = save_table(tiny_table(PLANTED), tmp_path / "planted.json")
    code, out, _ = cli("explain", *SHAPE, "--table", path)
    assert code == 0 and "exact match" not in out and "not measured for this bucket" not in out
    assert "ranked by: threshold table given with --table (calibrated on this card)" in out
    (pending,) = [line for line in out.splitlines() if line.startswith("  note: measurement pending: ")]
    assert "sdpa_default serves them, so it is tried first" in pending
    assert "The times above are predictions, not these timings" in pending
    assert "     1. sdpa_default " in out


def test_explain_names_another_cards_table(cli, tmp_path):
    other = replace(DeviceIdentity.cpu(), name="Some Other CPU", compute_units=64)
    path = save_table(tiny_table(PLANTED, identity=other), tmp_path / "theirs.json")
    code, out, _ = cli("explain", *SHAPE, "--table", path)
    assert code == 0 and "-> sdpa_math (" in out and "(lookup level: another card)" in out
    assert f"note: table {path} was calibrated on {other.model_key}, not on this device" in out


@pytest.mark.parametrize("content", ["{ not json", '{"format_version": 2, "kind": "something else"}', None],
                         ids=["corrupt", "foreign", "missing"])
def test_explain_refuses_a_bad_table_file_in_one_line(cli, tmp_path, content):
    path = tmp_path / "table.json"
    if content is not None:
        path.write_text(content)
    code, out, err = cli("explain", *SHAPE, "--table", path)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"attn-dispatch explain: error: --table {path}: ") and "Traceback" not in err


def test_explain_and_devices_state_another_thread_count_and_the_table_serves_quietly(cli, tmp_path):
    store_table(timed_with(tiny_table(PLANTED), 2))  # the CLI tests run 1 torch thread
    code, out, err = cli("explain", *SHAPE)
    assert code == 0 and "-> sdpa_math (" in out  # stated, not acted on
    (note,) = [line for line in out.splitlines() if "torch thread" in line]
    assert note.startswith("  note: timing threads: 2 torch threads, its timings hold for that count; this process "
                           "runs 1 torch thread") and "torch.set_num_threads(2)" in note and "calibrate" not in note
    assert "Warning" not in err
    code, out, _ = cli("devices")
    assert code == 0 and "    timing threads: 2 torch threads, its timings hold for that count" in out
    code, out, _ = cli("devices", "--json")
    (cpu,) = [r for r in json.loads(out) if r["device"] == "cpu"]
    assert cpu["table_timing_threads"] == 2 and cpu["table_threads"].startswith("timing threads: 2 torch threads")


def test_devices_says_a_matching_count_and_nothing_for_an_older_table(cli):
    store_table(timed_with(honest_table(), 1))
    code, out, _ = cli("devices")
    assert code == 0 and "    timing threads: 1 torch thread, as this process runs" in out
    store_table(honest_table())  # no count recorded: replaces it
    code, out, _ = cli("devices")
    assert code == 0 and "torch thread" not in out


def test_the_no_table_notice_is_printed_once_in_the_explanation(cli, caplog, monkeypatch):
    """Without a table the explanation carries the one-line notice; it is not logged again."""
    from attn_dispatch.dispatcher import device_ranking

    monkeypatch.setattr(device_ranking, "_said", set())  # as in a fresh process
    with caplog.at_level("WARNING", logger="attn_dispatch"):
        code, out, err = cli("explain", *SHAPE)
    notice = "no table measured on this card for cpu"
    assert code == 0 and out.count(notice) == 1
    assert notice not in err + caplog.text
