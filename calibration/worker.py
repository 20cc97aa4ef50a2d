"""Calibration workers, one per device (in-process for one device, else `launch_workers`), claim
problems of the agreed plan until it is done or the deadline passes, then wait for their peers' (taking
over a dead one's). Per
problem: triage, time the rest cheapest first, tune the competitive families with optuna;
each point is recorded at once, and what a resumed run already holds is skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from attn_dispatch.calibration.candidates import CostEstimator, kernel_set, triage
from attn_dispatch.calibration.claims import ClaimBoard, Owner
from attn_dispatch.calibration.config import (
    CalibrationConfig,
    default_results,
    default_storage,
)
from attn_dispatch.calibration.inputs import InputCache
from attn_dispatch.calibration.measure import empty_cache, measure
from attn_dispatch.calibration.noise import Noise, probe_noise, widened
from attn_dispatch.calibration.plan import (
    agree_on,
    build_sweep,
    for_device,
    profile_for,
    read_workload,
)
from attn_dispatch.calibration.results import (
    Recorder,
    ResultsStore,
    open_storage,
    problem_id,
    study_name,
)
from attn_dispatch.calibration.tuning import PRUNE_RATIO, TUNABLE_FAMILIES, TUNE_WITHIN, tune_family
from attn_dispatch.kernels.accuracy import AccuracyPolicy
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.identity import DeviceIdentity, spec_for
from attn_dispatch.models.measurement import Measurement

# A kernel whose first (untimed) call takes this many times the problem's best time so far is a
# clear loser: one timed call records it.
LOSER_FACTOR = PRUNE_RATIO
# A CPU calibration may use this share of system RAM: beyond it Linux's OOM killer, not an
# exception, answers an allocation.
CPU_MEMORY_SHARE = 0.5
WAIT_POLL_S = 1.0  # how often a worker waiting for its peers looks again
POLL_S = 0.5  # how often the parent polls its worker processes
TERMINATE_GRACE_S = 10.0  # seconds a worker process gets to release its claim after SIGTERM


class DeadlineReached(Exception):
    """The calibration's time budget ran out in the middle of a problem."""


@dataclass
class WorkerReport:
    worker: str
    device: str
    problems: int = 0
    timed: int = 0
    stopped: str = "done"  # "done" | "deadline" | "interrupted"
    seconds: float = 0.0
    noise_spread: float | None = None  # the reference point's spread when the worker started
    noise_cpu_share: float | None = None  # and this process's CPU share during it
    widened: bool = False  # the machine was busy: more samples per point
    threads: int = 0  # torch's intra-op threads while timing on a CPU device (0: a GPU device)

    def to_dict(self) -> dict:
        return asdict(self)


def effective_memory_budget(config: CalibrationConfig, identity: DeviceIdentity) -> int | None:
    """Bytes a point may use: the user's budget, else the card's memory, else half the RAM."""
    if config.memory_budget is not None:
        return config.memory_budget
    if identity.device_type == "cpu":
        return int(CPU_MEMORY_SHARE * identity.memory_bytes) if identity.memory_bytes else None
    return identity.memory_bytes or None


def prepare_device(device: torch.device, config: CalibrationConfig, identity: DeviceIdentity) -> None:
    """Threads, current device, and the memory cap that emulates a smaller card."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if config.memory_budget is not None and identity.memory_bytes:
            torch.cuda.set_per_process_memory_fraction(min(1.0, config.memory_budget / identity.memory_bytes), device)


def _best(known: dict[str, Measurement]) -> float:
    return min((m.median_s for m in known.values() if m.ok), default=math.inf)


class Worker:
    """See module docstring. `kernels` overrides the config's kernel set (tests); `on_record` gets
    each record written, `on_plan` the problems a plan added, `on_problem` each finished problem."""

    def __init__(self, config: CalibrationConfig, *, device: str, calibration_id: str, deadline: float,
                 worker: str = "worker0", kernels: list[Kernel] | None = None,
                 on_record: Callable[[dict], None] | None = None, on_plan: Callable[[int], None] = lambda added: None,
                 on_problem: Callable[[], None] = lambda: None, noise: Noise | None = None) -> None:
        self.config = config
        self.noise = noise
        self.on_plan, self.on_problem = on_plan, on_problem
        self.device = torch.device(device)
        self.identity = DeviceIdentity.detect(self.device)
        self.calibration_id = calibration_id
        if self.identity.key not in calibration_id:
            raise ValueError(
                f"device {device} is {self.identity.key}, but calibration {calibration_id} is for another "
                "card or software stack: calibrate different cards separately"
            )
        self.deadline = deadline
        self.name = worker
        prepare_device(self.device, config, self.identity)
        self.policy = AccuracyPolicy.allowing(*config.allow_lossy) if config.allow_lossy else AccuracyPolicy()
        self.kernels = kernels if kernels is not None else kernel_set(config.kernels, policy=self.policy)
        self.memory_budget = effective_memory_budget(config, self.identity)
        spec = spec_for(self.identity)
        self.estimator = CostEstimator(replace(spec, memory_bytes=self.memory_budget) if self.memory_budget else spec)
        self.settings = config.timer
        self.storage = open_storage(config.storage, default_journal=default_storage(calibration_id))
        store = ResultsStore(config.results or default_results(calibration_id))
        self.recorder = Recorder(store, self.storage, calibration_id, worker, on_record=on_record)
        self.board = ClaimBoard(self.storage, calibration_id, Owner.current(worker))
        self.report = WorkerReport(worker, str(self.device))
        self._current: str | None = None

    def sweep_plan(self) -> list[Problem]:
        problems = build_sweep(
            profile_for(self.device.type, quick=self.config.quick), kernels=self.kernels, estimator=self.estimator,
            device_type=self.device.type, memory_bytes=self.memory_budget or self.identity.memory_bytes,
            point_budget_s=self.config.timer.budget_s, seed=self.config.seed, count=self.config.problems,
        )
        return agree_on(self.storage, self.calibration_id, "sweep", problems)

    def workload_plan(self) -> list[Problem]:
        """The recorded workload's problems, as recorded; [] without one."""
        if self.config.workload is None:
            return []
        problems = for_device(read_workload(self.config.workload), self.device.type)
        return agree_on(self.storage, self.calibration_id, "workload", problems)

    def run(self) -> WorkerReport:
        """The recorded workload first, then the sweep, then waits for its peers' problems (taking over a dead
        peer's); stops cleanly at the deadline."""
        started = time.time()
        noise = self.noise if self.noise is not None else probe_noise(self.device)
        self.report.noise_spread, self.report.noise_cpu_share = noise.spread, noise.cpu_share
        self.report.threads = torch.get_num_threads() if self.device.type == "cpu" else 0
        if noise.busy:  # more samples per point; the summary says so
            self.settings = widened(self.settings)
            self.report.widened = True
        try:
            done = self.workload_plan()
            if done:
                self._process(done, phase="workload")
            sweep = self.sweep_plan()
            self._process(sweep, phase="sweep")
            self._wait_for(done + sweep)
        except DeadlineReached:
            self.report.stopped = "deadline"
        except (KeyboardInterrupt, SystemExit):
            self.report.stopped = "interrupted"
            raise
        finally:
            self.report.seconds = time.time() - started
        return self.report

    def _process(self, problems: list[Problem], *, phase: str) -> None:
        self.on_plan(len(problems))
        for problem in problems:
            if time.time() > self.deadline:
                raise DeadlineReached
            self._try(problem, phase)

    def _try(self, problem: Problem, phase: str) -> None:
        """Measure `problem` unless another worker holds or finished it."""
        key = problem_id(problem)
        if not self.board.try_claim(key):
            return
        self._current = key
        try:
            self.report.timed += self.run_problem(problem, phase)
        except BaseException:
            self.board.release(key)  # finished points stay recorded; a later claimer does the rest
            raise
        finally:
            self._current = None
        self.board.finish(key)
        self.report.problems += 1
        self.on_problem()

    def _wait_for(self, problems: list[Problem]) -> bool:
        """Until every problem is done (taking over stale claims); False at the deadline."""
        while time.time() <= self.deadline:
            pending = [p for p in problems if not self.board.state(problem_id(p)).done]
            if not pending:
                return True
            for problem in pending:  # a dead or released peer's problem
                self._try(problem, "takeover")
            time.sleep(WAIT_POLL_S)
        return False

    def run_problem(self, problem: Problem, phase: str) -> int:
        """Measure `problem`; returns the number of points timed now. Raises `DeadlineReached`
        when the deadline passes between two points (the points measured so far are recorded)."""
        recorder = self.recorder
        recorder.sync_problem(problem)
        known = recorder.known(problem)
        plan = triage(problem, self.kernels, estimator=self.estimator, memory_budget=self.memory_budget,
                      point_budget_s=self.settings.budget_s, device_key=self.identity.key)
        recorder.record_decided([m for m in plan.decided if m.kernel not in known])
        known.update({m.kernel: m for m in plan.decided})
        cache = InputCache()
        timed = 0

        def timed_measure(kernel: Kernel, should_stop=None, extra: dict | None = None) -> Measurement:
            nonlocal timed
            if time.time() > self.deadline:
                raise DeadlineReached
            extra = {"phase": phase, "predicted_s": plan.predicted.get(kernel.name), **(extra or {})}
            best = _best(known)
            point = measure(
                kernel, problem, self.device, settings=self.settings, memory_budget=self.memory_budget,
                device_key=self.identity.key, seed=self.config.seed, cache=cache, should_stop=should_stop,
                extra=extra, single_shot_above_s=LOSER_FACTOR * best if math.isfinite(best) else None,
            )
            if point.status == "infeasible":
                empty_cache(self.device)
            recorder.record(point)
            if self._current is not None:
                self.board.heartbeat(self._current)
            timed += 1
            return point

        try:
            for kernel in plan.to_time:
                if kernel.name not in known:
                    known[kernel.name] = timed_measure(kernel)
            self._tune(problem, known, timed_measure)
        finally:
            cache.clear()
            recorder.flush(problem)
        return timed

    def _tune(self, problem: Problem, known: dict[str, Measurement], timed_measure) -> None:
        """optuna search for each competitive tunable family of the kernel set."""
        best = _best(known)
        trials = self.config.effective_tune_trials
        if not math.isfinite(best) or trials < 1:
            return
        families = {k.family for k in self.kernels}
        for family in TUNABLE_FAMILIES:
            if family not in families:
                continue
            family_best = min((m.median_s for name, m in known.items() if m.ok and name.startswith(family + "[")),
                              default=math.inf)
            if family_best > TUNE_WITHIN * best:
                continue
            pid = problem_id(problem)
            tune_family(
                problem, family, storage=self.storage, trials=trials, known=known, best_s=best,
                study_name=study_name(self.calibration_id, "tune", family, pid),
                seed=self.config.seed + zlib.crc32(pid.encode()),
                measure=lambda kernel, hook: timed_measure(kernel, hook, {"phase": "tune"}),
            )


def worker_command(config: CalibrationConfig, *, device: str, calibration_id: str, deadline: float, name: str) -> list[str]:
    one = replace(config, devices=(device,))
    return [
        sys.executable, "-m", "attn_dispatch.calibration.worker", "--config", json.dumps(one.to_dict()), "--device", device,
        "--calibration-id", calibration_id, "--deadline", repr(deadline), "--worker", name,
    ]


def _report(process: subprocess.Popen, name: str, device: str) -> WorkerReport:
    """A worker process's report: the last line of its standard output."""
    output = process.stdout.read() if process.stdout is not None else ""
    for line in reversed(output.strip().splitlines()):
        try:
            return WorkerReport(**json.loads(line))
        except (json.JSONDecodeError, TypeError):
            continue
    return WorkerReport(name, device, stopped=f"exited with status {process.returncode}")


def launch_workers(config: CalibrationConfig, *, calibration_id: str, deadline: float,
                   poll: Callable[[], None] = lambda: None) -> list[WorkerReport]:
    """Run one worker process per device of `config` until all exit; `poll` is called while waiting."""
    names = [f"worker{i}-{device}" for i, device in enumerate(config.devices)]
    processes = [
        subprocess.Popen(worker_command(config, device=device, calibration_id=calibration_id, deadline=deadline,
                                        name=name), stdout=subprocess.PIPE, text=True)
        for name, device in zip(names, config.devices, strict=True)
    ]
    try:
        while any(p.poll() is None for p in processes):
            poll()
            time.sleep(POLL_S)
        poll()
    except BaseException:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
        raise
    return [_report(p, n, d) for p, n, d in zip(processes, names, config.devices, strict=True)]


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """``python -m attn_dispatch.calibration.worker --config JSON --device D --calibration-id ID --deadline T``."""
    parser = argparse.ArgumentParser(prog="python -m attn_dispatch.calibration.worker")
    parser.add_argument("--config", required=True, help="CalibrationConfig as JSON")
    parser.add_argument("--device", required=True)
    parser.add_argument("--calibration-id", required=True)
    parser.add_argument("--deadline", type=float, required=True, help="epoch seconds")
    parser.add_argument("--worker", default="worker0")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    config = replace(CalibrationConfig.from_dict(json.loads(args.config)), devices=(args.device,))
    worker = Worker(config, device=args.device, calibration_id=args.calibration_id, deadline=args.deadline, worker=args.worker)
    print(json.dumps(worker.run().to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
