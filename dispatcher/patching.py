"""Route every `torch.nn.functional.scaled_dot_product_attention` call through a dispatcher.

`install` / `uninstall` nest (a count of active installs, not a flag) and are thread-safe: the
original function is saved by the first install and put back, the very same object, by the
last uninstall. While several dispatchers are installed, the most recent one serves.
Our kernels call PyTorch's SDPA through `torch._C._nn.scaled_dot_product_attention`, never
through `F.scaled_dot_product_attention`, so patching cannot recurse.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch.nn.functional as F

from attn_dispatch.dispatcher.core import Dispatcher

_lock = threading.Lock()
_active: list[tuple[int, Dispatcher]] = []  # (install token, dispatcher), oldest first
_original: Callable | None = None
_tokens = itertools.count(1)


def _default() -> Dispatcher:
    from attn_dispatch.dispatcher.api import default_dispatcher

    return default_dispatcher()


def install(dispatcher: Dispatcher | None = None) -> int:
    """Make `F.scaled_dot_product_attention` call `dispatcher.attention` (default: the module's
    dispatcher) until the matching `uninstall`. Returns a token for `uninstall(token)`."""
    global _original
    dispatcher = dispatcher if dispatcher is not None else _default()
    if not isinstance(dispatcher, Dispatcher):
        raise TypeError(f"install() takes a Dispatcher or None, got {type(dispatcher).__name__}")
    with _lock:
        if not _active:
            _original = F.scaled_dot_product_attention
        token = next(_tokens)
        _active.append((token, dispatcher))
        F.scaled_dot_product_attention = dispatcher.attention
    return token


def uninstall(token: int | None = None) -> None:
    """Undo one `install` (the one that returned `token`, else the most recent). The last one
    restores the original `F.scaled_dot_product_attention` object.

    Raises
    ------
    RuntimeError
        When nothing is installed, or `token` is not an active install.
    """
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
            F.scaled_dot_product_attention = _active[-1][1].attention
        else:
            F.scaled_dot_product_attention = _original
            _original = None


def is_installed() -> bool:
    """Whether some dispatcher serves `F.scaled_dot_product_attention` now."""
    return bool(_active)


@contextmanager
def patched(dispatcher: Dispatcher | None = None) -> Iterator[Dispatcher]:
    """``with patched(): model(x)`` - every SDPA call inside goes through the dispatcher; the
    original is restored on exit, also after an exception. Nests; yields the dispatcher."""
    dispatcher = dispatcher if dispatcher is not None else _default()
    token = install(dispatcher)
    try:
        yield dispatcher
    finally:
        uninstall(token)
