"""The fast path builds itself: where a `Dispatcher` finds no usable library (`fast_path.attach`:
not built, or a rejected one), one background process runs ``attn-dispatch build-fast-path`` for
its home, and the dispatcher adopts the library when that process has finished.

Why: without the fast path the dispatcher is 1.08-1.68x slower than PyTorch's SDPA per decode token
at 1k keys on a 2-core CPU (torch 2.13, ``bench.decode_loop``), 0.90-1.06x with it; a user who never
runs the build command must get it too.

The build: ``python -c CHILD_CODE <marker>``, which lowers its own priority first (`NICENESS`; no
``preexec_fn``, unsafe with threads), then runs the command line's ``build-fast-path`` (`cli.main`)
with ``ATTN_DISPATCH_HOME`` the dispatcher's home, in its own session, its output in
``<home>/fast_path/<name>/autobuild.log``. Only where it can work: the fast path on, a C++ compiler,
Python's headers and ninja found (`missing_tool`); ``ATTN_DISPATCH_AUTO_BUILD=0`` turns it off.
One build per process per library; across processes one at a time per library (a marker file,
`fast_path_markers`), and none after one failed (a failure record, kept until an explicit build:
a compile error costs its 15-20 s once, not at every process). `fast_path_build` itself serialises
installs and installs atomically: the marker only spares a second compile.

Adoption (`adopt`), from the dispatcher's cold path (a new exact shape), never from a warm call:
once the child exited 0 and `fast_path.attach` gives a `FastPath`, the dispatcher takes it, its
hot slots are emptied (plans go hot again with C++ entries), the `patching`-installed SDPA and
every `hf` attention function (`follow_fast_path`) move to the fast callable. Nothing here raises
into a call: a failure is one debug log line and the Python path serves as before.

Cost, once per torch install and home: 15-20 s of one core (17.7 s at niceness 19 on the quiet 2-core
VM). While it runs, processes on the machine are slowed even so: on that VM a decode loop's attention
took 32-64 ms a token (pass medians, `bench.decode_loop`) instead of 0.6-0.8 ms during the build, with
niceness 19 or ``SCHED_IDLE`` alike (a ``SCHED_IDLE`` busy loop alone slowed nothing: not CPU time).
So a CPU process whose torch threads take every core does not build beside its own work: its
build starts when it exits, detached, and the next process loads the library (`builds_now`, `defer`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from attn_dispatch.dispatcher import fast_path, fast_path_build
from attn_dispatch.dispatcher.fast_path_markers import (
    claim,
    elsewhere,
    failure_of,
    is_stale,
    marker_path,
    read_marker,
    record_failure,
    remove_marker,
    write_marker,
)
from attn_dispatch.models.environment import AUTO_BUILD, HOME

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.core import Dispatcher

NICENESS = 19
"""Added to the child's niceness: the lowest priority, so the build takes the CPU time the model leaves."""
COMPILERS = ("c++", "g++", "clang++")
LOG_NAME = "autobuild.log"
CHILD_CODE = (f"import os; os.nice({NICENESS}) if hasattr(os, 'nice') else None; import sys; "
              "from attn_dispatch.dispatcher.fast_path_autobuild import run_child; sys.exit(run_child(sys.argv[1]))")
"""The child's program: lower its priority before importing anything (inherited by the compiler it
runs), then build (`run_child`). ``SCHED_IDLE`` was tried on top: no less slow-down of the parent's
decode loop on the 2-core VM (63.8 against 63.9 ms a token during the build), so niceness alone."""

logger = logging.getLogger("attn_dispatch")
_lock = threading.Lock()
_builds: dict[str, Build] = {}  # library path -> this process's build of it (never restarted)
_skipped: dict[str, str] = {}  # library path -> why no build was started (for `status`)
_deferred: dict[str, str | os.PathLike | None] = {}  # library path -> home, built when this process exits


@dataclass
class Build:
    """A background build of one library: this process's child (`start`), or another process's,
    watched through its marker (`process` None)."""

    process: subprocess.Popen | None
    pid: int
    marker: Path
    log: Path
    started: float  # time.time()
    returncode: int | None = None

    def finished(self) -> int | None:
        """The child's exit status once it has exited (its marker then removed); for another
        process's build, 0 once its marker is gone or stale (the library is then looked for); else None."""
        if self.returncode is None:
            if self.process is not None:
                code = self.process.poll()
                if code is not None:
                    remove_marker(self.marker, self.pid)
                    self.returncode = code
            elif not self.marker.exists() or is_stale(self.marker):
                self.returncode = 0
        return self.returncode


@dataclass
class Pending:
    """A dispatcher's wait for `build` (``Dispatcher._building``): whom to tell when it adopts the library."""

    build: Build
    listeners: list[Callable[[Callable], None]] = field(default_factory=list)
    adopting: threading.Lock = field(default_factory=threading.Lock)


def attach_or_build(dispatcher: Dispatcher) -> tuple[fast_path.FastPath | None, Pending | None]:
    """`dispatcher`'s fast path now (`fast_path.attach`), or None and the background build it waits
    for (None where none runs: turned off, no compiler, or this process's build failed)."""
    fast = fast_path.attach(dispatcher)
    if fast is not None or not fast_path.fast_path_enabled():
        return fast, None
    try:
        if not builds_now():
            defer(dispatcher.home)
            return None, None
        build = start(dispatcher.home)
    except Exception as error:  # noqa: BLE001 - never raises into the user's code: the Python path serves
        logger.debug("attn_dispatch: fast path auto-build not started (%s: %s)", type(error).__name__, error)
        return None, None
    return None, None if build is None or build.returncode not in (None, 0) else Pending(build)


def builds_now() -> bool:
    """Whether a build started now leaves this process's work alone: a process with a GPU (its
    model runs there; the host loop is one thread) or a CPU with a core that torch's threads leave
    free. Not a CPU process whose torch threads take every core: on the 2-core VM (2 threads) a build
    beside a decode loop slowed its tokens from 0.6-0.8 ms to 32-64 ms for the build's ~20 s, at
    niceness 19 or ``SCHED_IDLE`` alike; that process's library is built when it exits (`defer`)."""
    import torch

    return torch.cuda.is_available() or (os.cpu_count() or 1) > torch.get_num_threads()


def defer(home: str | os.PathLike | None = None) -> None:
    """Build `home`'s library when this interpreter exits (`start` from an `atexit` hook: a detached
    child, its own session, that outlives this process), for the next process to load; once per
    library. Switched off or impossible builds are reported as `start` reports them."""
    library = str(fast_path_build.library_path(home))
    with _lock:
        if library in _builds or library in _deferred:
            return
        reason = _why_no_build(Path(library))
        if reason:
            _skipped[library] = reason
            return
        if not _deferred:
            atexit.register(start_deferred)
        _deferred[library] = home


def start_deferred() -> None:
    """The `atexit` hook: start every deferred build (never raises: the interpreter is exiting)."""
    with _lock:
        homes = list(_deferred.values())
        _deferred.clear()
    for home in homes:
        try:
            if fast_path_build.rejection(fast_path_build.library_path(home)) == "":
                continue  # built meanwhile (by `calibrate`'s end, another process): nothing to start
            start(home)
        except Exception as error:  # noqa: BLE001 - at exit: nothing to report to
            logger.debug("attn_dispatch: deferred fast path build not started (%s: %s)", type(error).__name__, error)


def start(home: str | os.PathLike | None = None) -> Build | None:
    """This process's background build for `home`'s library: started now unless one was (even a
    failed one: never retried), or None where none may start (the reason kept for `status`)."""
    library = fast_path_build.library_path(home)
    with _lock:
        if str(library) in _builds:
            return _builds[str(library)]
        reason = _why_no_build(library)
        if reason:
            _skipped[str(library)] = reason
            return None
        folder = fast_path_build.build_directory(home)
        folder.mkdir(parents=True, exist_ok=True)
        marker, log = marker_path(library), folder / LOG_NAME
        if not claim(marker):  # another process builds it: watched, adopted when its marker goes
            recorded = read_marker(marker) or (0, time.time())
            build = _builds[str(library)] = Build(None, recorded[0], marker, log, recorded[1])
            return build
        try:
            with open(log, "ab") as output:  # appended: an interrupted build's lines stay
                process = subprocess.Popen(
                    build_command(marker), env=_child_environment(home), stdin=subprocess.DEVNULL, stdout=output,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        except OSError:
            remove_marker(marker, os.getpid())
            raise
        started = time.time()
        write_marker(marker, process.pid, started)
        build = _builds[str(library)] = Build(process, process.pid, marker, log, started)
        _skipped.pop(str(library), None)
    logger.debug("attn_dispatch: building the fast path in the background (pid %d, log %s)", process.pid, log)
    return build


def _why_no_build(library: Path) -> str:
    """Why no build of `library` may start, in words ("" where one may): turned off, a tool missing,
    or the last background build failed (`fast_path_markers.record_failure`: not retried until an
    explicit build clears it)."""
    if not AUTO_BUILD.read():
        return f"turned off by {AUTO_BUILD.name}=0"
    failed = failure_of(library)
    if failed is not None:
        return f"the last background build failed, {failed}: see {library.parent / LOG_NAME}"
    return missing_tool()


def build_command(marker: Path) -> list[str]:
    """The child's command line (tests stand in a cheap one)."""
    return [sys.executable, "-c", CHILD_CODE, str(marker)]


def run_child(marker: str) -> int:
    """In the child: ``attn-dispatch build-fast-path`` (`cli.main`, as the command line runs it), its
    marker removed at the end."""
    from attn_dispatch.dispatcher.cli import main

    code = 1
    try:
        code = main([fast_path.BUILD_COMMAND])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    finally:
        if code:  # kept for every process: none starts another until an explicit build (`fast_path.build`)
            record_failure(fast_path_build.library_path(), code)
        remove_marker(Path(marker), os.getpid())
    return code


def missing_tool() -> str:
    """Why a build cannot work here, in words, or "": a C++ compiler (``CXX``, else one of
    `COMPILERS` on PATH), Python's headers and ninja (on PATH, in this interpreter's scripts folder
    or from the ninja wheel: where the build looks; found without running it)."""
    if not _compiler():
        return f"no C++ compiler found (none of CXX, {', '.join(COMPILERS)})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "Python's C headers are missing"
    if shutil.which("ninja", path=os.pathsep.join(_ninja_dirs() + [os.environ.get("PATH", "")])) is None:
        return "ninja is missing"
    return ""


def _compiler() -> str | None:
    given = os.environ.get("CXX")
    if given:
        return given if shutil.which(given) else None
    return next((name for name in COMPILERS if shutil.which(name)), None)


def _ninja_dirs() -> list[str]:
    dirs = [os.path.dirname(sys.executable)]
    with contextlib.suppress(ImportError, AttributeError):
        import ninja

        dirs.append(str(ninja.BIN_DIR))
    return dirs


def _child_environment(home: str | os.PathLike | None) -> dict[str, str]:
    """The child's: this process's, with the dispatcher's home, and ``CXX`` where only g++ or clang++
    exists (torch's loader runs ``c++`` otherwise)."""
    from attn_dispatch.models.paths import home as home_dir

    environment = {**os.environ, HOME.name: str(home_dir(home))}
    if not environment.get("CXX") and shutil.which("c++") is None:
        environment["CXX"] = _compiler() or "c++"
    return environment


def adopt(dispatcher: Dispatcher) -> None:
    """From the cold path of a dispatcher waiting for a build (``_building`` not None): once the child
    exited 0 and the library attaches, the dispatcher serves through it (its hot slots emptied,
    SDPA as `patching` installed it and every `follow_fast_path` listener rebound); a failed build
    or library: it stops waiting and the Python path serves on. Never raises."""
    pending = dispatcher._building
    if pending is None or pending.build.finished() is None or not pending.adopting.acquire(blocking=False):
        return
    try:
        fast = fast_path.attach(dispatcher) if pending.build.returncode == 0 else None
        call = None if fast is None else (fast.callable() or dispatcher.attention)  # stand-in registered unlocked
        with dispatcher._lock:
            if dispatcher._building is not pending:
                return
            dispatcher._building = None
            if fast is None:
                return
            dispatcher._fast = fast
            dispatcher._set_hot(())  # plans go hot again, now with C++ entries
            for listener in pending.listeners:
                listener(call)
        patching = sys.modules.get("attn_dispatch.dispatcher.patching")
        if patching is not None:
            patching.rebind(dispatcher, call)
    except Exception as error:  # noqa: BLE001 - never raises into a call: the Python path serves
        logger.debug("attn_dispatch: fast path not adopted (%s: %s)", type(error).__name__, error)
        dispatcher._building = None
    finally:
        pending.adopting.release()


def follow_fast_path(dispatcher, rebind: Callable[[Callable], None]) -> None:
    """Call ``rebind(dispatcher.fast_attention)`` now, and again when the dispatcher adopts a
    background build's library (`adopt`); an object with only ``attention`` gets that."""
    lock = getattr(dispatcher, "_lock", None)
    with lock if lock is not None else contextlib.nullcontext():
        pending = getattr(dispatcher, "_building", None)
        if pending is not None:
            pending.listeners.append(rebind)
        rebind(getattr(dispatcher, "fast_attention", None) or dispatcher.attention)


def status(home: str | os.PathLike | None = None, *, skipped: bool = True) -> str | None:
    """`fast_path.status`'s line where no library is loaded and there is a build to speak of: this
    process's (running or failed), another process's (running or interrupted: its marker), or (with
    `skipped`) why none starts (turned off, a tool missing, a failure recorded); else None."""
    fix = f"run `attn-dispatch {fast_path.BUILD_COMMAND}`"
    library = str(fast_path_build.library_path(home))
    if skipped and library in _deferred:
        return (f"not built yet: builds in the background when this process exits (its torch threads "
                f"take every core: a build now would slow them); or {fix}")
    build = _builds.get(library)
    if build is not None:
        code = build.finished()
        if code is None:
            since = time.strftime("%H:%M:%S", time.localtime(build.started))
            by = "" if build.process is not None else " by another process" + (f" (pid {build.pid})" if build.pid else "")
            return f"not built yet: building in the background{by} since {since}, log: {build.log}"
        if code != 0:
            return f"not built: auto-build failed (see {build.log}); {fix}"
        return None
    other = elsewhere(Path(library))  # another process's build, running or interrupted
    if other is not None:
        return f"not built yet: {other}, log: {Path(library).parent / LOG_NAME}; or {fix}"
    reason = (_skipped.get(library) or _why_no_build(Path(library))) if skipped else None
    return f"not built: no auto-build ({reason}); {fix}" if reason else None
