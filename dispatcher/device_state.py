"""What a dispatcher keeps per device: its ranker, the kernels that failed per problem bucket, and
the first-call tunings per bucket with the store that keeps them across processes. The
`Dispatcher` holds its lock around every change made here."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_dispatch.dispatcher._plan import check_scale, failure_message
from attn_dispatch.dispatcher.planning import Option, failure_bucket
from attn_dispatch.dispatcher.ranking import DeviceRanking
from attn_dispatch.dispatcher.tuning import Tuned, can_time, contenders, put_first, tune
from attn_dispatch.dispatcher.tuning_store import TuningStore
from attn_dispatch.kernels import Problem


class DeviceState:
    """One device's state.

    Attributes
    ----------
    failures: bucket -> kernel name -> why it failed at run time (not tried again there).
    out_of_memory: bucket -> names of those failures that were out of memory (transient).
    tuned: bucket -> its first-call tuning; store: where tunings are kept (None: memory only).
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

    def apply_tuning(self, options: tuple[Option, ...], notes: tuple[str, ...], dropped: tuple, problem: Problem,
                     device: torch.device, inputs: tuple | None,
                     on_failure: Callable[[str, BaseException], None]):
        """`options` with the bucket's tuned kernel first (`dispatcher.tuning`), tuning the bucket
        now when it has no tuning yet, several contenders, and `inputs` to time; contenders that
        raise go to `on_failure` and are dropped. Returns (options, notes, dropped, pending):
        pending when the bucket needs tuning but this decision could not time anything."""
        bucket = failure_bucket(problem)
        tuned = self.tuned.get(bucket)
        if tuned is None and len(contenders(options)) > 1:
            if inputs is None or not can_time(device):
                return options, notes, dropped, True  # the next inference call that can time tunes it
            check_scale(inputs[4])
            failed_now: dict[str, str] = {}

            def failed(name: str, error: BaseException) -> None:
                failed_now[name] = failure_message(error)
                on_failure(name, error)

            tuned = tune(options, inputs, problem, device, on_failure=failed)
            if tuned is not None:
                self.tuned[bucket] = tuned
                if self.store is not None:
                    self.store.append(bucket, tuned)
            if failed_now and any(option.kernel.name not in failed_now for option in options):
                options = tuple(option for option in options if option.kernel.name not in failed_now)
                dropped += tuple((name, f"failed at run time on a problem of this size: {why}")
                                 for name, why in failed_now.items())
        if tuned is not None and any(option.kernel.name == tuned.kernel for option in options):
            options, notes = put_first(options, tuned.kernel), (*notes, tuned.note())
        return options, notes, dropped, False
