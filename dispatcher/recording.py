"""Record the distinct problem buckets a run hits, for ``attn-dispatch calibrate --workload``: with
``ATTN_DISPATCH_RECORD=path`` or ``with attn_dispatch.record(path):``. Each new bucket (`selection.failure_bucket`)
is appended as one JSON line with its first exact problem; the file is deduplicated across runs and written under a
lock. Only the cold path records; an error is a warning, never a failed call."""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attn_dispatch.dispatcher.selection import failure_bucket
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.environment import RECORD

FORMAT = 1
"""Version of a workload line (`calibration.plan.read_workload` reads it and refuses others)."""


def workload_bucket(problem: Problem) -> list:
    """The bucket a problem is recorded under, as JSON."""
    return [list(part) if isinstance(part, tuple) else part for part in failure_bucket(problem)]


class WorkloadRecorder:
    """Appends each new bucket of the problems it is given to one JSON Lines file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: set[str] | None = None  # bucket keys, read from the file on first use

    def _key(self, bucket: list) -> str:
        return json.dumps(bucket, separators=(",", ":"))

    def _load(self) -> set[str]:
        """Bucket keys already in the file (a torn line from a killed process is skipped)."""
        seen = set()
        if self.path.exists():
            with open(self.path, encoding="utf-8") as handle:
                for text in handle:
                    try:
                        seen.add(self._key(json.loads(text)["bucket"]))
                    except (ValueError, KeyError, TypeError):
                        continue
        return seen

    def add(self, problem: Problem) -> bool:
        """Record `problem` if its bucket is new; True when a line was written."""
        bucket = workload_bucket(problem)
        key = self._key(bucket)
        with self._lock:
            if self._seen is None:
                self._seen = self._load()
            if key in self._seen:
                return False
            line = json.dumps({"format": FORMAT, "bucket": bucket, "problem": problem.to_dict()}) + "\n"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line)
            self._seen.add(key)
            return True

    @property
    def buckets(self) -> int:
        """Buckets in the file (those recorded now and in earlier runs)."""
        with self._lock:
            if self._seen is None:
                self._seen = self._load()
            return len(self._seen)


_recorders: dict[Path, WorkloadRecorder] = {}
_active: list[WorkloadRecorder] = []  # innermost `record()` last
_registry_lock = threading.Lock()


def recorder_for(path: str | os.PathLike) -> WorkloadRecorder:
    """The one recorder of `path` in this process (so every user of a file shares its lock)."""
    resolved = Path(path).expanduser().resolve()
    with _registry_lock:
        recorder = _recorders.get(resolved)
        if recorder is None:
            recorder = _recorders[resolved] = WorkloadRecorder(resolved)
        return recorder


def record_problem(problem: Problem) -> None:
    """Record `problem`'s bucket in the active `record()` file and ``$ATTN_DISPATCH_RECORD`` (cheap when off)."""
    env_path = RECORD.read()
    if not _active and not env_path:
        return
    targets = list(_active)
    if env_path:
        targets.append(recorder_for(env_path))
    for recorder in dict.fromkeys(targets):
        try:
            recorder.add(problem)
        except OSError as error:
            warnings.warn(f"attn_dispatch could not record the workload to {recorder.path}: {error}", stacklevel=2)


@contextmanager
def record(path: str | os.PathLike) -> Iterator[WorkloadRecorder]:
    """Record every new bucket the dispatcher decides inside the block to `path` (shapes decided before are warm:
    ``attn_dispatch.reset()`` first to record a whole run)."""
    recorder = recorder_for(path)
    with _registry_lock:
        _active.append(recorder)
    try:
        yield recorder
    finally:
        with _registry_lock:
            _active.remove(recorder)
