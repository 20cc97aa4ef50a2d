"""The optuna storage every worker of one calibration shares, and the study names inside it.

A journal file in the cache directory by default (a killed run resumes where it stopped); a URL
(``sqlite:///...``, ``postgresql://...``) lets workers on several hosts share one calibration.
Study names carry everything that can invalidate a timing (Triton's autotuner cache key): the
device fingerprint and software stack sit in the calibration id, then the kernel family and the
problem.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import time
from pathlib import Path

import optuna
from optuna.exceptions import DuplicatedStudyError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

SEPARATOR = "|"
# A journal lock left by a killed worker is broken after this many seconds without change
# (optuna's default is 30 s). Every holder keeps the lock for one append + fsync (milliseconds),
# so 10 s never breaks a live lock and a resumed run waits at most 10 s.
JOURNAL_LOCK_GRACE_S = 10
# Workers of several hosts start together on an empty database: each creates optuna's tables, and
# PostgreSQL lets only one `CREATE TABLE` of a name win (the others fail on a unique index). A
# loser finds the tables made on its next attempt; a few attempts over about a second cover it.
OPEN_ATTEMPTS = 5
OPEN_RETRY_S = 0.3


def quiet_optuna() -> None:
    """Optuna logs every trial at INFO; calibration prints its own progress."""
    optuna.logging.set_verbosity(logging.WARNING)


def is_url(storage: str) -> bool:
    return "://" in storage


def open_storage(storage: str | os.PathLike | None, *, default_journal: str | os.PathLike) -> BaseStorage:
    """A storage from a URL, a journal file path, or None (the default journal file).

    Raises
    ------
    ValueError: for a URL optuna cannot open (the message names it).
    """
    quiet_optuna()
    if storage is None:
        storage = default_journal
    text = os.fspath(storage)
    if is_url(text):
        return _open_database(text)
    path = Path(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = JournalFileSymlinkLock(str(path), grace_period=JOURNAL_LOCK_GRACE_S)
    return JournalStorage(JournalFileBackend(str(path), lock_obj=lock))


def with_installed_driver(url: str) -> str:
    """SQLAlchemy reads a bare ``postgresql://`` URL as psycopg2's; where only psycopg 3 (the
    maintained driver, the one the `test` extra installs) is present, the URL names it."""
    scheme, separator, rest = url.partition("://")
    if scheme == "postgresql" and not _installed("psycopg2") and _installed("psycopg"):
        return f"postgresql+psycopg{separator}{rest}"
    return url


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _open_database(url: str) -> RDBStorage:
    """optuna's RDBStorage on `url`, retried while a peer is creating the tables (`OPEN_ATTEMPTS`).

    Raises
    ------
    ValueError: when the database cannot be opened (the message names it, without a password).
    """
    attempt = 1
    while True:
        try:
            return RDBStorage(with_installed_driver(url))
        except Exception as error:  # noqa: BLE001 - sqlalchemy and the drivers raise many types
            if attempt >= OPEN_ATTEMPTS or not _lost_a_creation_race(error):
                raise ValueError(f"cannot open optuna storage {_without_password(url)}: {error}") from error
        attempt += 1
        time.sleep(OPEN_RETRY_S * random.uniform(0.5, 1.5))


def _lost_a_creation_race(error: Exception) -> bool:
    """Another process created optuna's tables (or a row of them) at the same moment."""
    text = str(error).lower()
    return "already exists" in text or "duplicate key" in text or "unique" in text


def _without_password(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rpartition('@')[2]}"


def describe_storage(storage: str | os.PathLike | None, *, default_journal: str | os.PathLike) -> str:
    text = os.fspath(storage if storage is not None else default_journal)
    return _without_password(text) if is_url(text) else text  # never print a password


def study_name(calibration_id: str, *parts: str) -> str:
    """``<calibration id>|part|part...`` (the id holds device, software, kernel set, settings)."""
    return SEPARATOR.join((calibration_id, *parts))


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


class StudyIds:
    """`ensure_study` with the ids remembered (a study is never deleted during a calibration)."""

    def __init__(self, storage: BaseStorage) -> None:
        self.storage = storage
        self._ids: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        if name not in self._ids:
            self._ids[name] = ensure_study(self.storage, name)
        return self._ids[name]


def find_study(storage: BaseStorage, name: str) -> int | None:
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        return None


def add_record_trial(storage: BaseStorage, study_id: int, attrs: dict, value: float | None = None) -> int:
    """Append a finished trial holding `attrs` in one storage operation (atomic; in journal order
    the first of competing appends has the lowest number). Returns the trial number."""
    state = TrialState.COMPLETE if value is not None else TrialState.FAIL
    template = FrozenTrial(
        number=-1, state=state, value=value, datetime_start=None, datetime_complete=None,
        params={}, distributions={}, user_attrs=attrs, system_attrs={}, intermediate_values={},
        trial_id=-1,
    )
    trial_id = storage.create_new_trial(study_id, template_trial=template)
    return storage.get_trial_number_from_id(trial_id)


def record_trials(storage: BaseStorage, study_id: int) -> list[FrozenTrial]:
    return storage.get_all_trials(study_id, deepcopy=False)
