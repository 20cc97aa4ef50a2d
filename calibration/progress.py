"""The progress bar of a calibration: problems decided out of those planned (with an ETA), and
the points timed so far. In-process workers report through callbacks; with one process per device
the parent polls the results store and the shared storage instead.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

from optuna.storages import BaseStorage
from tqdm import tqdm

from attn_dispatch.calibration.claims import ClaimBoard, Owner
from attn_dispatch.calibration.plan import agreed
from attn_dispatch.calibration.results import ResultsStore, problem_id

# The parent reads claim states (one storage read per problem) at most this often.
STATE_POLL_S = 2.0


class Progress:
    """A tqdm bar over problems with point counts as its postfix.

    Parameters
    ----------
    enabled: False for a silent run (tests, --quiet).
    """

    def __init__(self, *, enabled: bool) -> None:
        self.points = Counter()
        self._enabled = enabled
        self._made: tqdm | None = None  # made at the first plan: a too-busy refusal prints one line, no bar

    @property
    def _bar(self) -> tqdm:
        if self._made is None:
            self._made = tqdm(
                total=0, unit="problem", desc="calibrating", file=sys.stderr, disable=not self._enabled,
                dynamic_ncols=True, smoothing=0.1,
            )
        return self._made

    def plan(self, added: int) -> None:
        self._bar.total = (self._bar.total or 0) + added
        self._bar.refresh()

    def problem(self, count: int = 1) -> None:
        self._bar.update(count)

    def record(self, record: dict) -> None:
        self.points[record.get("status", "?")] += 1
        timed = sum(n for s, n in self.points.items() if s != "unsupported")
        self._bar.set_postfix(points=timed, infeasible=self.points["infeasible"], refresh=False)

    def close(self) -> None:
        if self._made is not None:
            self._made.close()


class StoragePoller:
    """Feeds `Progress` from the results store and the claim states (multi-process runs)."""

    def __init__(self, progress: Progress, store: ResultsStore, storage: BaseStorage, calibration_id: str, *, stages: list[str]) -> None:
        self.progress = progress
        self.store = store
        self.storage = storage
        self.calibration_id = calibration_id
        self.stages = stages
        self.board = ClaimBoard(storage, calibration_id, Owner.current("progress"))
        self._planned: dict[str, int] = {}
        self._done = 0
        self._last_state = 0.0

    def __call__(self) -> None:
        for record in self.store.read_new():
            if record.get("run") == self.calibration_id:
                self.progress.record(record)
        if time.time() - self._last_state < STATE_POLL_S:
            return
        self._last_state = time.time()
        problems = []
        for stage in self.stages:
            plan = agreed(self.storage, self.calibration_id, stage)
            if plan is None:
                continue
            if stage not in self._planned:
                self._planned[stage] = len(plan)
                self.progress.plan(len(plan))
            problems += plan
        done = sum(1 for p in problems if self.board.state(problem_id(p)).done)
        if done > self._done:
            self.progress.problem(done - self._done)
            self._done = done
