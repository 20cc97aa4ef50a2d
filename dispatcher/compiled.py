"""`torch.compile` runs the dispatcher's choice with no graph break: `Dispatcher.attention` puts one node,
`attention_in_graph`, into Dynamo's graph. On fake tensors with static shapes it decides as an eager call would (no
timing) and traces the chosen kernel's ops; with symbolic shapes the graph calls
``attn_dispatch::attention_at_run_time``, deciding per bucket at run time. A plain function (not a custom op) makes
AOTAutograd bypass its cache, which would otherwise replay another process's kernel. Exported with symbolic shapes:
PyTorch's SDPA."""

from __future__ import annotations

import importlib.abc
import itertools
import sys
import threading
import types
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import _disable_current_modes

import attn_dispatch.dispatcher.sdpa_context as sdpa_context
from attn_dispatch.dispatcher.decision import logger
from attn_dispatch.dispatcher.plans import cache_key

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.core import Dispatcher

COUNT_SUFFIX = " (traced)"
"""`Dispatcher.stats` key suffix counting exact shapes traced per kernel (not calls)."""

_dispatchers: weakref.WeakValueDictionary[int, Dispatcher] = weakref.WeakValueDictionary()
_ids: weakref.WeakKeyDictionary[Dispatcher, int] = weakref.WeakKeyDictionary()
_next_id = itertools.count(1)
_lock = threading.Lock()


def compiling_readers() -> tuple[Callable[[], bool], object]:
    """``(is_dynamo_compiling, flags)``: ``is_dynamo_compiling() or flags._is_compiling_flag`` is
    `torch.compiler.is_compiling()` without its TorchScript check (costly per call); a torch lacking either gives
    `is_compiling` and a flag that stays False."""
    compiler = getattr(torch, "compiler", None)
    dynamo = getattr(compiler, "is_dynamo_compiling", None)
    if dynamo is None or not isinstance(getattr(compiler, "_is_compiling_flag", None), bool):
        return getattr(compiler, "is_compiling", lambda: False), types.SimpleNamespace(_is_compiling_flag=False)
    return dynamo, compiler


def dispatcher_id(dispatcher: Dispatcher) -> int:
    """A small integer naming `dispatcher` inside compiled graphs (operators take no objects)."""
    number = _ids.get(dispatcher)
    if number is None:
        with _lock:
            number = _ids.get(dispatcher)
            if number is None:
                number = _ids[dispatcher] = next(_next_id)
                _dispatchers[number] = dispatcher
    return number


def _dispatcher(number: int) -> Dispatcher:
    dispatcher = _dispatchers.get(number)
    if dispatcher is None:
        raise RuntimeError(f"attn_dispatch: the dispatcher #{number} this compiled graph was traced with no longer "
                           "exists; keep it alive as long as the compiled model, or compile again")
    return dispatcher


def _output(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool) -> torch.Tensor:
    """An empty ``[..., Hq, L, Ev]`` output (leading dimensions broadcast as SDPA does)."""
    if enable_gqa and min(query.dim(), key.dim(), value.dim()) >= 3:
        lead = (*torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3]), query.shape[-3])
    else:
        lead = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    return query.new_empty(*lead, query.shape[-2], value.shape[-1])


@torch.library.custom_op("attn_dispatch::attention_at_run_time", mutates_args=())
def attention_at_run_time(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attn_mask: torch.Tensor | None, is_causal: bool, scale: float | None,
                          enable_gqa: bool, dispatcher: int) -> torch.Tensor:
    """The dispatcher's eager call from a compiled graph with symbolic shapes."""
    return _dispatcher(dispatcher).attention(query, key, value, attn_mask, 0.0, is_causal, scale=scale,
                                             enable_gqa=enable_gqa)


@attention_at_run_time.register_fake
def _attention_at_run_time_shape(query, key, value, attn_mask, is_causal, scale, enable_gqa, dispatcher):
    return _output(query, key, value, enable_gqa)


def attention_in_graph(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
                       is_causal: bool, scale: float | None, enable_gqa: bool, dispatcher: int) -> torch.Tensor:
    """The dispatcher's attention as one graph node, decided and traced on fake tensors (module docstring)."""
    tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    symbolic = any(isinstance(size, torch.SymInt) for tensor in tensors for size in tensor.shape)
    if symbolic and not torch.compiler.is_exporting():
        return torch.ops.attn_dispatch.attention_at_run_time(query, key, value, attn_mask, is_causal, scale,
                                                             enable_gqa, dispatcher)
    # exported with symbolic lengths (an exported program outlives this process's dispatchers), or
    # the caller's sdpa_kernel(...) decides, as in eager calls: PyTorch's SDPA
    if symbolic or sdpa_context.backends_restricted():
        return sdpa_context.pytorch_attention(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa)
    ours = _dispatcher(dispatcher)
    # a mask here is a tensor (`Dispatcher.attention` routes a CausalBias elsewhere), seen as a fake tensor by
    # Dynamo and a functional one by AOTAutograd: one key for both, the eager call's (one plan, one count)
    key_ = cache_key(query, key, value, attn_mask, is_causal, enable_gqa, mask_class=torch.Tensor)
    with _disable_current_modes():  # deciding may probe PyTorch with real tensors: not into the graph
        plan = ours._cold.plan_for(key_, query, key, value, attn_mask, is_causal, enable_gqa)
        if key_ not in ours._traced_shapes:  # PyTorch traces a graph more than once
            ours._traced_shapes.add(key_)
            ours._counts.cell(plan.kernel.name + COUNT_SUFFIX)[0] += 1
    # a bucket still measuring (`measuring`) traces the kernel serving it: nothing is timed while tracing
    run = plan.run if plan.trial is None else plan.kernel.runner(plan.problem)
    return run(query, key, value, attn_mask, scale, enable_gqa, plan.problem)


def _allow_in_graph(dynamo: types.ModuleType) -> None:
    """Mark `attention_in_graph` as a graph node for Dynamo."""
    dynamo.allow_in_graph(attention_in_graph)


def compiled_attention(dispatcher: Dispatcher, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attn_mask: torch.Tensor | None, is_causal: bool, scale: float | None,
                       enable_gqa: bool) -> torch.Tensor:
    """What `Dispatcher.attention` emits under torch.compile (inference route)."""
    return attention_in_graph(query, key, value, attn_mask, bool(is_causal), scale, bool(enable_gqa),
                              dispatcher.compile_id)


_hook_lock = threading.Lock()


# a post-import hook (importing torch._dynamo would slow every process's start)


def when_imported(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call ``then(module)`` now if module `name` is imported, else right after its first import (without importing
    it); an exception from `then` is logged, never raised into the import."""
    module = sys.modules.get(name)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        _call(then, module)
        return
    with _hook_lock:
        sys.meta_path.insert(0, _Hook(name, then))


def _call(then: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        then(module)
    except Exception as error:  # noqa: BLE001 - a failed mark must not fail the user's import
        logger.warning("attn_dispatch: after importing %s, %s failed (%s: %s)", module.__name__,
                       getattr(then, "__qualname__", then), type(error).__name__, error)


class _Hook(importlib.abc.MetaPathFinder):
    """A `sys.meta_path` finder wrapping the loader of module `name` as the other finders find it."""

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
        with _hook_lock:
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


when_imported("torch._dynamo", _allow_in_graph)
