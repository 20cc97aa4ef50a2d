"""Where measurements are kept: the results store, the optuna storage the workers share, and the
`Recorder` that writes both. The store is JSON Lines (``Measurement.to_dict()`` plus ``run``,
``worker``, ``unit``), appended under ``flock`` with an fsync (readers skip a torn line). The
storage is a journal file by default (a killed run resumes) or a database URL for several hosts;
study names start with the calibration id.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import itertools
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
from optuna.exceptions import DuplicatedStudyError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.measurement import Measurement

SEPARATOR = "|"
# A journal lock left by a killed worker is broken after this many seconds without change; a
# holder keeps it for one append + fsync (milliseconds).
JOURNAL_LOCK_GRACE_S = 10
# Workers of several hosts starting on an empty database race to create optuna's tables; a loser
# finds them made on its next attempt.
OPEN_ATTEMPTS = 5
OPEN_RETRY_S = 0.3
PROBLEM_ID_HEX = 16  # hex digits of a problem's SHA-256 kept in its id
NEWLINE = b"\n"
POINTS = "points"


def open_storage(storage: str | os.PathLike | None, *, default_journal: str | os.PathLike) -> BaseStorage:
    """A storage from a URL, a journal file path, or None (the default journal); ValueError for a
    URL optuna cannot open (named without its password)."""
    optuna.logging.set_verbosity(logging.WARNING)  # optuna logs every trial; calibration prints its own progress
    text = os.fspath(default_journal if storage is None else storage)
    if "://" in text:
        return _open_database(text)
    path = Path(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = JournalFileSymlinkLock(str(path), grace_period=JOURNAL_LOCK_GRACE_S)
    return JournalStorage(JournalFileBackend(str(path), lock_obj=lock))


def with_installed_driver(url: str) -> str:
    """SQLAlchemy reads a bare ``postgresql://`` URL as psycopg2's; where only psycopg 3 is
    installed, the URL names it."""
    scheme, separator, rest = url.partition("://")
    if scheme == "postgresql" and not _installed("psycopg2") and _installed("psycopg"):
        return f"postgresql+psycopg{separator}{rest}"
    return url


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _open_database(url: str) -> RDBStorage:
    attempt = 1
    while True:
        try:
            return RDBStorage(with_installed_driver(url))
        except Exception as error:  # noqa: BLE001 - sqlalchemy and the drivers raise many types
            text = str(error).lower()
            lost_race = "already exists" in text or "duplicate key" in text or "unique" in text
            if attempt >= OPEN_ATTEMPTS or not lost_race:
                raise ValueError(f"cannot open optuna storage {_without_password(url)}: {error}") from error
        attempt += 1
        time.sleep(OPEN_RETRY_S * random.uniform(0.5, 1.5))


def _without_password(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rpartition('@')[2]}"


def describe_storage(storage: str | os.PathLike | None, *, default_journal: str | os.PathLike) -> str:
    text = os.fspath(storage if storage is not None else default_journal)
    return _without_password(text) if "://" in text else text  # never print a password


def study_name(calibration_id: str, *parts: str) -> str:
    """``<calibration id>|part|part...``."""
    return SEPARATOR.join((calibration_id, *parts))


def find_study(storage: BaseStorage, name: str) -> int | None:
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        return None


def ensure_study(storage: BaseStorage, name: str) -> int:
    """The id of study `name`, created (minimising) if it does not exist yet. Looks before it
    writes: creating an existing study would still append a log line to a journal."""
    existing = find_study(storage, name)
    if existing is not None:
        return existing
    try:
        return storage.create_new_study([StudyDirection.MINIMIZE], name)
    except DuplicatedStudyError:
        return storage.get_study_id_from_name(name)


def study_ids(storage: BaseStorage) -> Callable[[str], int]:
    """`ensure_study` with the ids remembered (a study is never deleted during a calibration)."""
    return functools.cache(functools.partial(ensure_study, storage))


def add_record_trial(storage: BaseStorage, study_id: int, attrs: dict, value: float | None = None) -> int:
    """Append a finished trial holding `attrs` in one storage operation (atomic; in journal order
    the first of competing appends has the lowest number). Returns the trial number."""
    template = FrozenTrial(
        number=-1, state=TrialState.COMPLETE if value is not None else TrialState.FAIL, value=value,
        datetime_start=None, datetime_complete=None, params={}, distributions={}, user_attrs=attrs,
        system_attrs={}, intermediate_values={}, trial_id=-1,
    )
    return storage.get_trial_number_from_id(storage.create_new_trial(study_id, template_trial=template))


def record_trials(storage: BaseStorage, study_id: int) -> list[FrozenTrial]:
    return storage.get_all_trials(study_id, deepcopy=False)


def problem_id(problem: Problem) -> str:
    """A short stable id of `problem` (hash of its canonical JSON)."""
    text = json.dumps(problem.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:PROBLEM_ID_HEX]


def unit_key(problem: Problem, kernel: str) -> str:
    """The unit of work calibration never measures twice: one kernel on one problem."""
    return f"{problem_id(problem)}|{kernel}"


def _finite(value: object) -> object:
    """JSON has no inf or nan: non-finite floats in free-form fields become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def measurement_record(measurement: Measurement, *, run: str, worker: str) -> dict:
    """The JSON line stored for `measurement`."""
    record = measurement.to_dict()
    record["extra"] = _finite(record.get("extra") or {})
    return {**record, "run": run, "worker": worker, "unit": unit_key(measurement.problem, measurement.kernel)}


@contextmanager
def _locked(path: Path, mode: str, lock: int) -> Iterator:
    with open(path, mode) as handle:
        fcntl.flock(handle.fileno(), lock)
        try:
            yield handle
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _complete_lines(data: bytes) -> tuple[list[bytes], int]:
    """Complete lines of `data` and the number of bytes they span (a partial tail is left)."""
    end = data.rfind(NEWLINE) + 1
    return data[:end].splitlines(), end


def parse_lines(lines: Iterable[bytes]) -> tuple[list[dict], int]:
    """JSON objects among `lines`, and how many lines were malformed (skipped)."""
    records, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            bad += 1
    return records, bad


class ResultsStore:
    """An append-only JSON Lines file of measurement records, safe for concurrent writers (created
    with its directory on first append)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.skipped_lines = 0
        self._offset = 0

    def append(self, records: Iterable[dict]) -> int:
        """Append `records` (one line each) under the lock, then fsync. Returns how many."""
        payload = b"".join(json.dumps(r, separators=(",", ":"), allow_nan=False).encode() + NEWLINE for r in records)
        if not payload:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self.path, "ab+", fcntl.LOCK_EX) as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() > 0:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != NEWLINE:  # a writer died mid-line: isolate its fragment
                    payload = NEWLINE + payload
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        return payload.count(NEWLINE)

    def read(self) -> list[dict]:
        """Every complete, well-formed record (``skipped_lines`` counts the others)."""
        if not self.path.exists():
            return []
        lines, _ = _complete_lines(self.path.read_bytes())
        records, self.skipped_lines = parse_lines(lines)
        return records

    def read_new(self) -> list[dict]:
        """Records appended since the last `read_new` call (for progress displays)."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        lines, used = _complete_lines(data)
        self._offset += used
        return parse_lines(lines)[0]

    def measurements(self, *, run: str | None = None) -> list[Measurement]:
        """Measurements of calibration `run` (all runs when None), one per unit (the first)."""
        out = []
        for record in self.read():
            if run is not None and record.get("run") != run:
                continue
            try:
                out.append(Measurement.from_dict(record))
            except ValueError:
                self.skipped_lines += 1
        return merge(out)


def merge(*sources: list[Measurement]) -> list[Measurement]:
    """One measurement per unit (problem, kernel), the first source winning."""
    kept: dict[str, Measurement] = {}
    for m in itertools.chain(*sources):
        kept.setdefault(unit_key(m.problem, m.kernel), m)
    return list(kept.values())


class Recorder:
    """Writes the measurements of one calibration and knows which units are done. A point reaches
    the results store at once, the problem's "points" study in one write when the problem ends
    (a kill in between is repaired by `sync_problem`); points decided without timing stay in the
    store only, except on a database storage (no shared store), where every point goes at once.
    """

    def __init__(self, store: ResultsStore, storage: BaseStorage, calibration_id: str, worker: str, *,
                 on_record: Callable[[dict], None] | None = None) -> None:
        self.store = store
        self.storage = storage
        self.calibration_id = calibration_id
        self.worker = worker
        self.on_record = on_record
        self._local: dict[str, dict] = {}  # unit -> record, from the results store
        self._pending: dict[Problem, list[dict]] = {}  # timed records not yet in the storage
        self._ids = study_ids(storage)
        self.write_through = isinstance(storage, RDBStorage)

    def _points_study(self, problem: Problem) -> int:
        return self._ids(study_name(self.calibration_id, POINTS, problem_id(problem)))

    def refresh(self) -> None:
        """Read records appended to the results store since the last refresh."""
        for record in self.store.read_new():
            if record.get("run") == self.calibration_id and isinstance(record.get("unit"), str):
                self._local.setdefault(record["unit"], record)

    def known(self, problem: Problem) -> dict[str, Measurement]:
        """kernel name -> measurement already taken on `problem` (results store or storage)."""
        self.refresh()
        prefix = problem_id(problem) + "|"
        out = {unit[len(prefix):]: Measurement.from_dict(record)
               for unit, record in self._local.items() if unit.startswith(prefix)}
        for record in storage_records(self.storage, self.calibration_id, problem):
            measurement = Measurement.from_dict(record)
            out.setdefault(measurement.kernel, measurement)
        return out

    def sync_problem(self, problem: Problem) -> int:
        """Copy this problem's results-store points missing from the storage; returns how many."""
        self.refresh()
        in_storage = {unit_key(problem, r["kernel"]) for r in storage_records(self.storage, self.calibration_id, problem)}
        prefix = problem_id(problem) + "|"
        missing = [r for unit, r in self._local.items()
                   if unit.startswith(prefix) and unit not in in_storage and r.get("status") != "unsupported"]
        if missing:
            add_record_trial(self.storage, self._points_study(problem), {"measurements": missing})
        return len(missing)

    def record(self, measurement: Measurement) -> dict:
        """Append one point to the results store (fsync); the storage gets it at `flush` (on a
        database, before the results store)."""
        record = measurement_record(measurement, run=self.calibration_id, worker=self.worker)
        if self.write_through:
            add_record_trial(self.storage, self._points_study(measurement.problem), {"measurements": [record]})
        self._append([record])
        if not self.write_through:
            self._pending.setdefault(measurement.problem, []).append(record)
        return record

    def record_decided(self, measurements: list[Measurement]) -> None:
        """Points decided without timing (unsupported, over budget): one batched append each."""
        records = [measurement_record(m, run=self.calibration_id, worker=self.worker) for m in measurements]
        if not records:
            return
        shared = [r for r in records if r.get("status") != "unsupported"]
        if self.write_through and shared:
            add_record_trial(self.storage, self._points_study(measurements[0].problem), {"measurements": shared})
        self._append(records)

    def _append(self, records: list[dict]) -> None:
        """Append `records` to the results store and note them as known."""
        self.store.append(records)
        for record in records:
            self._local.setdefault(record["unit"], record)
            if self.on_record is not None:
                self.on_record(record)

    def flush(self, problem: Problem) -> None:
        """Write `problem`'s timed points not yet in the storage (one storage write)."""
        records = self._pending.pop(problem, [])
        if records:
            add_record_trial(self.storage, self._points_study(problem), {"measurements": records})


def _records(attrs: dict) -> list[dict]:
    return list(attrs.get("measurements", ())) + ([attrs["measurement"]] if "measurement" in attrs else [])


def storage_records(storage: BaseStorage, calibration_id: str, problem: Problem) -> list[dict]:
    """Measurement records of `problem` held in the storage."""
    study_id = find_study(storage, study_name(calibration_id, POINTS, problem_id(problem)))
    if study_id is None:
        return []
    return [record for t in record_trials(storage, study_id) for record in _records(t.user_attrs)]


def storage_measurements(storage: BaseStorage, calibration_id: str) -> list[Measurement]:
    """Every measurement of the calibration held in the storage (all hosts)."""
    prefix = study_name(calibration_id, POINTS, "")
    out = []
    for study in storage.get_all_studies():
        if study.study_name.startswith(prefix):
            for trial in record_trials(storage, study._study_id):
                out += [Measurement.from_dict(record) for record in _records(trial.user_attrs)]
    return out
