"""`attn-dispatch export / import / merge / devices` over models.sharing; a stored table is never
replaced silently."""

from __future__ import annotations

import json

import pytest

from attn_dispatch.dispatcher.commands.export import describe
from attn_dispatch.models import load_table, save_table, store_table
from attn_dispatch.models.sharing import stored_path
from attn_dispatch.models.table_io import dumps_table
from tests.cli.tables import honest_table
from tests.models.conftest import fake_identity


def test_export_writes_this_devices_table(cli, tmp_path):
    store_table(honest_table())
    out_path = tmp_path / "shared" / "mine.json"
    out_path.parent.mkdir()
    code, out, _ = cli("export", out_path)
    assert code == 0 and "exported " in out and f"to {out_path}" in out
    assert load_table(out_path).classes == honest_table().classes


def test_export_creates_no_folders_and_says_how(cli, tmp_path):
    """New-user trial: a missing folder of OUT was created silently; like `cp`, export refuses in
    one line naming OUT, the folder and the fix, and writes nothing."""
    store_table(honest_table())
    out_path = tmp_path / "typo" / "deeper" / "mine.json"
    code, out, err = cli("export", out_path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert f"OUT {out_path}: its folder {out_path.parent} does not exist" in err
    assert f"mkdir -p {out_path.parent}" in err
    assert not (tmp_path / "typo").exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = cli("export", blocker / "mine.json")
    assert code == 2 and f"{blocker} is not a folder" in err and blocker.read_text() == ""


@pytest.mark.parametrize("command", ["merge", "bench", "kernels"])
def test_merge_bench_and_kernels_create_no_folders_either(cli, tmp_path, command):
    """`merge --out`, `bench --json` and `kernels --json` refuse a missing folder up front, as export does."""
    out_path = tmp_path / "typo" / "out.json"
    tables = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]  # refused before they are read
    argument = "--out" if command == "merge" else "--json"
    code, out, err = cli(command, *(tables if command == "merge" else []), argument, out_path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert f"{argument} {out_path}: its folder {out_path.parent} does not exist ({command} creates no folders)" in err
    assert f"mkdir -p {out_path.parent}" in err and not (tmp_path / "typo").exists()


def test_export_without_a_table_fails_clearly(cli, tmp_path):
    code, _, err = cli("export", tmp_path / "x.json")
    assert code == 2 and "no threshold table serves cpu" in err


def test_import_stores_and_devices_reports_exact(cli, tmp_path):
    path = save_table(honest_table(), tmp_path / "from-a-friend.json")
    code, out, _ = cli("import", path)
    assert code == 0 and "imported " in out and "stored as " in out
    code, out, _ = cli("devices")
    assert code == 0 and out.startswith("cpu: ")
    assert "table: exact: its own table" in out and "fingerprint: " in out and "card model: " in out
    code, out, _ = cli("devices", "--json")
    (cpu,) = [r for r in json.loads(out) if r["device"] == "cpu"]
    assert cpu["table_level"] == "exact" and cpu["table_path"].endswith(".json")


def test_devices_without_tables_reports_the_prior(cli):
    code, out, _ = cli("devices")
    assert code == 0 and "table: prior: no table" in out


def test_import_rejects_bad_files_and_keeps_going(cli, tmp_path):
    good = save_table(honest_table(), tmp_path / "good.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format_version": 1, "kind": "something else"}')
    code, out, err = cli("import", bad, good)
    assert code == 2 and "1 of 2 files were not imported" in err and str(bad) in err
    assert f"from {good}" in out


def test_merge_two_cards_of_one_model(cli, tmp_path):
    first = save_table(honest_table(identity=fake_identity("mi50_32")), tmp_path / "a.json")
    other = fake_identity("mi50_32", torch_version="2.6.0+rocm6.3", hip_version="6.3.42131", cuda_version=None)
    second = save_table(honest_table(identity=other, created="2026-11-30T01:00:00Z"), tmp_path / "b.json")
    merged_path = tmp_path / "merged.json"
    code, out, _ = cli("merge", first, second, "--out", merged_path)
    assert code == 0 and "merged: " in out and f"written to {merged_path}" in out
    merged = load_table(merged_path)
    assert len(merged.provenance.identities) == 2 and merged.provenance.points_measured == 16


def test_merge_refuses_two_families(cli, tmp_path):
    mi50 = save_table(honest_table(identity=fake_identity("mi50_32")), tmp_path / "mi50.json")
    h200 = save_table(honest_table(identity=fake_identity("h200")), tmp_path / "h200.json")
    code, _, err = cli("merge", mi50, h200, "--out", tmp_path / "x.json")
    assert code == 2 and "cannot merge tables of" in err and "merge each family separately" in err
    code, _, err = cli("merge", mi50)
    assert code == 2 and "at least two table files" in err


def test_import_over_a_stored_table_of_the_same_card_refuses_without_force(cli, tmp_path):
    mine = honest_table(created="2026-11-30T01:00:00Z")
    target = store_table(mine)
    theirs = save_table(honest_table(created="2026-12-01T02:00:00Z"), tmp_path / "theirs.json")
    code, out, err = cli("import", theirs)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"already stored for this card and stack at {target}: {describe(mine)}" in err
    assert "pass --force to replace it" in err
    assert dumps_table(load_table(target)) == dumps_table(mine)  # kept as it was


def test_import_with_force_replaces_and_says_what_it_replaced(cli, tmp_path):
    mine = honest_table(created="2026-11-30T01:00:00Z")
    target = store_table(mine)
    theirs = honest_table(created="2026-12-01T02:00:00Z")
    code, out, _ = cli("import", "--force", save_table(theirs, tmp_path / "theirs.json"))
    assert code == 0 and f"stored as {target}" in out and f"replaced {describe(mine)}" in out
    assert dumps_table(load_table(target)) == dumps_table(theirs)


def test_importing_the_stored_table_again_changes_nothing(cli, tmp_path):
    target = store_table(honest_table())
    code, out, _ = cli("import", save_table(honest_table(), tmp_path / "same.json"))
    assert code == 0 and out.startswith("already stored: ") and f"at {target} (unchanged)" in out


def test_an_unreadable_stored_file_is_not_replaced_silently_either(cli, tmp_path):
    target = stored_path(honest_table())
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("{not json")
    code, _, err = cli("import", save_table(honest_table(), tmp_path / "new.json"))
    assert code == 2 and "an unreadable table file" in err and target.read_text() == "{not json"


def test_merge_with_force_says_what_it_replaced(cli, tmp_path):
    first = save_table(honest_table(identity=fake_identity("mi50_32")), tmp_path / "a.json")
    other = fake_identity("mi50_32", torch_version="2.6.0+rocm6.3", hip_version="6.3.42131", cuda_version=None)
    second = save_table(honest_table(identity=other, created="2026-11-30T01:00:00Z"), tmp_path / "b.json")
    code, out, _ = cli("merge", first, second)
    assert code == 0
    stored = load_table(out.split("written to ")[1].strip())
    code, _, err = cli("merge", first, second)
    assert code == 2 and "a stored table is already at " in err and "--force" in err
    code, out, _ = cli("merge", "--force", first, second)
    assert code == 0 and f"  replaced {describe(stored)}" in out


def test_merging_the_same_tables_again_names_the_same_file_whenever_it_runs(cli, tmp_path, monkeypatch):
    """The stored name hashes the merged content less its creation time: a later second is the same merge."""
    import attn_dispatch.models.merge as merge_module

    first = save_table(honest_table(identity=fake_identity("mi50_32")), tmp_path / "a.json")
    other = fake_identity("mi50_32", torch_version="2.6.0+rocm6.3", hip_version="6.3.42131", cuda_version=None)
    second = save_table(honest_table(identity=other, created="2026-11-30T01:00:00Z"), tmp_path / "b.json")
    code, out, _ = cli("merge", first, second)
    written = out.split("written to ")[1].splitlines()[0].strip()

    class Later(merge_module.datetime):
        @classmethod
        def now(cls, tz=None):
            return merge_module.datetime(2030, 1, 1, tzinfo=tz)

    monkeypatch.setattr(merge_module, "datetime", Later)
    code, out, _ = cli("merge", "--force", first, second)
    assert code == 0 and out.split("written to ")[1].splitlines()[0].strip() == written
    assert load_table(written).provenance.created.startswith("2030-01-01")
