"""`attn-dispatch build-fast-path`: compile the fast path's C++ entry point (`dispatcher.fast_path`)
for this torch and Python, under the home directory, where every later `Dispatcher` loads it."""

from __future__ import annotations

import argparse
import time

from attn_dispatch.dispatcher.commands._common import CommandError
from attn_dispatch.models.environment import FAST_PATH

NAME = "build-fast-path"
HELP = "compile the C++ fast path in front of the dispatcher (serves its PyTorch-SDPA plans with no Python frame)"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        NAME,
        help=HELP,
        description="Compile dispatcher/fast_call.cpp with torch's C++ extension loader (a C++17 compiler, Python's "
        "headers and ninja are needed; about 25 s on a 2-core CPU) into $ATTN_DISPATCH_HOME/fast_path/ (default: the "
        "user cache directory), building in a private temporary folder and installing the library with a manifest "
        "(size, sha256) that every later load checks. Every Dispatcher made afterwards with this torch and Python "
        "loads it; nothing is ever compiled during an attention call. An installed build that matches its manifest "
        "is kept. The runtime library never builds it by itself: run this once per torch install (`attn-dispatch "
        "calibrate` also does, at its end). Without it, warm calls take the Python path, about 1.5-3.5 us more per "
        "call than PyTorch's SDPA. `attn-dispatch devices` says whether it is loaded. ATTN_DISPATCH_FAST_PATH=0 turns "
        "it off.",
    )
    parser.add_argument("--home", default=None, metavar="DIR", help="home directory (default: $ATTN_DISPATCH_HOME or the "
                        "user cache directory)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.dispatcher import fast_path, fast_path_build

    started = time.perf_counter()
    try:
        path, compiled = fast_path_build.build(args.home)
    except RuntimeError as error:
        raise CommandError(str(error)) from None
    if compiled is None:
        print(f"the fast path is already built for this torch and Python (its manifest matches): {path}")
    else:
        print(f"built the fast path in {time.perf_counter() - started:.1f} s: {path}")
    if not fast_path.fast_path_enabled():
        print(f"note: it is not used now: {FAST_PATH.name}=0 is set, or this torch has no "
              "torch.compiler.substitute_in_graph (torch >= 2.5 is needed)")
    return 0


def build_after_calibration(home: str | None = None) -> str:
    """Best effort at the end of `attn-dispatch calibrate`: one line saying what happened (never raises)."""
    from attn_dispatch.dispatcher import fast_path

    if not fast_path.fast_path_enabled():
        return ""
    if fast_path.load(home) is not None:
        return "fast path: already built for this torch and Python"
    started = time.perf_counter()
    try:
        path = fast_path.build(home)
    except Exception as error:  # noqa: BLE001 - never fails the calibration
        return f"note: the fast path was not built ({error}); the Python path serves. Retry with `attn-dispatch {NAME}`"
    return f"fast path: built in {time.perf_counter() - started:.1f} s: {path}"
