"""Backend probes answered off the card: inside `assume_backends_available`, a probe for a device type
this process has none of answers "works", or as a card recorded it (`AssumedCard`), for building or
scoring a card's table elsewhere (`models.fit`, `bench.offline_card`); `kernels.sdpa_default`'s probes
read what is assumed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_default import _ASSUME_AVAILABLE, _ASSUMED_CARD


class AssumedCard(Protocol):
    """What a card answered that this machine cannot ask (`bench.offline_card` records them)."""

    def default_backend(self, problem: Problem) -> str | None:
        """The family `default_backend_choice` gave on the card, or None."""

    def probe_failure(self, family: str, dtype: str, feature: str) -> str | None:
        """Why that probe failed on the card, or None."""


@contextmanager
def assume_backends_available(card: AssumedCard | None = None) -> Iterator[None]:
    """Inside: a probe for a device type this process has none of answers "works" (or as recorded on `card`, also for
    `default_backend_choice`; without `card`, an enclosing block's), for building or scoring a card's table
    elsewhere. Static kernel limits still apply; a machine with such a device probes its own."""
    tokens = _ASSUME_AVAILABLE.set(True), _ASSUMED_CARD.set(card if card is not None else _ASSUMED_CARD.get())
    try:
        yield
    finally:
        _ASSUMED_CARD.reset(tokens[1])
        _ASSUME_AVAILABLE.reset(tokens[0])
