"""Where attn-dispatch keeps its per-user files (tables, journals, probe stores, tunings): under
``$ATTN_DISPATCH_HOME``, else ``platformdirs.user_cache_dir("attn-dispatch")``; directories made
on demand, files written atomically (`write_text_atomically`) with their library versions.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy
import torch

from attn_dispatch.models.environment import HOME

APP_NAME = "attn-dispatch"


def home(override: str | os.PathLike | None = None, *, create: bool = True) -> Path:
    """The root directory (`override` instead of the default; created unless `create` is False)."""
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


def journals_dir(override: str | os.PathLike | None = None) -> Path:
    """Calibration journals (JSON lines of measurements, optuna journals)."""
    return _sub("journals", override)


def cold_shape_dir(override: str | os.PathLike | None = None) -> Path:
    """Measured per-shape set-up costs of kernels (JSON, one file per device identity:
    `models.probe_store`)."""
    return _sub("cold_shape", override)


def tunings_dir(override: str | os.PathLike | None = None) -> Path:
    """First-call tunings the dispatcher keeps across processes (JSON lines, one file per device
    and kernel set: `dispatcher.measured_store`)."""
    return _sub("tunings", override)


def tuning_path(root, device_key: str, signature: str) -> Path:
    """One device's tunings of one kernel set (`signature`) under `root` (`tunings_dir`)."""
    return Path(root) / device_key / f"{signature}.jsonl"


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


def write_text_atomically(path: Path, text: str, *, mode: int | None = None) -> None:
    """`text` (UTF-8) to `path`, flushed to disk before the rename; `mode`: its permission bits
    (a temporary file is created 0600). The temporary file is removed if anything fails (also
    KeyboardInterrupt)."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        with open(temp, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
