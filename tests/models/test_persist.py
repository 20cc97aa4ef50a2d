"""The local cost-model cache: joblib with library versions checked before unpickling."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.cost_model import CostModel
from models.persist import ModelVersionError, load_model, model_path, save_model
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
