"""Where attn-dispatch keeps its per-user files: threshold tables, fitted cost models,
calibration journals and the dispatcher's first-call tunings.

The root is ``$ATTN_DISPATCH_HOME`` when set, else the platform's per-user cache directory
(``platformdirs.user_cache_dir("attn-dispatch")``, e.g. ``~/.cache/attn-dispatch`` on Linux).
Directories are created on demand.
"""

from __future__ import annotations

import os
from pathlib import Path

from attn_dispatch.models.environment import HOME

APP_NAME = "attn-dispatch"


def home(override: str | os.PathLike | None = None, *, create: bool = True) -> Path:
    """The root directory (created if missing, unless `create` is False: read-only lookups).

    Parameters
    ----------
    override: use this directory instead of the environment / platform default (tests).
    """
    root = Path(override) if override is not None else HOME.read()
    if root is None:
        import platformdirs  # imported here: a process that sets ATTN_DISPATCH_HOME never needs it

        root = Path(platformdirs.user_cache_dir(APP_NAME))
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return root


def _sub(name: str, override: str | os.PathLike | None, create: bool = True) -> Path:
    path = home(override, create=create) / name
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def tables_dir(override: str | os.PathLike | None = None, *, create: bool = True) -> Path:
    """Threshold tables (JSON), one sub-directory per card model (`create=False`: only its path,
    for lookups that must not write, such as `attn-dispatch devices`)."""
    return _sub("tables", override, create)


def models_dir(override: str | os.PathLike | None = None) -> Path:
    """Fitted cost models (joblib, local only: never shared, never loaded from elsewhere):
    calibration saves the card's model here (`models.persist.save_model`)."""
    return _sub("models", override)


def journals_dir(override: str | os.PathLike | None = None) -> Path:
    """Calibration journals (JSON lines of measurements, optuna journals)."""
    return _sub("journals", override)


def cold_shape_dir(override: str | os.PathLike | None = None) -> Path:
    """Measured per-shape set-up costs of kernels (JSON, one file per device identity:
    `models.cold_shape_store`)."""
    return _sub("cold_shape", override)


def tunings_dir(override: str | os.PathLike | None = None) -> Path:
    """First-call tunings the dispatcher keeps across processes (JSON lines, one file per device
    and kernel set: `dispatcher.measured_store`)."""
    return _sub("tunings", override)
