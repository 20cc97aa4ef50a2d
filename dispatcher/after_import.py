"""Run a function once a module has been imported, without importing it: a post-import hook.

Marking a function for torch.compile (`torch.compiler.allow_in_graph`) imports `torch._dynamo`,
which imports sympy, Triton and much of torch's compiler stack (over a second of a process's
start), although a process that never compiles never needs the mark. `when_imported("torch._dynamo", mark)` marks at once where Dynamo
is already imported (a transformers or diffusers process usually has it), and otherwise the moment
something imports it (``torch.compile`` does, before it traces anything).

The hook is a `sys.meta_path` finder that answers for that one module name only: it asks the
other finders for the module's spec and wraps the spec's loader so that, once the module has run,
the hook removes itself and calls the function. Nothing else about the import changes (the
module's loader answers every other question as before).
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger("attn_dispatch")
_lock = threading.Lock()


def when_imported(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call ``then(module)`` now if module `name` is imported, else right after its first import.

    An exception raised by `then` is logged (a warning), never raised into the import."""
    module = sys.modules.get(name)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        _call(then, module)
        return
    with _lock:
        sys.meta_path.insert(0, _Hook(name, then))


def _call(then: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        then(module)
    except Exception as error:  # noqa: BLE001 - a failed mark must not fail the user's import
        logger.warning("attn_dispatch: after importing %s, %s failed (%s: %s)", module.__name__,
                       getattr(then, "__qualname__", then), type(error).__name__, error)


class _Hook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of module `name` as the other finders find it."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then
        self._searching = False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self._searching:
            return None
        self._searching = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _ThenLoader(spec.loader, self)
                    return spec
            return None
        finally:
            self._searching = False

    def done(self, module: ModuleType) -> None:
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        _call(self.then, module)


class _ThenLoader(importlib.abc.Loader):
    """The module's own loader, calling the hook once the module has run."""

    def __init__(self, loader, hook: _Hook) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._hook.done(module)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)
