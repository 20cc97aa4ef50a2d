"""The library versions a table or a saved cost model records (and checks on load)."""

from __future__ import annotations

import importlib
import platform
import sys
from importlib import metadata

import numpy
import torch

MODEL_FORMAT = 2
"""Version of the saved-cost-model layout (`models.persist`); bump when features change (2: the
prior's version 2, `models.priors.PRIOR_VERSION`)."""


def package_version() -> str:
    try:
        return metadata.version("attn-dispatch")
    except metadata.PackageNotFoundError:
        return "unknown"


def _module_version(module: str, distribution: str) -> str:
    """`module.__version__` where it is imported, else the installed distribution's version (the
    same string, read without importing scikit-learn's ~1.5 s on an inference process's first call)."""
    if module in sys.modules:
        return sys.modules[module].__version__
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return importlib.import_module(module).__version__


def software_versions() -> dict[str, str]:
    """``{"attn_dispatch", "torch", "numpy", "scikit_learn", "joblib", "python"}`` -> version."""
    return {
        "attn_dispatch": package_version(), "torch": torch.__version__, "numpy": numpy.__version__,
        "scikit_learn": _module_version("sklearn", "scikit-learn"), "joblib": _module_version("joblib", "joblib"),
        "python": platform.python_version(),
    }


def model_versions() -> dict[str, str]:
    """What must match for a pickled cost model to be trusted: its libraries and our format."""
    versions = software_versions()
    return {
        "scikit_learn": versions["scikit_learn"], "numpy": versions["numpy"], "joblib": versions["joblib"],
        "model_format": str(MODEL_FORMAT),
    }
