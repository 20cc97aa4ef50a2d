"""Decisions per size bucket, and the bounded caches that hold them.

A bucket (`planning.failure_bucket`: batch and lengths rounded up to powers of two, everything
else exact, on one device) is ranked and fitted once, and measured on its first calls (`measuring`). A new exact shape inside a decided
bucket (a decode step's key length one longer than the last) gets its plan from the bucket: the
chosen kernel's capability and workspace are checked for the exact problem, nothing is ranked or
timed. The plan cache (exact shapes) and the bucket cache are both bounded (`BoundedCache`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import replace
from typing import Generic, TypeVar

from attn_dispatch.dispatcher.cold_shape import (
    HISTORY,
    calls_per_shape,
    cold_seconds,
    expected_seconds,
    floor_seconds,
    settle_after,
)
from attn_dispatch.dispatcher.decision import Candidate, Decision, format_seconds
from attn_dispatch.dispatcher.planning import Option, Ranked
from attn_dispatch.dispatcher.tuning import put_first
from attn_dispatch.kernels import Kernel, Problem

MAX_PLANS = 4096
"""Exact call shapes whose plans are kept per dispatcher: a decode loop with a growing cache makes
one per generated token, so an unbounded cache grows for ever; 4096 covers every layer shape of
a long generation's last few thousand tokens, at a few hundred bytes each. Older ones are evicted
first (a miss costs one plan made from its bucket's decision, not a new decision)."""

MAX_BUCKETS = 1024
"""Size buckets whose decisions are kept per dispatcher: lengths are bucketed by powers of two, so
a model meets a few dozen; 1024 bounds pathological callers (a sweep over many head counts)."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """A dict with at most `limit` entries; adding past it evicts the oldest entry (first in, first
    out: a warm hit costs one ``dict.get``, with no reordering), which goes to ``on_evict(key, value)``."""

    def __init__(self, limit: int, on_evict: Callable[[K, V], None] | None = None) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self._items: dict[K, V] = {}
        self.get = self._items.get  # bound once
        self.table = self._items
        """The dict itself, for lookups by subscript (``table[key]``, KeyError on a miss: the warm
        path's, 40 ns less than a `get` call); change it through the methods only."""
        self._on_evict = on_evict

    def put(self, key: K, value: V) -> None:
        items = self._items
        if key not in items:
            while len(items) >= self.limit:
                oldest = next(iter(items))
                evicted = items.pop(oldest)
                if self._on_evict is not None:
                    self._on_evict(oldest, evicted)
        items[key] = value

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._items.pop(key, default)

    def values(self):
        return self._items.values()

    def __iter__(self):
        return iter(self._items)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items


class Bucket:
    """One size bucket's decision on one device.

    Attributes
    ----------
    key: the bucket (`planning.failure_bucket` of its first problem).
    ranked: the first problem's ranked options (kept to refit when memory changes).
    options: the options that fitted when decided, in try order (a measured winner first).
    decision: the decision made for the first problem (`explain` adapts it per exact shape).
    warm: seconds per warm call of each option: measured on the bucket's calls (`seconds`, kernel
        name -> seconds; empty where nothing was timed), else predicted.
    measured: the options whose warm time was measured (the names in `seconds`).
    trial: its candidates being measured on its calls (`measuring.Trial`), None once decided or
        where nothing is measured.
    free: bytes free on the device when decided (None: unknown, e.g. the CPU).
    history: the call counters of the bucket's most recent exact shapes (`cold_shape`).
    unprobed: ranked with backend probes deferred (`sdpa_probe.probes_deferred`): an option is asked
        its `Kernel.reasons` again before it runs.
    """

    __slots__ = ("key", "ranked", "options", "decision", "trial", "free", "history", "warm", "measured", "unprobed",
                 "_cold")

    def __init__(self, key: tuple, ranked: Ranked, options: tuple[Option, ...], decision: Decision, *,
                 seconds: Mapping[str, float], free: int | None, unprobed: bool = False) -> None:
        self.key = key
        self.ranked = ranked
        self.free = free
        self.unprobed = unprobed
        self.history: deque[list[int]] = deque(maxlen=HISTORY)
        self.trial = None
        self._follow(options, decision, seconds)

    def _follow(self, options: tuple[Option, ...], decision: Decision, seconds: Mapping[str, float]) -> None:
        self.options = options
        self.decision = decision
        self.warm = tuple(seconds.get(o.kernel.name, o.predicted_s) for o in options)
        self.measured = frozenset(seconds)
        self._cold: tuple[float, ...] | None = None

    def measured_by(self, trial) -> None:
        """Follow `trial`'s result (`measuring.Trial`, decided): its kernel first, its medians as the
        options' warm times, a candidate that raised dropped, and what it measured in the notes."""
        failed = {c.name: c.failure for c in trial.contenders if c.failure is not None}
        seconds = {} if trial.result is None else {name: s for name, s in trial.result.seconds}
        options = self.options if trial.result is None else put_first(self.options, trial.result.kernel)
        options = tuple(o for o in options if o.kernel.name not in failed) or options
        first = options[0].kernel
        decision = replace(self.decision, kernel=first.name, params=dict(first.params),
                           candidates=tuple(o.candidate() for o in options),
                           dropped=(*self.decision.dropped, *failed.items()),
                           notes=(*self.decision.notes, trial.describe()))
        self._follow(options, decision, seconds)
        self.trial = None

    def explained(self) -> Decision:
        """`decision`, with what its trial has measured so far while it measures (`explain`)."""
        trial = self.trial
        if trial is None or not trial.open:
            return self.decision
        return replace(self.decision, notes=(*self.decision.notes, trial.describe()))

    @property
    def budget(self) -> int | None:
        """The memory budget the bucket was decided under."""
        return self.decision.budget_bytes

    def cold(self, measured: Mapping[str, float]) -> tuple[float, ...]:
        """Seconds of per-shape set-up of each option (`cold_shape.cold_seconds`; every exact
        problem of the bucket is of one kind for it)."""
        if self._cold is None:
            self._cold = tuple(cold_seconds(o.kernel, self.ranked.problem, measured) for o in self.options)
        return self._cold

    def order_for_new_shape(self, is_set_up: Callable[[str], bool], measured_cold: Mapping[str, float],
                            floors: Mapping[str, Mapping[str, float]] | None = None,
                            ) -> tuple[tuple[Option, ...], tuple[str, ...], int]:
        """The options in try order for a new exact shape, with notes and the calls after which
        to settle (0: never): the decided order, except that a kernel paying a per-shape set-up
        (`cold_shape`) it has not paid for this shape yet moves behind one that is faster once
        that cost is spread over the calls this bucket's shapes get. If that one is slower warm,
        the shape settles on the decided kernel once it has lost as much per call as the set-up
        costs (`cold_shape.settle_after`). `is_set_up(name)`: has kernel `name` run this exact
        shape already? `floors`: measured per-call floors (`cold_shape.floor_seconds`)."""
        cold = self.cold(measured_cold)
        if not cold or not cold[0]:
            return self.options, (), 0
        expected_calls = calls_per_shape(cell[0] for cell in self.history)
        first = self.options[0]
        if expected_calls is None or is_set_up(first.kernel.name):
            return self.options, (), 0
        warm = [None if w is None else w if o.kernel.name in self.measured  # a floor bounds predictions only
                else max(w, floor_seconds(o.kernel, floors or {}) or 0.0)
                for o, w in zip(self.options, self.warm, strict=True)]
        costs = [
            expected_seconds(w, 0.0 if c and is_set_up(o.kernel.name) else c, expected_calls)
            if i == 0 or self.may_replace_first(o) else None
            for i, (o, w, c) in enumerate(zip(self.options, warm, cold, strict=True))
        ]
        best = min((i for i, cost in enumerate(costs) if cost is not None), key=costs.__getitem__, default=0)
        if best == 0:
            return self.options, (), 0
        chosen = self.options[best]
        settle = settle_after(cold[0], warm[0], warm[best])
        note = (f"{first.kernel.name} sets up per exact shape (~{format_seconds(cold[0])} on a new shape) and this "
                f"bucket's shapes get ~{expected_calls:g} calls each: {chosen.kernel.name} is faster over a shape's "
                f"life ({format_seconds(costs[best])} against {format_seconds(costs[0])} per call)")
        if settle:
            note += f"; a shape called {settle} times settles on {first.kernel.name}"
        return (chosen, *(o for o in self.options if o is not chosen)), (note,), settle

    def new_shapes_run_first(self, measured_cold: Mapping[str, float]) -> bool:
        """Whether `order_for_new_shape` keeps the decided order for any new shape, whatever the
        bucket's history and whatever has been set up: the first option pays no per-shape set-up,
        or no other option may run a new shape in its place."""
        cold = self.cold(measured_cold)
        return not cold or not cold[0] or not any(self.may_replace_first(o) for o in self.options[1:])

    def may_replace_first(self, option: Option) -> bool:
        """Whether `option` may run a new shape in place of the decided kernel: where the bucket's
        calls measured options (`measuring`), only a measured one, since a table's prediction can be
        far off (the H200's batch-8 32k decode: `math` predicted under PyTorch's default plus its
        set-up, measured 5.6x slower per token; `measured_candidates.SETUP_FREE_MEASURED`); where
        nothing was measured, any option, on the table's prediction."""
        return not self.measured or option.kernel.name in self.measured

    def decision_for(self, problem: Problem, kernel: Kernel, workspace: int, notes: tuple[str, ...],
                     skipped: tuple[tuple[str, str], ...] = ()) -> Decision:
        """`decision` for an exact shape of this bucket that runs `kernel`, having passed over the
        options in `skipped` (name, why)."""
        decision = self.explained()
        if problem == decision.problem and kernel.name == decision.kernel and not notes and not skipped:
            return decision
        passed = {name for name, _ in skipped}
        chosen = Candidate(kernel.name, next((c.predicted_s for c in decision.candidates if c.name == kernel.name), None),
                           workspace)
        first = decision.problem
        return replace(
            decision, kernel=kernel.name, params=dict(kernel.params), problem=problem,
            candidates=(chosen, *(c for c in decision.candidates if c.name != kernel.name and c.name not in passed)),
            dropped=(*skipped, *(d for d in decision.dropped if d[0] not in passed)),
            notes=(*decision.notes, *(n for n in notes if n not in decision.notes),
                   f"decided for its size bucket on a first shape of Lq={first.q_len} Lk={first.kv_len} B={first.batch}"),
        )
