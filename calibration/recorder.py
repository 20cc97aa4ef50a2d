"""Where a worker's measurements go: the local results store (JSON Lines, fsync per point) and
the shared optuna storage (one record trial per point in the problem's "points" study), so workers
on other hosts see them and a resumed run never measures a finished point again.

Order of writes: results store first (local durability), then storage; a point that reached the
results store but not the storage (a kill in between) is copied to the storage when its problem
is next claimed (`sync_problem`).
"""

from __future__ import annotations

from collections.abc import Callable

from optuna.storages import BaseStorage

from calibration.results import ResultsStore, measurement_record, problem_id, unit_key
from calibration.storage import add_record_trial, ensure_study, find_study, record_trials, study_name
from kernels.problem import Problem
from models.measurement import Measurement

POINTS = "points"


class Recorder:
    """Writes measurements of one calibration and knows which units are done.

    Parameters
    ----------
    store: the results store (shared by the workers of this host).
    storage: the optuna storage (shared by every worker of the calibration).
    calibration_id, worker: written into every record.
    on_record: called with each record written (progress displays).
    """

    def __init__(
        self,
        store: ResultsStore,
        storage: BaseStorage,
        calibration_id: str,
        worker: str,
        *,
        on_record: Callable[[dict], None] | None = None,
    ) -> None:
        self.store = store
        self.storage = storage
        self.calibration_id = calibration_id
        self.worker = worker
        self.on_record = on_record
        self._local: dict[str, dict] = {}  # unit -> record, from the results store
        self.written = 0

    def _points_study(self, problem: Problem) -> int:
        return ensure_study(self.storage, study_name(self.calibration_id, POINTS, problem_id(problem)))

    def refresh(self) -> None:
        """Read records appended to the results store since the last refresh."""
        for record in self.store.read_new():
            if record.get("run") == self.calibration_id and isinstance(record.get("unit"), str):
                self._local.setdefault(record["unit"], record)

    def known(self, problem: Problem) -> dict[str, Measurement]:
        """kernel name -> measurement already taken on `problem` (results store or storage)."""
        self.refresh()
        prefix = problem_id(problem) + "|"
        out: dict[str, Measurement] = {}
        for unit, record in self._local.items():
            if unit.startswith(prefix):
                out[unit[len(prefix):]] = Measurement.from_dict(record)
        for record in storage_records(self.storage, self.calibration_id, problem):
            measurement = Measurement.from_dict(record)
            out.setdefault(measurement.kernel, measurement)
        return out

    def sync_problem(self, problem: Problem) -> int:
        """Copy this problem's results-store points missing from the storage; returns how many."""
        self.refresh()
        in_storage = {unit_key(problem, r["kernel"]) for r in storage_records(self.storage, self.calibration_id, problem)}
        prefix = problem_id(problem) + "|"
        missing = [
            r for unit, r in self._local.items()
            if unit.startswith(prefix) and unit not in in_storage and r.get("status") not in ("unsupported",)
        ]
        study_id = self._points_study(problem) if missing else None
        for record in missing:
            add_record_trial(self.storage, study_id, {"measurement": record}, _value(record))
        return len(missing)

    def record(self, measurement: Measurement, *, to_storage: bool = True) -> dict:
        """Append one point to the results store (fsync) and, unless told not to, the storage."""
        record = measurement_record(measurement, run=self.calibration_id, worker=self.worker)
        self.store.append([record])
        self._local.setdefault(record["unit"], record)
        if to_storage:
            add_record_trial(self.storage, self._points_study(measurement.problem), {"measurement": record}, _value(record))
        self.written += 1
        if self.on_record is not None:
            self.on_record(record)
        return record

    def record_decided(self, measurements: list[Measurement]) -> None:
        """Points decided without timing (unsupported, over budget): one batched append each."""
        records = [measurement_record(m, run=self.calibration_id, worker=self.worker) for m in measurements]
        if not records:
            return
        self.store.append(records)
        for record in records:
            self._local.setdefault(record["unit"], record)
            if self.on_record is not None:
                self.on_record(record)
        self.written += len(records)


def _value(record: dict) -> float | None:
    return record["median_s"] if record.get("status") == "ok" and record.get("median_s") is not None else None


def storage_records(storage: BaseStorage, calibration_id: str, problem: Problem) -> list[dict]:
    """Measurement records of `problem` held in the storage."""
    study_id = find_study(storage, study_name(calibration_id, POINTS, problem_id(problem)))
    if study_id is None:
        return []
    return [t.user_attrs["measurement"] for t in record_trials(storage, study_id) if "measurement" in t.user_attrs]


def storage_measurements(storage: BaseStorage, calibration_id: str) -> list[Measurement]:
    """Every measurement of the calibration held in the storage (all hosts)."""
    prefix = study_name(calibration_id, POINTS, "")
    out = []
    for study in storage.get_all_studies():
        if study.study_name.startswith(prefix):
            for trial in record_trials(storage, study._study_id):
                if "measurement" in trial.user_attrs:
                    out.append(Measurement.from_dict(trial.user_attrs["measurement"]))
    return out
