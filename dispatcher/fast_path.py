"""The fast path: a C builtin (`fast_call.cpp`) in front of `Dispatcher.attention` that serves hot plans which are
exactly the call's own SDPA call or a fused backend's bare ATen operator call (`kernels.sdpa_backends.BareCall`) with
no Python frame (docs/RESULTS.md#warm-parity), forwarding every other call to `Dispatcher.attention`. An entry may
serve a range of key lengths (`hot_path`). Built only on request (``attn-dispatch build-fast-path``,
`fast_path_build`) and loaded only when that exact build is installed and matches its manifest;
``ATTN_DISPATCH_FAST_PATH=0`` turns it off."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
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
from attn_dispatch.dispatcher.decision import logger
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
"""What a user without the fast path loses (`status`, ``attn-dispatch devices``; docs/RESULTS.md#warm-parity)."""
_loaded: dict[str, tuple[ModuleType, Path]] = {}  # module name -> the module and its library, once per process
_checks: dict[tuple, str] = {}  # the library's and manifest's (path, inode, size, mtime) -> `rejection`
_rejected: dict[str, str] = {}  # library path -> why it was not loaded (for `status`)
_made: weakref.WeakSet[FastPath] = weakref.WeakSet()  # every live dispatcher's fast path (`status` sums hits)
_lock = threading.Lock()


@functools.cache
def module_name() -> str:
    """The extension's name: one per torch build, Python ABI and source text."""
    digest = hashlib.sha256()
    for part in (torch.__version__, str(torch.version.git_version), sys.implementation.cache_tag,
                 str(sysconfig.get_config_var("SOABI"))):
        digest.update(part.encode() + b"\0")
    digest.update(SOURCE.read_bytes())
    return f"attn_dispatch_fast_call_{digest.hexdigest()[:16]}"


def build_directory(home: str | os.PathLike | None = None, *, create: bool = True) -> Path:
    """``<home>/fast_path/<module_name()>``."""
    from attn_dispatch.models.paths import home as home_dir

    return home_dir(home, create=create) / BUILD_SUBDIR / module_name()


def library_path(home: str | os.PathLike | None = None) -> Path:
    """The installed library's path (``.so``, ``.pyd`` on Windows); creates no folder."""
    return build_directory(home, create=False) / (module_name() + (".pyd" if sys.platform == "win32" else ".so"))


def manifest_path(library: Path) -> Path:
    return library.with_suffix(".json")


def fast_path_enabled() -> bool:
    """False where ``ATTN_DISPATCH_FAST_PATH`` is off or torch lacks ``substitute_in_graph`` (< 2.5)."""
    return not _turned_off() and _torch_supports()


def _turned_off() -> bool:
    return not FAST_PATH.read()


def _torch_supports() -> bool:
    return hasattr(getattr(torch, "compiler", None), "substitute_in_graph")


def build(home: str | os.PathLike | None = None) -> Path:
    """Compile and install the extension under `home` (reusing a matching install), load it, return its path."""
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
    """The extension: already loaded, else the library under `home` if it matches its manifest (a partial or foreign
    file is never dlopened), else None. Never compiles; a rejection is logged at debug and kept for `status`."""
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
    """`fast_path_build.rejection`, once per version of the library and manifest; None (not built) is never kept."""
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
        if _other_builds(home):
            return (f"not built for this attn-dispatch and torch (the build in {build_directory(home, create=False).parent} "
                    f"is for another version): {fix} ({WITHOUT_IT})")
        return f"not built: {fix} ({WITHOUT_IT})"
    return f"built library rejected ({reason}): {fix} ({WITHOUT_IT})"


def _other_builds(home: str | os.PathLike | None) -> bool:
    """Whether the home holds a fast path built from another source or torch (an upgrade leaves it behind)."""
    try:
        return any(folder.name != module_name() for folder in build_directory(home, create=False).parent.iterdir())
    except OSError:
        return False


def _hits_or_none(fast: FastPath) -> int | None:
    """`fast.hits`, or None where its module refuses its callable (a library imported again from another path)."""
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
        return self.module.hits(self.call)

    def callable(self):
        """The fast callable (its torch.compile stand-in registered once Dynamo is imported)."""
        if not self._registered:
            self._registered = True
            when_imported("torch._dynamo", lambda _: _register_stand_in(self.call, self._dispatcher))
        return self.call

    def entry(self, plan: Plan, tensors: tuple[torch.Tensor, ...], is_causal: bool, enable_gqa: bool,
              key_lengths: tuple[int, int] | None = None):
        """The C++ entry for a plan going hot, recorded from its call's tensors (query, key, value[, mask]) under the
        call's dispatch state, serving `key_lengths` (lowest, highest; None: the call's own); None where
        `served_call` refuses.

        It serves only: no dropout, not compiling, no torch-function mode, plain dense ``torch.Tensor`` inputs, per
        tensor the recorded dispatch keys, dtype, device, sizes, strides and ``requires_grad``
        (`hot_path.tensor_guard`), not at the settle point; for a bare operator also a float or no ``scale`` and
        every SDPA backend on. A forwarded call that raises goes to `Dispatcher.attention`."""
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
        """The C++ slots serve exactly `hot`'s entries that have a C++ entry, in order."""
        self.module.set_entries(self.call, tuple(entry.fast for entry in hot if entry.fast is not None))


OPS = {"forward": 0, "flash": 1, "flash_cpu": 2, "efficient": 3, "cudnn": 4}
"""What a C++ entry runs, numbered as `fast_call.cpp`'s ``Op``."""


def served_call(plan: Plan, tensors: tuple[torch.Tensor, ...], is_causal: bool, enable_gqa: bool,
                ) -> tuple[int, tuple[int, ...] | None, tuple[int, ...] | None] | None:
    """``(op, rows, out_shape)`` for a C++ entry serving `plan` on calls like this one: PyTorch's SDPA forwarded
    where the plan is exactly the call's SDPA call, else `Kernel.bare_call`'s operator where the runner makes it on
    these tensors; else None."""
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
    """Register a Python stand-in calling the dispatcher's `attention` for Dynamo (which cannot trace a builtin); it
    finds the dispatcher by number in a module global, as Dynamo inlines it without its closure. False where torch
    refuses. The dispatcher then lives as long as the process."""
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
