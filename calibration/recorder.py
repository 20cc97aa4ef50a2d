"""Where a worker's measurements go: the local results store (JSON Lines, fsync per point) and
the shared optuna storage (the problem's "points" study, one record trial per batch), so workers
on other hosts see them and a resumed run never measures a finished point again.

Each point reaches the results store as soon as it is measured (a crash loses at most the point in
flight); the storage gets a problem's points in one write when the problem ends or is given up
(one journal append instead of one per point). Points in the results store but not in the storage
(a kill in between) are copied there when their problem is next claimed (`sync_problem`). Points
decided without timing (unsupported, over the budget) go to the results store only: any worker
recomputes them from the kernels' declarations.

On a database storage (``postgresql://``, several hosts) the hosts share no results store, so each
point goes to the storage first, as soon as it is measured, and the decided points of a problem go
there too (another host's fit needs them): a host killed mid-problem leaves every finished point
where the others see it, and none is measured again.
"""

from __future__ import annotations

from collections.abc import Callable

from optuna.storages import BaseStorage, RDBStorage

from attn_dispatch.calibration.results import ResultsStore, measurement_record, problem_id, unit_key
from attn_dispatch.calibration.storage import (
    StudyIds,
    add_record_trial,
    find_study,
    record_trials,
    study_name,
)
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.measurement import Measurement

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
        self._pending: dict[Problem, list[dict]] = {}  # timed records not yet in the storage
        self._ids = StudyIds(storage)
        self.written = 0
        self.write_through = isinstance(storage, RDBStorage)  # see module docstring

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
        if missing:
            add_record_trial(self.storage, self._points_study(problem), {"measurements": missing})
        return len(missing)

    def record(self, measurement: Measurement) -> dict:
        """Append one point to the results store (fsync); the storage gets it at `flush` (on a
        database, before the results store)."""
        record = measurement_record(measurement, run=self.calibration_id, worker=self.worker)
        if self.write_through:
            add_record_trial(self.storage, self._points_study(measurement.problem), {"measurements": [record]})
        self.store.append([record])
        self._local.setdefault(record["unit"], record)
        if not self.write_through:
            self._pending.setdefault(measurement.problem, []).append(record)
        self.written += 1
        if self.on_record is not None:
            self.on_record(record)
        return record

    def record_decided(self, measurements: list[Measurement]) -> None:
        """Points decided without timing (unsupported, over budget): one batched append each."""
        records = [measurement_record(m, run=self.calibration_id, worker=self.worker) for m in measurements]
        if not records:
            return
        shared = [r for r in records if r.get("status") != "unsupported"]
        if self.write_through and shared:
            add_record_trial(self.storage, self._points_study(measurements[0].problem), {"measurements": shared})
        self.store.append(records)
        for record in records:
            self._local.setdefault(record["unit"], record)
            if self.on_record is not None:
                self.on_record(record)
        self.written += len(records)

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
