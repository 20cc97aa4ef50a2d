"""Route every `torch.nn.functional.scaled_dot_product_attention` call through a dispatcher. `install` / `uninstall`
nest (a count, thread-safe); the last uninstall restores the very same original object; the most recent dispatcher
serves. Our kernels call `torch._C._nn.scaled_dot_product_attention`, so patching cannot recurse.

Not reached (PyTorch's SDPA serves, uncounted): a name bound before patching (``from torch.nn.functional import
scaled_dot_product_attention``; ``F.scaled_dot_product_attention(...)`` looked up at call time is reached), and
``torch._C._nn.scaled_dot_product_attention`` itself (left alone on purpose), and TorchScript: `torch.jit.script`
compiles the patched name as PyTorch's own ``aten::scaled_dot_product_attention`` (as it does unpatched), since
it cannot compile the dispatcher. Transformers: `register_transformers()`."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch.jit._builtins as script_builtins
import torch.nn.functional as F

from attn_dispatch.dispatcher.core import Dispatcher, read_environment

_lock = threading.Lock()
_active: list[tuple[int, Dispatcher]] = []  # (install token, dispatcher), oldest first
_original: Callable | None = None
_tokens = itertools.count(1)


SCRIPTED_AS = "aten::scaled_dot_product_attention"
"""What `torch.jit.script` compiles the patched function to: PyTorch's own operator."""


def _serve(function: Callable) -> None:
    """Make `function` what `F.scaled_dot_product_attention` names, scripted as `SCRIPTED_AS` (the builtin table is
    keyed by object id: the replaced function's entry goes with it)."""
    table = script_builtins._get_builtin_table()
    current = F.scaled_dot_product_attention
    if current is not _original:
        table.pop(id(current), None)
    F.scaled_dot_product_attention = function
    if function is not _original:
        table[id(function)] = SCRIPTED_AS


def _default() -> Dispatcher:
    from attn_dispatch.dispatcher.api import default_dispatcher

    return default_dispatcher()


def install(dispatcher: Dispatcher | None = None) -> int:
    """Make `F.scaled_dot_product_attention` call `dispatcher.fast_attention` (default: the module's dispatcher)
    until the matching `uninstall`; returns its token. Raises ValueError for a bad ``ATTN_DISPATCH_*`` value now."""
    global _original
    dispatcher = dispatcher if dispatcher is not None else _default()
    if not isinstance(dispatcher, Dispatcher):
        raise TypeError(f"install() takes a Dispatcher or None, got {type(dispatcher).__name__}")
    read_environment()  # a bad ATTN_DISPATCH_* value raises here (ValueError), not mid-model
    with _lock:
        if not _active:
            _original = F.scaled_dot_product_attention
        token = next(_tokens)
        _active.append((token, dispatcher))
        _serve(dispatcher.fast_attention)  # `fast_path`, else `attention`
    return token


def uninstall(token: int | None = None) -> None:
    """Undo one `install` (`token`'s, else the most recent); the last restores the original object. RuntimeError when
    nothing is installed or `token` is not active."""
    global _original
    with _lock:
        if not _active:
            raise RuntimeError("uninstall() called with nothing installed: call install() first")
        if token is None:
            _active.pop()
        else:
            index = next((i for i, (t, _) in enumerate(_active) if t == token), None)
            if index is None:
                raise RuntimeError(f"uninstall({token!r}): no active install has this token")
            del _active[index]
        if _active:
            _serve(_active[-1][1].fast_attention)
        else:
            _serve(_original)
            _original = None


def is_installed() -> bool:
    return bool(_active)


@contextmanager
def patched(dispatcher: Dispatcher | None = None) -> Iterator[Dispatcher]:
    """``with patched(): model(x)``: `install` for the block (restored on exit, also after an exception); nests,
    yields the dispatcher. Not reached: as the module docstring says."""
    dispatcher = dispatcher if dispatcher is not None else _default()
    token = install(dispatcher)
    try:
        yield dispatcher
    finally:
        uninstall(token)
