"""The local cost-model cache: joblib with library versions checked before unpickling."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attn_dispatch.models.cost_model import CostModel, ModelVersionError, load_model, model_path, save_model
from tests.models.conftest import fake_identity


def _fitted() -> CostModel:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 45))
    return CostModel(max_iter=10, residual=False).fit(X, X[:, 0])


def test_round_trip(tmp_path):
    identity, model = fake_identity("mi50_16"), _fitted()
    path = save_model(model, identity, home=tmp_path)
    assert path == model_path(identity, home=tmp_path) and path.parent == tmp_path / "models"
    loaded = load_model(identity, home=tmp_path)
    X = np.ones((2, 45))
    assert np.array_equal(loaded.predict(X), model.predict(X))


def test_version_mismatch_is_detected_before_unpickling(tmp_path, monkeypatch):
    identity = fake_identity("mi60")
    path = save_model(_fitted(), identity, home=tmp_path)
    versions = path.with_name(path.name.replace(".joblib", ".versions.json"))
    data = json.loads(versions.read_text())
    versions.write_text(json.dumps({**data, "scikit_learn": "0.24.2"}))
    monkeypatch.setattr("joblib.load", lambda *a, **k: pytest.fail("unpickled a model of other versions"))
    with pytest.raises(ModelVersionError, match=r"scikit_learn saved '0.24.2'.*attn-dispatch calibrate"):
        load_model(identity, home=tmp_path)


def test_missing_or_unfitted(tmp_path):
    with pytest.raises(ModelVersionError, match="no saved cost model"):
        load_model(fake_identity("radeon_vii"), home=tmp_path)
    with pytest.raises(ValueError, match="fitted"):
        save_model(CostModel(), fake_identity("radeon_vii"), home=tmp_path)


def test_calibration_saves_the_fitted_model_beside_its_tables(tmp_path, monkeypatch):
    """The end of a calibration (`calibration.finish.fit_and_write`) keeps the cost model in the
    local cache, loadable with its versions checked."""
    from attn_dispatch.calibration.finish import fit_and_write
    from attn_dispatch.models.identity import DeviceIdentity
    from attn_dispatch.models.paths import tables_dir
    from tests.models.synthetic import synthetic_measurements

    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path))
    identity = DeviceIdentity.cpu()
    points = synthetic_measurements(8, seed=7)
    outcome = fit_and_write(points, identity, out=None, seed=0, wall_s=1.0)
    assert outcome.table_paths and outcome.table_paths[0].is_relative_to(tables_dir())
    assert outcome.model_path == model_path(identity) and outcome.model_path.parent == tmp_path / "models"
    model = load_model(identity)
    assert model.n_features_in_ > 0 and "not saved" not in outcome.note


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
