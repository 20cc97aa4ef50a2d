"""What a dispatcher keeps per device: its ranker, the kernels that failed per problem bucket, and
the buckets measured on their calls (`measuring`) with the store that keeps them across processes.
The `Dispatcher` holds its lock around every change made here."""

from __future__ import annotations

from collections.abc import Callable

from attn_dispatch.dispatcher._plan import failure_message
from attn_dispatch.dispatcher.planning import failure_bucket
from attn_dispatch.dispatcher.ranking import DeviceRanking
from attn_dispatch.dispatcher.tuning import Tuned
from attn_dispatch.dispatcher.tuning_store import TuningStore
from attn_dispatch.kernels import Problem


class DeviceState:
    """One device's state.

    Attributes
    ----------
    failures: bucket -> kernel name -> why it failed at run time (not tried again there).
    out_of_memory: bucket -> names of those failures that were out of memory (transient).
    tuned: bucket -> its measured result (`tuning.Tuned`); store: where they are kept (None: memory only).
    """

    def __init__(self, ranking: DeviceRanking) -> None:
        self.ranking = ranking
        self.failures: dict[tuple, dict[str, str]] = {}
        self.out_of_memory: dict[tuple, set[str]] = {}
        self.tuned: dict[tuple, Tuned] = {}
        self.store: TuningStore | None = None
        self._store_opened = False

    # ------------------------------------------------------------------ failures
    def remember(self, problem: Problem, name: str, error: BaseException, out_of_memory: bool) -> None:
        """Kernel `name` raised `error` on `problem`: not tried again in its bucket (out of memory:
        until nothing else is left, `forget_out_of_memory`)."""
        bucket = failure_bucket(problem)
        self.failures.setdefault(bucket, {})[name] = failure_message(error)
        if out_of_memory:
            self.out_of_memory.setdefault(bucket, set()).add(name)

    def forget_failure(self, problem: Problem, name: str) -> None:
        """Kernel `name`'s remembered failure in `problem`'s bucket, forgotten (it was the context's)."""
        bucket = failure_bucket(problem)
        self.failures.get(bucket, {}).pop(name, None)
        self.out_of_memory.get(bucket, set()).discard(name)

    def forget_out_of_memory(self, problem: Problem) -> None:
        """Out-of-memory failures are transient: when nothing is left to try, forget them for the
        bucket so the next call tries again instead of failing at once."""
        bucket = failure_bucket(problem)
        failures = self.failures.get(bucket, {})
        for name in self.out_of_memory.pop(bucket, ()):
            failures.pop(name, None)

    # ------------------------------------------------------------------ tunings
    def open_store(self, root_of_stores: Callable[[], object] | None, signature: str) -> TuningStore | None:
        """The tuning store, opened and loaded on first use; None when `root_of_stores` is None
        (tunings not remembered), the device has no identity, or its directory is unusable."""
        if not self._store_opened:
            self._store_opened = True
            device_key = self.ranking.source.identity
            if root_of_stores is not None and device_key:
                try:
                    self.store = TuningStore.at(root_of_stores(), device_key, signature)
                    self.tuned.update({**self.store.load(), **self.tuned})
                except OSError:
                    self.store = None
        return self.store

    def keep_measured(self, bucket: tuple, tuned: Tuned, *, store: bool = True) -> None:
        """A bucket measured on its calls (`measuring`): kept for this process and (`store`) in the store."""
        self.tuned[bucket] = tuned
        if store and self.store is not None:
            self.store.append(bucket, tuned)
