"""One `attn-dispatch calibrate` run: workers (in-process for one device, one process per device
otherwise) with a progress bar, then gather, gate, fit and write the table, and summarise.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from optuna.storages import BaseStorage
from tqdm import tqdm

from attn_dispatch.calibration.claims import ClaimBoard, Owner
from attn_dispatch.calibration.config import CalibrationConfig, default_results, default_storage
from attn_dispatch.calibration.finish import TOO_BUSY_REASON, FitOutcome, fit_and_write
from attn_dispatch.calibration.noise import (
    ALLOWED_CAUSE,
    WIDE_BUDGET_FACTOR,
    WIDE_MIN_REPS,
    MachineBusy,
    Noise,
    check_quiet,
    probe_noise,
    too_busy_cause,
    too_busy_reason,
)
from attn_dispatch.calibration.plan import agreed, for_device, read_workload
from attn_dispatch.calibration.results import (
    ResultsStore,
    describe_storage,
    merge,
    open_storage,
    problem_id,
    storage_measurements,
)
from attn_dispatch.calibration.worker import Worker, WorkerReport, launch_workers
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.identity import DeviceIdentity, torch_threads
from attn_dispatch.models.measurement import Measurement

# The parent reads claim states (one storage read per problem) at most this often.
STATE_POLL_S = 2.0


class Progress:
    """A tqdm bar over problems (with an ETA) with point counts as its postfix; `enabled` False
    for a silent run."""

    def __init__(self, *, enabled: bool) -> None:
        self.points = Counter()
        self._enabled = enabled
        self._made: tqdm | None = None  # made at the first plan: a too-busy refusal prints one line, no bar

    @property
    def _bar(self) -> tqdm:
        return self._made if self._made is not None else self._make(total=0)

    def _make(self, total: int) -> tqdm:
        self._made = tqdm(total=total, unit="problem", desc="calibrating", file=sys.stderr,
                          disable=not self._enabled, dynamic_ncols=True, smoothing=0.1)
        return self._made

    def plan(self, added: int) -> None:
        """Add `added` problems to the bar's total; the first plan makes the bar with its total (a bar
        made with none draws an empty "0problem" line)."""
        if self._made is None:
            self._make(total=added)
        else:
            self._made.total = (self._made.total or 0) + added
        self._show_points()
        self._made.refresh()

    def problem(self, count: int = 1) -> None:
        self._bar.update(count)

    def record(self, record: dict) -> None:
        """Count a point; shown once a plan made the bar (a point before any plan draws no empty bar)."""
        self.points[record.get("status", "?")] += 1
        if self._made is not None:
            self._show_points()

    def _show_points(self) -> None:
        timed = sum(n for s, n in self.points.items() if s != "unsupported")
        self._bar.set_postfix(points=timed, infeasible=self.points["infeasible"], refresh=False)

    def close(self) -> None:
        if self._made is not None:
            self._made.close()


class StoragePoller:
    """Feeds `Progress` from the results store and the claim states (one process per device)."""

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


def discard_if_empty(path: str | os.PathLike) -> None:
    """Remove the file at `path` if it exists and holds nothing (never a file with data in it),
    and then its folder if that leaves the folder empty (a first calibration's ``journals/``)."""
    try:
        if os.path.getsize(path) == 0:
            os.remove(path)
            os.rmdir(os.path.dirname(os.path.abspath(path)))  # refused (OSError) unless empty
    except OSError:
        pass


def too_busy_measured(cause: str) -> str:
    """The warning of a calibration a probe found too busy (`cause`: `noise.too_busy_cause`) that
    stored no table."""
    return (f"warning: {cause}; these timings may rank kernels wrongly; calibrate again when the machine "
            "is quiet")


def too_busy_stored(cause: str) -> str:
    """The warning of a too-busy calibration whose table was stored (PyTorch's default serves)."""
    return (f"warning: {cause}, so the table stored does not use its model or its per-bucket winners: PyTorch's "
            "default serves inference calls, except in the buckets measured here, where their measured "
            "winners do (PyTorch's default where its time overlaps the fastest); calibrate again when the "
            "machine is quiet")


TOO_BUSY_STORED = too_busy_stored(ALLOWED_CAUSE)  # under --allow-busy


@dataclass
class CalibrationSummary:
    """What a calibration did (printed at the end of `attn-dispatch calibrate`)."""

    calibration_id: str
    identity: DeviceIdentity
    devices: tuple[str, ...]
    results_path: Path
    storage: str
    wall_s: float = 0.0
    measuring_s: float = 0.0
    resumed_points: int = 0
    reports: list[WorkerReport] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    fit: FitOutcome = field(default_factory=FitOutcome)
    workload: list[Problem] = field(default_factory=list)
    noise_start: Noise | None = None  # the machine's noise before and after measuring
    noise_end: Noise | None = None

    @property
    def statuses(self) -> Counter:
        return Counter(m.status for m in self.measurements)

    @property
    def timed_now(self) -> int:
        return sum(r.timed for r in self.reports)

    def timing_thread_count(self) -> int | None:
        """The torch threads every worker of a CPU calibration timed with (the table records it);
        None on a GPU or for mixed counts."""
        threads = {r.threads for r in self.reports if r.threads}
        return threads.pop() if self.identity.device_type == "cpu" and len(threads) == 1 else None

    def timing_threads(self) -> str:
        """``"1 torch thread of its 2 logical CPUs"`` for a CPU calibration; "" on a GPU."""
        threads = sorted({r.threads for r in self.reports if r.threads})
        if self.identity.device_type != "cpu" or not threads:
            return ""
        used = torch_threads(threads[0]) if len(threads) == 1 else f"{'/'.join(map(str, threads))} torch threads"
        return f"{used} of its {self.identity.compute_units} logical CPUs"

    def noise_lines(self) -> list[str]:
        if self.noise_start is None:
            return []
        wide = self.noise_start.wide or (self.noise_end is not None and self.noise_end.wide)  # one unit for both
        out = [f"machine before measuring: {self.noise_start.describe(as_multiple=wide)}"]
        if self.noise_end is not None:
            out.append(f"machine after measuring: {self.noise_end.describe(as_multiple=wide)}")
        if any(r.widened for r in self.reports):
            out.append(f"timer widened for a busy machine: at least {WIDE_MIN_REPS} samples per point, "
                       f"{WIDE_BUDGET_FACTOR:g}x the per-point budget")
        cause = too_busy_cause(self.noise_start, self.noise_end)
        if cause is not None:
            out.append(too_busy_stored(cause) if self.fit.table_paths else too_busy_measured(cause))
        elif any(n is not None and n.busy for n in (self.noise_start, self.noise_end)):
            out.append("warning: these timings were taken on a busy machine and may rank kernels wrongly; the "
                       "held-out quality below says how the table compares; calibrate again when the machine is quiet")
        if any(n is not None and n.starved for n in (self.noise_start, self.noise_end)):
            out.append("warning: other processes kept this machine's cores busy (a low CPU share above): every "
                       "timing is stretched, and unevenly across kernels")
        return out

    def workload_measured(self) -> tuple[int, int]:
        """(recorded workload buckets with at least one timed kernel, recorded buckets)."""
        timed = {m.problem for m in self.measurements if m.ok}
        measured = sum(1 for p in self.workload if p in timed)
        return measured, len(self.workload)

    def lines(self) -> list[str]:
        s = self.statuses
        problems = len({m.problem for m in self.measurements})
        timed = sum(n for status, n in s.items() if status != "unsupported")
        oom = sum(1 for m in self.measurements if m.status == "infeasible" and m.reason.startswith("out of memory"))
        stopped = ", ".join(sorted({r.stopped for r in self.reports})) or "-"
        threads = self.timing_threads()
        out = [
            f"calibrated {self.identity.model_key} on {', '.join(self.devices)}"
            + (f", timing with {threads}," if threads else "")
            + f" in {self.wall_s:.1f} s "
            f"(measuring {self.measuring_s:.1f} s; workers stopped: {stopped})",
            f"points: {timed} measured on {problems} problems ({self.timed_now} timed now, {self.resumed_points} resumed); "
            f"{s['ok']} ok, {s['infeasible']} infeasible ({oom} out of memory, the rest over the memory budget or "
            f"predicted hopeless), {s['inaccurate']} inaccurate, {s['failed']} failed; "
            f"{s['unsupported']} unsupported kernel/problem pairs skipped",
        ]
        out += self.noise_lines()
        if self.workload:
            measured, recorded = self.workload_measured()
            hint = "" if measured == recorded else " (raise --budget-minutes to measure the rest; the run resumes)"
            out.append(f"workload: {measured} of {recorded} recorded buckets measured{hint}")
        out += [f"numerics gate: {line}" for line in self.fit.excluded]
        if self.fit.table_paths:
            out.append("table: " + ", ".join(str(p) for p in self.fit.table_paths))
        if self.fit.quality:
            out.append(f"held-out quality: {self.fit.quality}")
        if self.fit.note:
            out.append(f"note: {self.fit.note}")
        out.append(f"results: {self.results_path}")
        out.append(f"storage: {self.storage}  (calibration {self.calibration_id})")
        return out


def calibrate(config: CalibrationConfig, *, out: str | os.PathLike | None = None, show_progress: bool = True,
              kernels: list[Kernel] | None = None, fit: bool = True) -> CalibrationSummary:
    """Run a calibration to its end. `out`: also write the table here; `kernels`: override the
    kernel set (one device only); `fit` False stops after measuring."""
    started = time.time()
    identity = DeviceIdentity.detect(config.devices[0])
    calibration_id = config.calibration_id(identity)
    deadline = started + config.effective_budget_s
    store = ResultsStore(config.results or default_results(calibration_id))
    journal = default_storage(calibration_id)
    summary = CalibrationSummary(calibration_id, identity, config.devices, store.path,
                                 describe_storage(config.storage, default_journal=journal))
    summary.resumed_points = sum(1 for r in store.read() if r.get("run") == calibration_id)
    if config.workload is not None:  # a bad file fails here, before any worker starts
        summary.workload = for_device(read_workload(config.workload), identity.device_type)
    progress = Progress(enabled=show_progress)
    try:
        if len(config.devices) == 1:
            worker = Worker(
                config, device=config.devices[0], calibration_id=calibration_id, deadline=deadline,
                kernels=kernels, on_record=progress.record, on_plan=progress.plan, on_problem=progress.problem,
            )  # sets the thread count the probe must run with
            worker.noise = summary.noise_start = probe_noise(worker.device)
            try:
                check_quiet(summary.noise_start, allow_busy=config.allow_busy)
            except MachineBusy:
                if config.storage is None:
                    discard_if_empty(journal)  # the worker opened it; a refusal stores nothing
                raise
            summary.reports = [worker.run()]
        else:
            if kernels is not None:
                raise ValueError("a kernel override works with one device only (workers build their own kernels)")
            summary.noise_start = probe_noise(config.devices[0])  # each worker probes its own device too
            check_quiet(summary.noise_start, allow_busy=config.allow_busy)
            storage = open_storage(config.storage, default_journal=journal)
            stages = (["workload"] if config.workload else []) + ["sweep"]
            poller = StoragePoller(progress, ResultsStore(store.path), storage, calibration_id, stages=stages)
            summary.reports = launch_workers(config, calibration_id=calibration_id, deadline=deadline, poll=poller)
    finally:
        progress.close()
    summary.measuring_s = time.time() - started
    summary.noise_end = probe_noise(config.devices[0])
    storage = open_storage(config.storage, default_journal=journal)
    summary.measurements = merge(store.measurements(run=calibration_id), storage_measurements(storage, calibration_id))
    if fit:
        busy_reason = too_busy_reason(summary.noise_start, summary.noise_end)
        summary.fit = fit_and_write(summary.measurements, identity, out=out, seed=config.seed, wall_s=summary.measuring_s,
                                    too_busy=busy_reason is not None, busy_reason=busy_reason or TOO_BUSY_REASON,
                                    timing_threads=summary.timing_threads(),
                                    timing_thread_count=summary.timing_thread_count())
    summary.wall_s = time.time() - started
    return summary
