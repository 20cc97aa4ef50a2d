"""One worker process per device (``--devices cuda:0,cuda:1``), all sharing the calibration's
storage and results store. The parent only watches: it polls for progress and collects each
worker's report (the last line of its standard output).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace

from attn_dispatch.calibration.config import CalibrationConfig
from attn_dispatch.calibration.worker import WorkerReport

# How often the parent polls its workers and the progress sources.
POLL_S = 0.5
# Seconds a worker gets to release its claim after SIGTERM before it is killed.
TERMINATE_GRACE_S = 10.0


def worker_command(config: CalibrationConfig, *, device: str, calibration_id: str, deadline: float, name: str) -> list[str]:
    one = replace(config, devices=(device,))
    return [
        sys.executable, "-m", "attn_dispatch.calibration.worker", "--config", json.dumps(one.to_dict()), "--device", device,
        "--calibration-id", calibration_id, "--deadline", repr(deadline), "--worker", name,
    ]


def _report(process: subprocess.Popen, name: str, device: str) -> WorkerReport:
    output = process.stdout.read() if process.stdout is not None else ""
    for line in reversed(output.strip().splitlines()):
        try:
            return WorkerReport(**json.loads(line))
        except (json.JSONDecodeError, TypeError):
            continue
    return WorkerReport(name, device, stopped=f"exited with status {process.returncode}")


def launch_workers(
    config: CalibrationConfig,
    *,
    calibration_id: str,
    deadline: float,
    poll: Callable[[], None] = lambda: None,
) -> list[WorkerReport]:
    """Run one worker per device of `config` until all exit; `poll` is called while waiting."""
    names = [f"worker{i}-{device}" for i, device in enumerate(config.devices)]
    processes = [
        subprocess.Popen(
            worker_command(config, device=device, calibration_id=calibration_id, deadline=deadline, name=name),
            stdout=subprocess.PIPE, text=True,
        )
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
