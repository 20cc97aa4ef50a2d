"""The optuna storage every worker of one calibration shares, and the study names inside it.

A journal file in the cache directory by default (a killed run resumes where it stopped); a URL
(``sqlite:///...``, ``postgresql://...``) lets workers on several hosts share one calibration.
Study names carry everything that can invalidate a timing (Triton's autotuner cache key): the
device fingerprint and software stack sit in the calibration id, then the kernel family and the
problem.
"""

from __future__ import annotations

import logging
import os
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
        try:
            return RDBStorage(text)
        except Exception as error:  # noqa: BLE001 - sqlalchemy raises many types; name the URL
            raise ValueError(f"cannot open optuna storage {text!r}: {error}") from error
    path = Path(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = JournalFileSymlinkLock(str(path), grace_period=JOURNAL_LOCK_GRACE_S)
    return JournalStorage(JournalFileBackend(str(path), lock_obj=lock))


def describe_storage(storage: str | os.PathLike | None, *, default_journal: str | os.PathLike) -> str:
    text = os.fspath(storage if storage is not None else default_journal)
    if is_url(text):
        scheme, _, rest = text.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}"  # never print a password
    return text


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
