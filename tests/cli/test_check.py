"""`attn-dispatch check`: a planted drift is detected (exit 1), an honest table passes, and
--fix stores a refitted table that passes."""

from __future__ import annotations

from attn_dispatch.calibration.drift import DECISION_TOLERANCE, PointCheck, sample_buckets
from attn_dispatch.models import ClassKey, load_table, save_table
from attn_dispatch.models.sharing import local_table_path
from tests.cli.tables import FAST, SLOW, drifted_table, honest_table, tiny_table


def test_check_detects_planted_drift(cli, tmp_path):
    path = save_table(drifted_table(), tmp_path / "drifted.json")
    code, out, _ = cli("check", path, "--points", "2")
    assert code == 1
    assert "2 of 2 re-measured buckets changed their fastest kernel" in out
    assert f"table picks {SLOW}" in out and f"fastest measured: {FAST}" in out and "CHANGED" in out
    assert f"  {SLOW}: x" in out and "DRIFTED" in out
    assert "recommendation: recalibrate this card (`attn-dispatch calibrate`)" in out


def test_check_passes_an_honest_table(cli, tmp_path):
    path = save_table(honest_table(), tmp_path / "honest.json")
    code, out, _ = cli("check", path, "--points", "2")
    assert code == 0 and "keep their choice; the table is current" in out and "CHANGED" not in out


def test_check_fix_refits_and_stores(cli, tmp_path):
    from attn_dispatch.models import DeviceIdentity

    path = save_table(drifted_table(), tmp_path / "drifted.json")
    code, out, _ = cli("check", path, "--points", "2", "--fix")
    assert code == 0 and "refit on the new points and the table's own predictions" in out
    assert "\nheld-out quality: " in out  # its own line, as in the calibrate summary (models.table_summary)
    stored = local_table_path(DeviceIdentity.detect("cpu"))
    assert f"stored: {stored}" in out
    refit = load_table(stored)
    winners = {cell.ranking[0][0] for c in refit.classes.values() for cell in c.cells.values()}
    assert SLOW not in winners
    code, out, _ = cli("check", "--points", "2")  # this device's table is now the refit
    assert code == 0, out


def test_check_refuses_another_device_type(cli, tmp_path):
    from tests.models.conftest import fake_identity

    path = save_table(honest_table(identity=fake_identity("mi50_32")), tmp_path / "mi50.json")
    code, _, err = cli("check", path)
    assert code == 2 and "calibrated on a cuda device" in err


def test_decision_change_needs_more_than_noise():
    point = PointCheck(ClassKey("float32", False, "none"), (1, 1), predicted={"a": 1.0, "b": 2.0})
    point.measured = {"a": 1.0 + DECISION_TOLERANCE / 2, "b": 1.0}
    assert not point.changed
    point.measured = {"a": 1.0 + 2 * DECISION_TOLERANCE, "b": 1.0}
    assert point.changed
    point.measured = {"b": 1.0}  # the table's choice no longer runs
    assert point.changed


def test_sample_spreads_over_classes_and_skips_slow_buckets():
    table = tiny_table({(2, 3): [(FAST, 1e-4)], (3, 3): [(FAST, 10.0)], (4, 4): [(FAST, 1e-4)]}, extra_class=True)
    chosen = sample_buckets(table, 3, max_seconds=1.0)
    assert len(chosen) == 3 and {key.causal for key, _ in chosen} == {True, False}
    assert all(bucket != (3, 3) for _, bucket in chosen)
