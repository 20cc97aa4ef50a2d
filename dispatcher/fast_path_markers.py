"""Files next to the fast path's library that background builds (`fast_path_autobuild`) leave for
every process of the machine: ``<name>.building`` while one runs, ``<name>.failed`` after one failed.

``<name>.building`` is created exclusively (``O_CREAT|O_EXCL``) and holds the builder's pid and start
time: at most one build per library at a time across processes. A dead builder's marker, or one
older than `STALE_AFTER_S`, is replaced under a short lock, so two processes never both replace it.
``<name>.failed`` holds when and how the last background build failed: no process starts another
until ``attn-dispatch build-fast-path`` (or any explicit build, `clear_failure`) clears it, so a
compile error does not cost every later process its 15-20 s of CPU again.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from attn_dispatch.dispatcher import fast_path_build

MARKER_SUFFIX = ".building"
FAILED_SUFFIX = ".failed"
STALE_AFTER_S = 600.0
"""A marker this old is a builder that hung or whose pid was reused: the build took 15-27 s on a quiet
2-core VM and 79 s at a load of 5 (14.7-18.3 s as a niceness-19 child beside a decode loop), so 10
minutes is ~8x the slowest seen."""


def marker_path(library: Path) -> Path:
    return library.with_name(library.stem + MARKER_SUFFIX)


def failure_path(library: Path) -> Path:
    return library.with_name(library.stem + FAILED_SUFFIX)


def claim(marker: Path) -> bool:
    """Create `marker` exclusively (this pid for now; the builder's is written once started),
    replacing a stale one (`is_stale`) under a short lock; False where another builder holds it."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    with fast_path_build.install_lock(marker.parent, marker.name + ".lock"):
        if marker.exists() and is_stale(marker):
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()
        try:
            descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w") as file:
            file.write(f"{os.getpid()} {time.time()}\n")
    return True


def write_marker(marker: Path, pid: int, started: float) -> None:
    with contextlib.suppress(OSError):
        marker.write_text(f"{pid} {started}\n")


def read_marker(marker: Path) -> tuple[int, float] | None:
    """(pid, start time) from `marker`, or None: gone, or not written yet (its mtime then says how old)."""
    try:
        pid, started = marker.read_text().split()
        return int(pid), float(started)
    except (OSError, ValueError):
        return None


def is_stale(marker: Path) -> bool:
    """Its builder is dead, or it is older than `STALE_AFTER_S`."""
    recorded = read_marker(marker)
    try:
        started = recorded[1] if recorded else marker.stat().st_mtime
    except OSError:
        return False  # removed meanwhile: nothing to replace
    if time.time() - started > STALE_AFTER_S:
        return True
    return recorded is not None and not _alive(recorded[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    except OSError:
        return False
    return True


def remove_marker(marker: Path, pid: int) -> None:
    """Remove `marker` if it is `pid`'s (a replaced marker belongs to another builder)."""
    recorded = read_marker(marker)
    if recorded is not None and recorded[0] == pid:
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()


def record_failure(library: Path, code: int) -> None:
    """Write `library`'s failure record: the build exited with `code`."""
    with contextlib.suppress(OSError):
        failure_path(library).write_text(f"exit {code} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")


def failure_of(library: Path) -> str | None:
    """The last background build's failure (its record's text), or None where none is recorded."""
    try:
        return failure_path(library).read_text().strip() or "failed"
    except OSError:
        return None


def clear_failure(library: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        failure_path(library).unlink()


def elsewhere(library: Path) -> str | None:
    """What another process's build of `library` left, in words, or None: one running now (its pid
    and start time), or one interrupted (a stale marker: the next build replaces it)."""
    marker = marker_path(library)
    if not marker.exists():
        return None
    recorded = read_marker(marker)
    pid = f" (pid {recorded[0]})" if recorded else ""
    if is_stale(marker):
        return f"a background build was interrupted{pid}; the next dispatcher starts another"
    since = time.strftime("%H:%M:%S", time.localtime(recorded[1])) if recorded else "?"
    return f"building in the background by another process{pid} since {since}"
