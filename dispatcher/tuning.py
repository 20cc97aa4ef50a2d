"""A bucket's measured result (`Tuned`): the kernel that serves it and every candidate's seconds, as
`measuring` decides it on the bucket's own calls and `tuning_store` keeps it across processes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attn_dispatch.dispatcher.planning import Option

MIN_WIN_MARGIN = 0.03
"""A candidate replaces the baseline (PyTorch's own choice) only when faster by more than this
fraction at the median of its paired rounds: the dispatcher's rule is never to be slower than doing
nothing, and issue 14 allows no shape more than 3% slower than the default."""


@dataclass(frozen=True)
class Tuned:
    """A bucket's measured result: the kernel that serves it and every candidate's median seconds
    per call (inf: it failed)."""

    kernel: str
    seconds: tuple[tuple[str, float], ...]

    def timings(self) -> str:
        """``"sdpa_flash 0.034 ms, sdpa_default 0.029 ms"`` (a candidate that raised: "failed")."""
        return ", ".join(f"{name} {s * 1e3:.3g} ms" if math.isfinite(s) else f"{name} failed" for name, s in self.seconds)

    def note(self) -> str:
        return f"measured on this bucket's calls (kept in the home's tuning store): {self.timings()}; {self.kernel} serves it"


def put_first(options: tuple[Option, ...], name: str) -> tuple[Option, ...]:
    """`options` with kernel `name` moved to the front (unchanged when it is not among them)."""
    chosen = [o for o in options if o.kernel.name == name]
    return tuple(chosen + [o for o in options if o.kernel.name != name])
