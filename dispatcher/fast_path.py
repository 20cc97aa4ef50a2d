"""The fast path: a C builtin (`fast_call.cpp`) in front of `Dispatcher.attention` for the calls that
are PyTorch's own SDPA call.

Why: any Python function in front of ``F.scaled_dot_product_attention`` costs a frame, +0.56-0.98 us
on the H200 host for a bare pass-through, +1.47-2.07 us with one tensor guard (issue 14's floors),
12-15% of a settled decode step's 23-37 us call, where every plan is PyTorch's SDPA anyway. The
builtin reads the arguments from the vectorcall array, checks them against the dispatcher's hot
entries (`hot_path`) in C++ and, on a match, adds one to the plan's count and forwards the caller's
call unchanged to PyTorch's SDPA: no Python frame. Every other call is forwarded unchanged to
`Dispatcher.attention`.

When it serves (all must hold, else the Python path serves, as before): the call's entry is a hot
plan that is exactly the call's own SDPA call (`HotEntry.pytorch_call` and the plan's flags those of
the call); no dropout (or the float 0.0); not compiling (`torch.compiler._is_compiling_flag`); no
torch-function mode; query, key, value and the mask exactly ``torch.Tensor`` (no subclass, no
``CausalBias``), none nested; and per tensor the dispatch keys under the thread's state (inference
mode, autocast), dtype, device, sizes, strides and ``requires_grad`` those the entry recorded, as
`hot_path.tensor_guard` checks; the plan not at its settle point. A forwarded call that raises is
handed to `Dispatcher.attention` (whose recovery then runs: out of memory, restricted backends).

Where: `patching.install` and `hf.make_attention_function` use ``dispatcher.fast_attention``;
`Dispatcher.attention` stays the Python method. Under torch.compile, Dynamo inlines a Python
stand-in calling `Dispatcher.attention` (``torch._dynamo.substitute_in_graph``), so a compiled
model traces the dispatcher's choice as before.

Built, never inside a call: ``attn-dispatch build-fast-path`` (and, best effort, at the end of
``attn-dispatch calibrate``) compiles it with torch's C++ extension loader (a C++17 compiler,
Python headers and ninja) under ``<home>/fast_path/<name>``, the name keyed by the torch build,
the Python ABI and the source; a `Dispatcher` loads it only when that exact build exists (or is
already loaded in this process). ``ATTN_DISPATCH_FAST_PATH=0`` turns it off (read when a
`Dispatcher` is made); a torch without ``torch.compiler.substitute_in_graph`` (< 2.5) has none. A
dispatcher whose `fast_attention` was handed out lives as long as the process (Dynamo's stand-in
registry holds its callable).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa

if TYPE_CHECKING:
    from attn_dispatch.dispatcher._plan import Plan
    from attn_dispatch.dispatcher.core import Dispatcher

FAST_PATH_ENV = "ATTN_DISPATCH_FAST_PATH"
"""``0`` turns the fast path off (every call through `fast_attention` is `Dispatcher.attention`)."""

SOURCE = Path(__file__).with_name("fast_call.cpp")
BUILD_SUBDIR = "fast_path"
logger = logging.getLogger("attn_dispatch")
_loaded: dict[str, ModuleType] = {}  # module name -> the module, once per process
_lock = threading.Lock()


def fast_path_enabled() -> bool:
    """False where ``ATTN_DISPATCH_FAST_PATH`` is 0, false, no or off, or where this torch has no
    ``torch.compiler.substitute_in_graph`` (torch < 2.5: a compiled model would break its graph)."""
    if os.environ.get(FAST_PATH_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return hasattr(getattr(torch, "compiler", None), "substitute_in_graph")


@functools.cache
def module_name() -> str:
    """The extension's name: one per torch build, Python ABI and source text (read once a process)."""
    digest = hashlib.sha256()
    for part in (torch.__version__, str(torch.version.git_version), sys.implementation.cache_tag,
                 str(sysconfig.get_config_var("SOABI"))):
        digest.update(part.encode() + b"\0")
    digest.update(SOURCE.read_bytes())
    return f"attn_dispatch_fast_call_{digest.hexdigest()[:16]}"


def build_directory(home: str | os.PathLike | None = None, *, create: bool = True) -> Path:
    """``<home>/fast_path/<module_name()>`` (`models.paths.home`: ``ATTN_DISPATCH_HOME`` or the user cache)."""
    from attn_dispatch.models.paths import home as home_dir

    return home_dir(home, create=create) / BUILD_SUBDIR / module_name()


def library_path(home: str | os.PathLike | None = None) -> Path:
    """Where `build` leaves the shared library (torch's loader names it ``<name>.so``, ``.pyd`` on
    Windows); asking creates no folder."""
    return build_directory(home, create=False) / (module_name() + (".pyd" if sys.platform == "win32" else ".so"))


def build(home: str | os.PathLike | None = None, *, directory: str | os.PathLike | None = None) -> Path:
    """Compile the extension (torch's `cpp_extension.load`, `-O2`, no CUDA) into `directory`
    (default `build_directory(home)`), load it, and return the library's path. Raises RuntimeError
    naming what is missing (compiler, headers, ninja) when the build fails."""
    from torch.utils import cpp_extension

    name = module_name()
    where = Path(directory) if directory is not None else build_directory(home)
    where.mkdir(parents=True, exist_ok=True)
    _put_ninja_on_path()
    missing = missing_tool()
    if missing:
        raise RuntimeError(f"building the fast path failed: {missing}")
    try:
        module = cpp_extension.load(name=name, sources=[str(SOURCE)], build_directory=str(where),
                                    extra_cflags=["-O2"], with_cuda=False, verbose=False)
    except Exception as error:  # noqa: BLE001 - one line naming the cause
        raise RuntimeError(f"building the fast path failed: {_first_error(error)}") from error
    with _lock:
        _loaded[name] = module
    return Path(module.__file__)


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
    """torch's loader runs ``ninja`` from PATH: the PyPI wheel's (`ninja.BIN_DIR`) and this
    interpreter's scripts directory are added, for a virtual environment that is not activated."""
    extra = [os.path.dirname(sys.executable)]
    try:
        import ninja  # the PyPI wheel (a dependency)

        extra.insert(0, ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    path = os.environ.get("PATH", "").split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join([p for p in extra if p not in path] + path)


def _first_error(error: BaseException) -> str:
    """The compiler's first ``error:`` line in a failed build's output, else the error's first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    found = next((line for line in lines if "error:" in line or "not found" in line), None)
    return (found or (lines[0] if lines else type(error).__name__))[:300]


def load(home: str | os.PathLike | None = None) -> ModuleType | None:
    """The extension for this torch, Python and source: already loaded in this process, else the
    library under `home` when it was built there (imported by path: milliseconds), else None.
    Never compiles; anything failing to load gives None (a debug log line)."""
    name = module_name()
    module = _loaded.get(name)
    if module is not None:
        return module
    path = library_path(home)
    if not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for function in ("make", "make_entry", "set_entries", "hits"):
            getattr(module, function)
    except Exception as error:  # noqa: BLE001 - a broken or foreign library: the Python path serves
        logger.debug("attn_dispatch: fast path at %s not loaded (%s: %s)", path, type(error).__name__, error)
        return None
    with _lock:
        return _loaded.setdefault(name, module)


class FastPath:
    """One dispatcher's fast callable and its mirror of the hot path (`attach` makes it)."""

    def __init__(self, module: ModuleType, dispatcher: Dispatcher) -> None:
        self.module = module
        self.call = module.make(pytorch_sdpa, dispatcher.attention, getattr(torch, "compiler", None))
        self._dispatcher = dispatcher
        self._registered: bool | None = None  # the compile stand-in: None not tried, then whether it took

    @property
    def hits(self) -> int:
        """Calls served in C++ (no Python frame) so far."""
        return self.module.hits(self.call)

    def callable(self):
        """The fast callable, its torch.compile stand-in registered on first use; None where that
        fails (a graph would break on it: the caller uses `Dispatcher.attention`)."""
        if self._registered is None:
            self._registered = _register_stand_in(self.call, self._dispatcher)
        return self.call if self._registered else None

    def entry(self, plan: Plan, tensors: tuple[torch.Tensor, ...], is_causal: bool, enable_gqa: bool):
        """The C++ entry for a plan going hot, recorded from its call's tensors (query, key, value[,
        mask]) under the call's dispatch state; None where the fast path must not serve it: the plan
        is not exactly the call's own SDPA call."""
        flags = plan.sdpa_flags
        own = {name: True for name, on in (("is_causal", is_causal), ("enable_gqa", enable_gqa)) if on}
        if flags is None or flags != own or is_causal.__class__ is not bool or enable_gqa.__class__ is not bool:
            return None
        query, key, value = tensors[:3]
        mask = tensors[3] if len(tensors) > 3 else None
        try:
            return self.module.make_entry(query, key, value, mask, is_causal, enable_gqa, plan.count, plan.settle_at)
        except (TypeError, ValueError):
            return None

    def mirror(self, hot: tuple) -> None:
        """The C++ slots serve exactly `hot`'s entries that have a C++ entry, in its order."""
        self.module.set_entries(self.call, tuple(entry.fast for entry in hot if entry.fast is not None))


def attach(dispatcher: Dispatcher) -> FastPath | None:
    """`dispatcher`'s fast path, or None: turned off, unsupported by this torch, or not built."""
    if not fast_path_enabled():
        return None
    try:
        module = load(dispatcher.home)  # None where not built; raises only where the source is missing
        return None if module is None else FastPath(module, dispatcher)
    except Exception as error:  # noqa: BLE001 - a foreign library: the Python path serves
        logger.debug("attn_dispatch: fast path not made (%s: %s)", type(error).__name__, error)
        return None


_stand_in_targets: dict[int, Dispatcher] = {}  # `Dispatcher.compile_id` -> the dispatcher, for the stand-ins


def _register_stand_in(fast, dispatcher: Dispatcher) -> bool:
    """Dynamo cannot trace into a builtin: register a Python stand-in calling the dispatcher's
    `attention` (whose compile branch traces its choice). The stand-in finds the dispatcher in a
    module global by number: Dynamo inlines it with no source for its closure, so it could not
    wrap a closed-over bound method. False where this torch refuses it."""
    number = dispatcher.compile_id
    try:
        from torch._dynamo import substitute_in_graph

        def fast_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                           enable_gqa=False):
            return _stand_in_targets[number].attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                       scale=scale, enable_gqa=enable_gqa)

        _stand_in_targets[number] = dispatcher
        substitute_in_graph(fast, skip_signature_check=True)(fast_attention)
        return True
    except Exception as error:  # noqa: BLE001 - no stand-in: no fast path for this dispatcher
        _stand_in_targets.pop(number, None)
        logger.debug("attn_dispatch: fast path stand-in not registered (%s: %s)", type(error).__name__, error)
        return False
