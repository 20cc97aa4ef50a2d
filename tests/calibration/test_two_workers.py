"""Two worker processes on one journal and one results file: every problem measured by exactly
one of them, no point twice, the whole plan done."""

from __future__ import annotations

import os
import subprocess
import time
from collections import defaultdict

from attn_dispatch.calibration.claims import ClaimBoard, Owner
from attn_dispatch.calibration.plan import agreed
from attn_dispatch.calibration.results import ResultsStore, open_storage, problem_id
from attn_dispatch.calibration.worker import worker_command
from attn_dispatch.models.identity import DeviceIdentity
from tests.calibration.helpers import small_config

WORKERS = 2
TIMEOUT_S = 120


def test_two_workers_share_one_journal(tmp_path):
    config = small_config(tmp_path, problems=6)
    calibration_id = config.calibration_id(DeviceIdentity.detect("cpu"))
    deadline = time.time() + TIMEOUT_S
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    processes = [
        subprocess.Popen(worker_command(config, device="cpu", calibration_id=calibration_id, deadline=deadline, name=f"w{i}"),
                         stdout=subprocess.DEVNULL, env=env)
        for i in range(WORKERS)
    ]
    for process in processes:
        assert process.wait(TIMEOUT_S) == 0

    records = ResultsStore(config.results).read()
    units = [r["unit"] for r in records]
    assert len(units) == len(set(units)), "a point was measured twice"
    workers_of = defaultdict(set)
    for record in records:
        workers_of[record["unit"].split("|")[0]].add(record["worker"])
    assert all(len(w) == 1 for w in workers_of.values()), "a problem was split between workers"
    storage = open_storage(config.storage, default_journal=tmp_path / "unused")
    plan = agreed(storage, calibration_id, "sweep")
    assert set(workers_of) == {problem_id(p) for p in plan}
    board = ClaimBoard(storage, calibration_id, Owner.current("check"))
    assert all(board.state(problem_id(p)).done for p in plan)
