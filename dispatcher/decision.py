"""What the dispatcher decided for one problem, and why: the record `explain` returns and the
log prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attn_dispatch.dispatcher.memory import format_bytes
from attn_dispatch.kernels import Problem

ROUTE_DISPATCH = "dispatch"
ROUTE_TRAINING = "training"
TRAINING_KERNEL = "pytorch_sdpa"
"""What runs on the training route: PyTorch's own `scaled_dot_product_attention`, unchanged."""


@dataclass(frozen=True)
class Candidate:
    """A kernel that can run the problem and fits in memory, with its predicted time."""

    name: str
    predicted_s: float | None
    workspace_bytes: int

    def to_dict(self) -> dict:
        return {"name": self.name, "predicted_s": self.predicted_s, "workspace_bytes": self.workspace_bytes}


@dataclass(frozen=True)
class RankingSource:
    """Where the predicted times came from.

    Attributes
    ----------
    level: ``"exact" | "model" | "family"`` (a threshold table found at that lookup level),
        ``"prior"`` (the card's analytic prior) or ``"none"`` (nothing could rank: kernel order).
    path: the table file, when a table served.
    identity: the device identity key the lookup used.
    """

    level: str
    description: str
    path: str | None = None
    identity: str | None = None
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "level": self.level, "description": self.description, "path": self.path,
            "identity": self.identity, "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class Decision:
    """One decision: the kernel that runs a problem on a device, and why.

    Attributes
    ----------
    kernel: the chosen kernel's name (``"pytorch_sdpa"`` on the training route).
    params: the chosen kernel's parameters (e.g. ``{"q": 128, "kv": 1024}``).
    route: ``"dispatch"`` or ``"training"`` (dropout or inputs requiring grad: PyTorch's SDPA
        unless the chosen kernel supports backward).
    candidates: every kernel that can run and fits, in the order they would be tried; the first
        is the chosen one.
    dropped: ``(kernel name, reason)`` for every other kernel: unsupported, over the memory limit
        or failed at run time in this problem's bucket.
    free_bytes, budget_bytes: memory free on the device when decided (None: unknown) and the
        configured budget (None: none); a candidate's workspace must fit both.
    """

    kernel: str
    params: dict
    problem: Problem
    device: str
    source: RankingSource
    route: str = ROUTE_DISPATCH
    candidates: tuple[Candidate, ...] = ()
    dropped: tuple[tuple[str, str], ...] = ()
    free_bytes: int | None = None
    budget_bytes: int | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def predicted_s(self) -> float | None:
        """The chosen kernel's predicted time (None when nothing predicted it)."""
        for candidate in self.candidates:
            if candidate.name == self.kernel:
                return candidate.predicted_s
        return None

    def reason_dropped(self, name: str) -> str | None:
        """Why kernel `name` was not chosen (None when it was a candidate or unknown)."""
        return dict(self.dropped).get(name)

    def summary(self) -> str:
        """One line: device, problem and the chosen kernel."""
        p = self.problem
        shape = (
            f"B={p.batch} Hq={p.q_heads} Hkv={p.kv_heads} Lq={p.q_len} Lk={p.kv_len} D={p.head_dim} "
            f"{p.dtype}{' causal' if p.causal else ''}{'' if p.mask_kind == 'none' else ' mask=' + p.mask_kind}"
        )
        predicted = format_seconds(self.predicted_s)
        return f"{self.device} [{shape}] -> {self.kernel} (predicted {predicted}; {self.source.description})"

    def to_dict(self) -> dict:
        """JSON-ready form (``attn-dispatch explain --json``)."""
        return {
            "kernel": self.kernel, "params": dict(self.params), "route": self.route,
            "device": self.device, "problem": self.problem.to_dict(), "source": self.source.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
            "dropped": [{"name": name, "reason": reason} for name, reason in self.dropped],
            "free_bytes": self.free_bytes, "budget_bytes": self.budget_bytes, "notes": list(self.notes),
        }

    def __str__(self) -> str:
        lines = [f"attention on {self.device}: {self.summary()}"]
        if self.route == ROUTE_TRAINING:
            lines.append("  route: training (dropout or inputs requiring grad)")
        lines.append(f"  ranked by: {self.source.description}")
        if self.source.path:
            lines.append(f"  table: {self.source.path} (lookup level: {self.source.level})")
        lines.append(f"  memory: free {format_bytes(self.free_bytes)}, budget "
                     f"{format_bytes(self.budget_bytes) if self.budget_bytes is not None else 'none'}")
        lines.append("  candidates, in the order they are tried:")
        width = max((len(c.name) for c in self.candidates), default=0)
        for rank, candidate in enumerate(self.candidates, 1):
            lines.append(
                f"    {rank:2d}. {candidate.name:<{width}}  {format_seconds(candidate.predicted_s):>10}  "
                f"workspace {format_bytes(candidate.workspace_bytes)}"
            )
        if self.dropped:
            lines.append("  dropped:")
            for reason, names in _group_by_reason(self.dropped):
                lines.append(f"    {_compact(names)}: {reason}")
        for note in (*self.notes, *self.source.warnings):
            lines.append(f"  note: {note}")
        return "\n".join(lines)


def format_seconds(seconds: float | None) -> str:
    """``1.2e-5`` -> ``"12.0 us"``; None -> ``"unknown"``."""
    if seconds is None:
        return "unknown"
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= factor:
            return f"{seconds / factor:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _group_by_reason(dropped: tuple[tuple[str, str], ...]) -> list[tuple[str, list[str]]]:
    """``[(name, reason)]`` -> ``[(reason, [names])]`` in first-seen order (one line per reason)."""
    groups: dict[str, list[str]] = {}
    for name, reason in dropped:
        groups.setdefault(reason, []).append(name)
    return list(groups.items())


def _compact(names: list[str]) -> str:
    """``["convert[x]+a", "convert[x]+b", "math"]`` -> ``"convert[x]+{a, b}, math"``."""
    by_prefix: dict[str, list[str]] = {}
    for name in names:
        prefix, plus, inner = name.partition("]+")
        key, rest = (prefix + plus, inner) if plus else (name, "")
        by_prefix.setdefault(key, []).append(rest)
    parts = []
    for key, inners in by_prefix.items():
        if len(inners) == 1:
            parts.append(key + inners[0])
        else:
            parts.append(key + "{" + ", ".join(inners) + "}")
    return ", ".join(parts)
