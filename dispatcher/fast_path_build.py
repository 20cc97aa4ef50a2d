"""Building and installing the fast path's library (`fast_path`), and checking an installed one before it is
dlopened. Layout: ``<home>/fast_path/<name>/<name>.so`` and its manifest ``<name>.json`` (library size and sha256,
torch, Python ABI, source hash). Builds run in a private folder; the library is moved in atomically, then the
manifest, so a reader never sees a partial pair. Concurrent installs are serialised by `fcntl.flock` on
``install.lock`` (none on Windows)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import torch

from attn_dispatch.dispatcher.fast_path import (
    SOURCE,
    build_directory,
    library_path,
    manifest_path,
    module_name,
)
from attn_dispatch.models.paths import write_text_atomically

LOCK_NAME = "install.lock"
MANIFEST_MODE = 0o644  # readable by all, as the library is (mkstemp makes 0600)
MANIFEST_FORMAT = 1
"""Bumped when the manifest's fields change (another format is rejected)."""


@functools.cache
def build_key() -> dict[str, str]:
    """What the library is built for: torch build, Python ABI and source sha256."""
    return {"torch": torch.__version__, "torch_git": str(torch.version.git_version),
            "python_abi": f"{sys.implementation.cache_tag} {sysconfig.get_config_var('SOABI')}",
            "source_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest()}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def rejection(library: Path) -> str | None:
    """Why `library` must not be loaded: None where not built, "" where its manifest matches, else the reason."""
    manifest = manifest_path(library)
    if not library.is_file() or not manifest.is_file():
        return None
    try:
        recorded = json.loads(manifest.read_text())
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        return f"unreadable manifest {manifest.name}: {error}"
    if recorded.get("format") != MANIFEST_FORMAT:
        return f"manifest format {recorded.get('format')!r}, expected {MANIFEST_FORMAT}"
    for field, value in build_key().items():
        if recorded.get(field) != value:
            return f"built for {field} {recorded.get(field)!r}, this process has {value!r}"
    size = library.stat().st_size
    if recorded.get("size") != size:
        return f"{library.name} is {size} bytes, its manifest says {recorded.get('size')} (a partial or foreign file)"
    if recorded.get("sha256") != sha256_of(library):
        return f"{library.name}'s sha256 differs from its manifest's (a corrupt or foreign file)"
    return ""


def install(built: Path, library: Path) -> None:
    """Move `built` to `library` atomically, then write its manifest atomically (the old one removed first)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(manifest_path(library))
    size, sha256 = built.stat().st_size, sha256_of(built)
    with open(built, "rb") as file:
        os.fsync(file.fileno())
    os.replace(built, library)
    manifest = {"format": MANIFEST_FORMAT, "library": library.name, "size": size, "sha256": sha256, **build_key()}
    write_text_atomically(manifest_path(library), json.dumps(manifest, indent=1) + "\n", mode=MANIFEST_MODE)


@contextlib.contextmanager
def install_lock(folder: Path):
    """An exclusive `fcntl.flock` on ``folder/LOCK_NAME``, yielding True; without fcntl no lock, yielding False."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    with open(folder / LOCK_NAME, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def build(home: str | os.PathLike | None = None) -> tuple[Path, ModuleType | None]:
    """Compile and install the library under `home` unless a matching one is there: (installed path, module compiled
    now or None). RuntimeError naming what is missing on failure."""
    library = library_path(home)
    folder = build_directory(home)
    folder.mkdir(parents=True, exist_ok=True)
    with install_lock(folder) as locked:
        if rejection(library) == "":
            return library, None  # built meanwhile (another process) or before
        _put_ninja_on_path()
        missing = missing_tool()
        if missing:
            raise RuntimeError(f"building the fast path failed: {missing}")
        prefix = f".{module_name()}-build-"
        for left in folder.parent.glob(prefix + "*") if locked else ():  # a killed build's (we hold the lock)
            shutil.rmtree(left, ignore_errors=True)
        private = Path(tempfile.mkdtemp(prefix=prefix, dir=folder.parent))
        try:
            module = _compile(private)
            install(Path(module.__file__), library)
        finally:
            shutil.rmtree(private, ignore_errors=True)
    return library, module


def _compile(folder: Path) -> ModuleType:
    """torch's `cpp_extension.load` (`-O2`, no CUDA) into `folder`, under the plain module name."""
    from torch.utils import cpp_extension

    name = module_name()
    versions = getattr(getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None), "entries", None)
    if isinstance(versions, dict):  # a 2nd build in this process (another folder) would be renamed <name>_v1
        versions.pop(name, None)
    try:
        return cpp_extension.load(name=name, sources=[str(SOURCE)], build_directory=str(folder),
                                  extra_cflags=["-O2"], with_cuda=False, verbose=False)
    except Exception as error:  # noqa: BLE001 - one line naming the cause
        raise RuntimeError(f"building the fast path failed: {_first_error(error)}") from error


def missing_tool() -> str:
    """What the build lacks, in words (a C++ compiler, Python's headers, ninja), or ""."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler found ({compiler}: install g++ or clang, or set CXX)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "Python's C headers are missing (install python3-dev, or your Python's development headers)"
    if not cpp_extension.is_ninja_available():
        return "ninja is missing (pip install ninja, or your system's ninja-build)"
    return ""


def _put_ninja_on_path() -> None:
    """Add the ninja wheel's and this interpreter's script folders to PATH (torch's loader runs ``ninja``)."""
    extra = [os.path.dirname(sys.executable)]
    with contextlib.suppress(ImportError, AttributeError):
        import ninja  # the PyPI wheel (a dependency)

        extra.insert(0, ninja.BIN_DIR)
    path = os.environ.get("PATH", "").split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join([p for p in extra if p not in path] + path)


def _first_error(error: BaseException) -> str:
    """The compiler's first ``error:`` line in a failed build's output, else the error's first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    found = next((line for line in lines if "error:" in line or "not found" in line), None)
    return (found or (lines[0] if lines else type(error).__name__))[:300]
