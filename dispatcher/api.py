"""The module-level dispatcher behind `dispatcher.attention`, `explain`, `stats` and `reset`."""

from __future__ import annotations

from attn_dispatch.dispatcher.core import Dispatcher

_DEFAULT = Dispatcher()


def default_dispatcher() -> Dispatcher:
    """The dispatcher `dispatcher.attention` and `patched()` use by default (all kernels, lossless)."""
    return _DEFAULT


attention = _DEFAULT.fast_attention  # the fast path's C++ entry where built (`fast_path`), else `Dispatcher.attention`
explain = _DEFAULT.explain
stats = _DEFAULT.stats
reset = _DEFAULT.reset
