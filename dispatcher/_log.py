"""Logging of decisions: each new decision once (INFO when ``ATTN_DISPATCH_LOG=1``, else DEBUG),
and every run-time fallback as a WARNING (a fallback is never silent)."""

from __future__ import annotations

import logging

from attn_dispatch.dispatcher.decision import Decision
from attn_dispatch.dispatcher.plans import failure_message
from attn_dispatch.models.environment import LOG

logger = logging.getLogger("attn_dispatch")
_TOP_CANDIDATES = 3  # candidates shown in the one-line log of a decision (explain shows them all)


def enabled() -> bool:
    """``ATTN_DISPATCH_LOG`` is on (`models.environment.LOG`)."""
    return LOG.read()


def _ensure_handler() -> None:
    """Give the logger a stderr handler at INFO when nothing would print its records."""
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)


def new_decision(decision: Decision) -> None:
    """Log a decision the first time it is made."""
    level = logging.DEBUG
    if enabled():
        _ensure_handler()
        level = logging.INFO
    if not logger.isEnabledFor(level):
        return
    others = ", ".join(c.name for c in decision.candidates[1:_TOP_CANDIDATES + 1]) or "none"
    logger.log(level, "%s; next: %s; %d kernels dropped", decision.summary(), others, len(decision.dropped))
    logger.debug("%s", decision)


def fallback(failed: str, error: BaseException, replacement: str) -> None:
    """Kernel `failed` raised `error` at run time and kernel `replacement` runs instead."""
    logger.warning(
        "%s raised %s; falling back to %s (remembered for problems of this size)",
        failed, failure_message(error), replacement,
    )


def settled(kernel: str, previous: str, calls: int) -> None:
    """An exact shape called `calls` times moves from `previous` to `kernel` (`selection.settle_after`)."""
    level = logging.INFO if enabled() else logging.DEBUG
    if enabled():
        _ensure_handler()
    logger.log(level, "a shape called %d times now runs %s instead of %s (its per-shape set-up pays off)",
               calls, kernel, previous)
