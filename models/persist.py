"""Saving and loading a fitted cost model in the local cache (joblib), with library versions.

A saved model is a pickle: it is written and read only under `models.paths.models_dir()`,
never shared (tables are what is shared) and never loaded from anywhere else. The versions it
was saved with sit beside it as JSON and are checked *before* anything is unpickled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import joblib

from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.paths import model_versions, models_dir, replace_atomically

MODEL_SUFFIX = ".joblib"
VERSIONS_SUFFIX = ".versions.json"
MAX_VERSIONS_BYTES = 64 * 1024  # the versions file is a handful of short strings


class ModelVersionError(RuntimeError):
    """A saved cost model was written by other library versions (or is missing)."""


def model_path(identity: DeviceIdentity, *, home: str | os.PathLike | None = None) -> Path:
    """Where `identity`'s cost model lives (``<models_dir>/<identity.key>.joblib``)."""
    return models_dir(home) / f"{identity.key}{MODEL_SUFFIX}"


def save_model(model: CostModel, identity: DeviceIdentity, *, home: str | os.PathLike | None = None) -> Path:
    """Store a fitted model for `identity` in the local cache; returns its path."""
    if not hasattr(model, "estimator_"):
        raise ValueError("save_model needs a fitted CostModel: call fit (or run `attn-dispatch calibrate`) first")
    path = model_path(identity, home=home)
    versions = {**model_versions(), "identity_key": identity.key}
    replace_atomically(path, lambda temp: joblib.dump(model, temp))
    versions_path = path.with_name(path.name[: -len(MODEL_SUFFIX)] + VERSIONS_SUFFIX)
    replace_atomically(versions_path, lambda temp: Path(temp).write_text(json.dumps(versions, indent=1) + "\n"))
    return path


def load_model(identity: DeviceIdentity, *, home: str | os.PathLike | None = None) -> CostModel:
    """Load `identity`'s model from the local cache, after checking its library versions.

    Raises
    ------
    ModelVersionError
        When there is no saved model, or it was saved with other scikit-learn / numpy / joblib
        versions or another model format (re-fit it: `attn-dispatch calibrate`).
    """
    path = model_path(identity, home=home)
    versions_path = path.with_name(path.name[: -len(MODEL_SUFFIX)] + VERSIONS_SUFFIX)
    if not path.is_file() or not versions_path.is_file():
        raise ModelVersionError(f"no saved cost model for {identity.model_key} at {path}; run `attn-dispatch calibrate`")
    if path.resolve().parent != models_dir(home).resolve():
        raise ModelVersionError(f"{path} does not resolve inside the local model cache; refusing to unpickle it")
    raw = versions_path.read_bytes()[:MAX_VERSIONS_BYTES]
    try:
        saved = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        saved = None
    if not isinstance(saved, dict):
        raise ModelVersionError(f"{versions_path} is unreadable; delete it and {path}, then run `attn-dispatch calibrate`")
    current = model_versions()
    mismatched = {key: (saved.get(key), value) for key, value in current.items() if saved.get(key) != value}
    if mismatched:
        detail = ", ".join(f"{key} saved {old!r} != running {new!r}" for key, (old, new) in mismatched.items())
        raise ModelVersionError(
            f"the saved cost model at {path} was written by other library versions ({detail}); "
            "re-fit it from the stored measurements or run `attn-dispatch calibrate` again"
        )
    model = joblib.load(path)
    if not isinstance(model, CostModel):
        raise ModelVersionError(f"{path} does not hold a CostModel; delete it and run `attn-dispatch calibrate`")
    return model
