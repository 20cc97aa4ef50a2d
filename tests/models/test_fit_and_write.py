"""The end of a calibration (`calibration.finish.fit_and_write`): gate, fit, and store the table."""

from __future__ import annotations


def test_calibration_stores_its_table_in_the_tables_directory(tmp_path, monkeypatch):
    """The end of a calibration (`calibration.finish.fit_and_write`) stores the table where the
    dispatcher looks; it saves nothing else (no pickled cost model)."""
    from attn_dispatch.calibration.finish import fit_and_write
    from attn_dispatch.models.identity import DeviceIdentity
    from attn_dispatch.models.paths import tables_dir
    from tests.models.synthetic import synthetic_measurements

    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path))
    identity = DeviceIdentity.cpu()
    points = synthetic_measurements(8, seed=7)
    outcome = fit_and_write(points, identity, out=None, seed=0, wall_s=1.0)
    assert outcome.table_paths and outcome.table_paths[0].is_relative_to(tables_dir())
    assert not list(tmp_path.rglob("*.joblib"))


def test_a_calibration_too_busy_to_time_kernels_gets_the_default_verdict(tmp_path, monkeypatch):
    """Measured under ``--allow-busy`` on a machine too busy to time kernels: the stored table's
    guard says PyTorch's default serves (its held-out scores were timed on the same noise)."""
    from attn_dispatch.calibration.finish import TOO_BUSY_REASON, fit_and_write
    from attn_dispatch.models.identity import DeviceIdentity
    from attn_dispatch.models.table_io import load_table
    from tests.models.synthetic import synthetic_measurements

    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path))
    points = synthetic_measurements(8, seed=7)
    outcome = fit_and_write(points, DeviceIdentity.cpu(), out=tmp_path / "t.json", seed=0, wall_s=1.0, too_busy=True)
    table = load_table(outcome.table_paths[-1])
    assert table.guard.verdict == "default" and table.guard.reason == TOO_BUSY_REASON
    assert TOO_BUSY_REASON in outcome.note
