"""The fast path: a C builtin (`fast_call.cpp`) in front of `Dispatcher.attention` for the calls that
are PyTorch's own SDPA call or one fused backend's ATen operator call.

Any Python function in front of ``F.scaled_dot_product_attention`` costs a frame, a large share of
a settled decode step's call where every plan is PyTorch's SDPA anyway (docs/RESULTS.md#warm-parity).
The builtin reads the arguments from the vectorcall array, checks them against the dispatcher's hot
entries (`hot_path`) in C++ and, on a match, adds one to the plan's count and makes the call's own
SDPA call: no Python frame. It calls ATen's SDPA as PyTorch's Python binding does (the GIL released,
C++ warnings raised as Python warnings) but without the binding's argument parser, whose work the
builtin's checks have already done; a ``scale`` that is neither absent, None nor a float is
forwarded unchanged to PyTorch's SDPA instead. Every other call is forwarded unchanged to
`Dispatcher.attention`.

A hot plan that runs a fused backend's operator bare (`kernels.sdpa_backends.BareCall`: flash,
memory-efficient or cuDNN with no mask, GQA native or folded into rows) is served the same way: the
builtin makes that operator call through ATen, with the GIL released as PyTorch's bindings release
it. Such an entry also requires a float or no ``scale`` and every SDPA backend switched on (`sdpa_kernel`
restrictions are `sdpa_context.route`'s).

An entry may serve a range of key lengths (`hot_path`): every length over which the plan's
bucket would give a new shape the same call, so a decode loop's next token is served with no Python
either; the key and value then match in everything but that length and their strides, which are
compared as the plan's key reads them (contiguity) and as the operators do (the last one).

When it serves (all must hold, else the Python path serves, as before): the call's entry is a hot
plan that is exactly the call's own SDPA call (`HotEntry.pytorch_call` and the plan's flags those of
the call) or a bare operator call; no dropout (or the float 0.0); not compiling
(`torch.compiler._is_compiling_flag`); no torch-function mode; query, key, value and the mask
exactly ``torch.Tensor`` (no subclass, no ``CausalBias``), none nested; and per tensor the dispatch
keys under the thread's state (inference mode, autocast), dtype, device, sizes, strides and
``requires_grad`` those the entry recorded, as `hot_path.tensor_guard` checks; the plan not at its
settle point. A forwarded call that raises is handed to `Dispatcher.attention` (whose recovery then
runs: out of memory, restricted backends).

Where: `attn_dispatch.attention` (the default dispatcher's), `patching.install` and
`hf.make_attention_function` use ``dispatcher.fast_attention``; `Dispatcher.attention` stays the
Python method (the callable hands it every call it does not serve). Under torch.compile, Dynamo inlines a Python
stand-in calling `Dispatcher.attention` (``torch._dynamo.substitute_in_graph``), so a compiled
model traces the dispatcher's choice as before.

Built only where the user asks, never by the runtime library: ``attn-dispatch build-fast-path`` and,
best effort, the end of ``attn-dispatch calibrate`` compile it with torch's C++ extension loader (a
C++17 compiler, Python headers and ninja) in a private folder and install it, with a manifest (size, sha256),
under ``<home>/fast_path/<name>`` (`fast_path_build`), the name keyed by the torch build, the Python
ABI and the source; a `Dispatcher` loads it only when that exact build is installed and matches its
manifest (or is already loaded in this process): a partial or foreign file is never dlopened.
`status` says in one line which of these holds (``attn-dispatch devices`` shows it).
``ATTN_DISPATCH_FAST_PATH=0`` turns it off (read when a `Dispatcher` is made); a torch without
``torch.compiler.substitute_in_graph`` (< 2.5) has none. A dispatcher whose `fast_attention` was
handed out lives as long as the process (Dynamo's stand-in
registry holds its callable).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import sys
import sysconfig
import threading
import weakref
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from attn_dispatch.dispatcher.compiled import when_imported
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from attn_dispatch.models.environment import FAST_PATH

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.core import Dispatcher
    from attn_dispatch.dispatcher.plans import Plan

SOURCE = Path(__file__).with_name("fast_call.cpp")
BUILD_SUBDIR = "fast_path"
BUILD_COMMAND = "build-fast-path"
WITHOUT_IT = ("without it, calls the fast path would serve take the Python path: about 1.5-3.5 us more per call "
              "than PyTorch's SDPA on the CPU and on an H200's host (docs/RESULTS.md#warm-parity)")
"""What a user without the fast path loses, as `status` and ``attn-dispatch devices`` say it: the
Python hot path's extra over SDPA (+1.1 to +2.8 us on the dev VM's CPU, +2.0 to +3.2 us on the
H200's host) against the fast path's (-0.5 to -0.1 us), `bench.dispatch_overhead`."""
logger = logging.getLogger("attn_dispatch")
_loaded: dict[str, tuple[ModuleType, Path]] = {}  # module name -> the module and its library, once per process
_checks: dict[tuple, str] = {}  # the library's and manifest's (path, inode, size, mtime) -> `rejection`
_rejected: dict[str, str] = {}  # library path -> why it was not loaded (for `status`)
_made: weakref.WeakSet[FastPath] = weakref.WeakSet()  # every live dispatcher's fast path (`status` sums hits)
_lock = threading.Lock()


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
    """Where the installed library lives (``<name>.so``, ``.pyd`` on Windows); asking creates no folder."""
    return build_directory(home, create=False) / (module_name() + (".pyd" if sys.platform == "win32" else ".so"))


def manifest_path(library: Path) -> Path:
    """The manifest next to `library` (``<name>.json``)."""
    return library.with_suffix(".json")


def fast_path_enabled() -> bool:
    """False where ``ATTN_DISPATCH_FAST_PATH`` is 0, false, no or off, or where this torch has no
    ``torch.compiler.substitute_in_graph`` (torch < 2.5: a compiled model would break its graph)."""
    return not _turned_off() and _torch_supports()


def _turned_off() -> bool:
    return not FAST_PATH.read()


def _torch_supports() -> bool:
    return hasattr(getattr(torch, "compiler", None), "substitute_in_graph")


def build(home: str | os.PathLike | None = None) -> Path:
    """Compile the extension into a private folder and install it under `home` (`fast_path_build`;
    an installed library that matches its manifest is reused), load it, and return the installed
    library's path. Raises RuntimeError naming what is missing (compiler, headers, ninja)."""
    from attn_dispatch.dispatcher import fast_path_build

    library, module = fast_path_build.build(home)
    if module is None:
        module = load(home)
        if module is None:
            raise RuntimeError(f"the fast path at {library} did not load: {_rejected.get(str(library), 'unknown')}")
    with _lock:
        _loaded.setdefault(module_name(), (module, library))
    return library


def load(home: str | os.PathLike | None = None) -> ModuleType | None:
    """The extension for this torch, Python and source: already loaded in this process, else the
    library under `home` when it was installed there and matches its manifest (size, sha256: a
    partial or foreign file is never dlopened), imported by path (milliseconds), else None.
    Never compiles; a rejected library gives None, a debug log line and its reason for `status`."""
    name = module_name()
    loaded = _loaded.get(name)
    if loaded is not None:
        return loaded[0]
    path = library_path(home)
    reason = _checked_rejection(path)
    if reason is None:
        return None
    if not reason:
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            for function in ("make", "make_entry", "set_entries", "hits"):
                getattr(module, function)
        except Exception as error:  # noqa: BLE001 - a broken or foreign library: the Python path serves
            reason = f"{type(error).__name__}: {error}"
    if reason:
        logger.debug("attn_dispatch: fast path at %s not loaded (%s)", path, reason)
        _rejected[str(path)] = reason
        return None
    with _lock:
        return _loaded.setdefault(name, (module, path))[0]


def _checked_rejection(path: Path) -> str | None:
    """`fast_path_build.rejection`, once per process per version of the library and its manifest
    (path, inode, size, mtime of each); "not built" is never kept (an install may be half done)."""
    try:
        version = tuple((str(file), stat.st_ino, stat.st_size, stat.st_mtime_ns)
                        for file in (path, manifest_path(path)) for stat in [file.stat()])
    except OSError:
        return None
    if version not in _checks:
        from attn_dispatch.dispatcher.fast_path_build import rejection

        reason = rejection(path)
        if reason is None:
            return None
        _checks[version] = reason
    return _checks[version]


def status(home: str | os.PathLike | None = None) -> str:
    """One line for users: whether this process serves through the fast path, and what to do if not."""
    if _turned_off():
        return f"off ({FAST_PATH.name}=0)"
    if not _torch_supports():
        return "unavailable on torch < 2.5 (no torch.compiler.substitute_in_graph)"
    fix = f"run `attn-dispatch {BUILD_COMMAND}`"
    try:
        module = load(home)
    except Exception as error:  # noqa: BLE001 - a status line never raises
        return f"not loaded ({type(error).__name__}: {error})"
    if module is not None:
        path = _loaded[module_name()][1]
        served = sum(_hits_or_none(fast) or 0 for fast in list(_made))
        return f"loaded {path} ({served} calls served in C++ by this process's dispatchers)"
    reason = _rejected.get(str(library_path(home)))
    if reason is None or _checked_rejection(library_path(home)) is None:
        return f"not built: {fix} ({WITHOUT_IT})"
    return f"built library rejected ({reason}): {fix} ({WITHOUT_IT})"


def _hits_or_none(fast: FastPath) -> int | None:
    """`fast.hits`, or None where its module refuses its callable: a status line never raises. Seen
    only where tests import the library again from two paths in one process (re-importing a
    single-phase extension refills the module in ``sys.modules`` with the first library's functions)."""
    try:
        return fast.hits
    except TypeError:
        return None


class FastPath:
    """One dispatcher's fast callable and its mirror of the hot path (`attach` makes it)."""

    def __init__(self, module: ModuleType, dispatcher: Dispatcher) -> None:
        self.module = module
        direct = pytorch_sdpa is torch._C._nn.scaled_dot_product_attention  # else tests' stand-in: call it
        self.call = module.make(pytorch_sdpa, dispatcher.attention, getattr(torch, "compiler", None), direct)
        self._dispatcher = dispatcher
        self._registered = False  # the compile stand-in: registered once Dynamo is imported (`callable`)
        _made.add(self)

    @property
    def hits(self) -> int:
        """Calls served in C++ (no Python frame) so far."""
        return self.module.hits(self.call)

    def callable(self):
        """The fast callable. Its torch.compile stand-in is registered when Dynamo is imported
        (`compiled.when_imported`: at once where it already is), so handing it out imports no
        compiler stack; where this torch refuses the stand-in, a compiled graph breaks on the callable
        and runs it eagerly (one warning in the log)."""
        if not self._registered:
            self._registered = True
            when_imported("torch._dynamo", lambda _: _register_stand_in(self.call, self._dispatcher))
        return self.call

    def entry(self, plan: Plan, tensors: tuple[torch.Tensor, ...], is_causal: bool, enable_gqa: bool,
              key_lengths: tuple[int, int] | None = None):
        """The C++ entry for a plan going hot, recorded from its call's tensors (query, key, value[,
        mask]) under the call's dispatch state, serving the key lengths `key_lengths` (lowest,
        highest; None: the call's own); None where the fast path must not serve it: the plan is
        neither exactly the call's own SDPA call nor a bare operator call (`served_call`)."""
        if is_causal.__class__ is not bool or enable_gqa.__class__ is not bool:
            return None
        served = served_call(plan, tensors, is_causal, enable_gqa)
        if served is None:
            return None
        op, rows, out_shape = served
        query, key, value = tensors[:3]
        mask = tensors[3] if len(tensors) > 3 else None
        length = key.shape[-2] if key.dim() >= 2 else 0
        low, high = key_lengths or (length, length)
        try:
            return self.module.make_entry(query, key, value, mask, is_causal, enable_gqa, plan.count, plan.settle_at,
                                          op, rows, out_shape, low, high)
        except (TypeError, ValueError):
            return None

    def mirror(self, hot: tuple) -> None:
        """The C++ slots serve exactly `hot`'s entries that have a C++ entry, in its order."""
        self.module.set_entries(self.call, tuple(entry.fast for entry in hot if entry.fast is not None))


OPS = {"forward": 0, "flash": 1, "flash_cpu": 2, "efficient": 3, "cudnn": 4}
"""What a C++ entry runs, numbered as `fast_call.cpp`'s ``Op``: PyTorch's SDPA with the caller's
arguments (``forward``), or a `BareCall`'s operator by its name."""


def served_call(plan: Plan, tensors: tuple[torch.Tensor, ...], is_causal: bool, enable_gqa: bool,
                ) -> tuple[int, tuple[int, ...] | None, tuple[int, ...] | None] | None:
    """``(op, rows, out_shape)`` for a C++ entry (`OPS`) serving `plan` on calls like this one
    (query, key, value[, mask]), or None: PyTorch's SDPA forwarded where the plan is exactly the
    call's own SDPA call; else the operator `Kernel.bare_call` names, where the plan's runner
    makes that call on these tensors (4-D, the last dimension dense, no mask)."""
    flags = plan.sdpa_flags
    own = {name: True for name, on in (("is_causal", is_causal), ("enable_gqa", enable_gqa)) if on}
    if flags is not None:
        return (OPS["forward"], None, None) if flags == own else None
    bare = plan.kernel.bare_call(plan.problem)
    if bare is None or bare.op not in OPS or len(tensors) != 3 or plan.run == plan.kernel.run:
        return None
    query, key, value = tensors
    if query.dim() != 4 or not query.stride(-1) == key.stride(-1) == value.stride(-1) == 1:
        return None  # the runner's `run`: a layout the operator does not take as it is
    return OPS[bare.op], bare.rows, bare.out_shape


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
    except Exception as error:  # noqa: BLE001 - no stand-in: a compiled graph breaks on the fast callable
        _stand_in_targets.pop(number, None)
        logger.warning("attn_dispatch: torch.compile cannot trace the fast path here (%s: %s): a compiled graph "
                       "breaks on it and runs it eagerly", type(error).__name__, error)
        return False
