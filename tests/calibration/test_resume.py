"""Resume after a kill mid-sweep: a worker process is SIGKILLed after some points; a second run
finishes the calibration with every finished point kept and no point measured twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter

from attn_dispatch.calibration.claims import ClaimBoard, Owner
from attn_dispatch.calibration.plan import agreed
from attn_dispatch.calibration.results import ResultsStore, open_storage, problem_id
from attn_dispatch.calibration.session import calibrate
from attn_dispatch.calibration.worker import worker_command
from attn_dispatch.models.identity import DeviceIdentity
from tests.calibration.helpers import small_config

KILL_AFTER_RECORDS = 8
START_TIMEOUT_S = 180.0  # a fresh worker process imports torch and probes the noise first; slow on a loaded machine
POLL_S = 0.01


def test_resume_after_kill(tmp_path):
    config = small_config(tmp_path, problems=6, tune_trials=3)
    calibration_id = config.calibration_id(DeviceIdentity.detect("cpu"))
    command = worker_command(config, device="cpu", calibration_id=calibration_id, deadline=time.time() + 300, name="doomed")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.getcwd()})
    store = ResultsStore(config.results)
    started = time.time()
    while len(store.read()) < KILL_AFTER_RECORDS and process.poll() is None and time.time() - started < START_TIMEOUT_S:
        time.sleep(POLL_S)
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = {r["unit"]: r for r in store.read()}
    assert KILL_AFTER_RECORDS <= len(before), "the worker should have measured some points before the kill"

    summary = calibrate(config, show_progress=False, fit=False)

    records = store.read()
    units = Counter(r["unit"] for r in records)
    assert max(units.values()) == 1, "a point was measured twice"
    assert set(before) <= set(units), "a finished point was lost"
    assert summary.resumed_points == len(before)
    assert summary.timed_now == len(records) - len(before) > 0
    storage = open_storage(config.storage, default_journal=tmp_path / "unused")
    plan = agreed(storage, calibration_id, "sweep")
    board = ClaimBoard(storage, calibration_id, Owner.current("check"))
    assert plan and all(board.state(problem_id(p)).done for p in plan)
    measured = {problem_id(m.problem) for m in summary.measurements}
    assert measured == {problem_id(p) for p in plan}
    assert json.dumps(records)  # everything stored is plain JSON
