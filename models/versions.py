"""The library versions a table or a saved cost model records (and checks on load)."""

from __future__ import annotations

import platform
from importlib import metadata

import joblib
import numpy
import sklearn
import torch

MODEL_FORMAT = 1
"""Version of the saved-cost-model layout (`models.persist`); bump when features change."""


def package_version() -> str:
    try:
        return metadata.version("attn-dispatch")
    except metadata.PackageNotFoundError:
        return "unknown"


def software_versions() -> dict[str, str]:
    """``{"attn_dispatch", "torch", "numpy", "scikit_learn", "joblib", "python"}`` -> version."""
    return {
        "attn_dispatch": package_version(), "torch": torch.__version__, "numpy": numpy.__version__,
        "scikit_learn": sklearn.__version__, "joblib": joblib.__version__, "python": platform.python_version(),
    }


def model_versions() -> dict[str, str]:
    """What must match for a pickled cost model to be trusted: its libraries and our format."""
    versions = software_versions()
    return {
        "scikit_learn": versions["scikit_learn"], "numpy": versions["numpy"], "joblib": versions["joblib"],
        "model_format": str(MODEL_FORMAT),
    }
