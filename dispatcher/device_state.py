"""What one device's planner keeps across its size buckets (`DeviceState`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from attn_dispatch.dispatcher.decision import failure_message
from attn_dispatch.dispatcher.device_ranking import DeviceRanking
from attn_dispatch.dispatcher.selection import Tuned, failure_bucket
from attn_dispatch.kernels import Problem
from attn_dispatch.models.paths import tuning_path


class DeviceState:
    """One device's ranker, run-time failures per bucket (`out_of_memory`: transient) and measured buckets (`tuned`)."""

    def __init__(self, ranking: DeviceRanking) -> None:
        self.ranking = ranking
        self.failures: dict[tuple, dict[str, str]] = {}
        self.out_of_memory: dict[tuple, set[str]] = {}
        self.tuned: dict[tuple, Tuned] = {}
        self._store = None
        self._store_path: Path | None = None
        self._store_opened = False

    # ------------------------------------------------------------------ failures
    def remember(self, problem: Problem, name: str, error: BaseException, out_of_memory: bool) -> None:
        """Kernel `name` raised on `problem`: not tried again in its bucket (out of memory: until forgotten)."""
        bucket = failure_bucket(problem)
        self.failures.setdefault(bucket, {})[name] = failure_message(error)
        if out_of_memory:
            self.out_of_memory.setdefault(bucket, set()).add(name)

    def forget_failure(self, problem: Problem, name: str) -> None:
        bucket = failure_bucket(problem)
        self.failures.get(bucket, {}).pop(name, None)
        self.out_of_memory.get(bucket, set()).discard(name)

    def forget_out_of_memory(self, problem: Problem) -> None:
        """Forget the bucket's out-of-memory failures (when nothing is left to try)."""
        bucket = failure_bucket(problem)
        failures = self.failures.get(bucket, {})
        for name in self.out_of_memory.pop(bucket, ()):
            failures.pop(name, None)

    # ------------------------------------------------------------------ tunings
    def open_store(self, root_of_stores: Callable[[], object] | None, signature: str) -> None:
        """Load the tuning store on first use (nothing without a root, a device identity or a usable folder)."""
        if not self._store_opened:
            self._store_opened = True
            device_key = self.ranking.source.identity
            if root_of_stores is not None and device_key:
                try:
                    self._store_path = tuning_path(root_of_stores(), device_key, signature)
                    if self._store_path.exists():
                        self.tuned.update({**self.store.load(), **self.tuned})
                except OSError:
                    self._store_path = None

    @property
    def store(self):
        """The `measured_store.TuningStore` (None: memory only)."""
        if self._store is None and self._store_path is not None:
            from attn_dispatch.dispatcher.measured_store import TuningStore

            self._store = TuningStore(self._store_path)
        return self._store

    def keep_measured(self, bucket: tuple, tuned: Tuned, *, store: bool = True) -> None:
        self.tuned[bucket] = tuned
        if store and self.store is not None:
            self.store.append(bucket, tuned)
