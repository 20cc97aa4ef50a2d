"""Environment switches that turn one dispatcher feature off: ``ATTN_DISPATCH_MEASURE`` (measuring
a bucket's candidates on its calls), ``ATTN_DISPATCH_HOT_PATH``, ``ATTN_DISPATCH_FAST_PATH`` and
``ATTN_DISPATCH_AUTO_BUILD`` (the fast path's background build)."""

from __future__ import annotations

import os

OFF_VALUES = ("0", "false", "no", "off")


def switched_off(name: str) -> bool:
    """True where the environment variable `name` is 0, false, no or off (any case, spaces ignored)."""
    return os.environ.get(name, "").strip().lower() in OFF_VALUES
