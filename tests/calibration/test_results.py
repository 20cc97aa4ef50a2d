"""The results store: one JSON line per point, fsync'd under a lock, a truncated last line
tolerated, concurrent writers never interleaved."""

from __future__ import annotations

import json
import multiprocessing

from attn_dispatch.calibration.results import ResultsStore, measurement_record, unit_key
from attn_dispatch.models.measurement import Measurement
from tests.calibration.helpers import problem

WRITERS, PER_WRITER = 4, 40


def _point(q_len: int, kernel: str = "math", status: str = "ok") -> Measurement:
    median = 1e-3 if status == "ok" else float("inf")
    return Measurement(problem=problem(q_len=q_len), kernel=kernel, median_s=median, reps=3, status=status, extra={"phase": "sweep"})


def _append(store: ResultsStore, points: list[Measurement], *, run: str, worker: str) -> None:
    store.append(measurement_record(m, run=run, worker=worker) for m in points)


def test_round_trip_and_run_filter(tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl")
    _append(store, [_point(1), _point(2, status="infeasible")], run="a", worker="w")
    _append(store, [_point(3)], run="b", worker="w")
    assert [m.problem.q_len for m in store.measurements(run="a")] == [1, 2]
    assert store.measurements(run="a")[1].median_s == float("inf")
    assert [r["unit"] for r in store.read() if r["run"] == "b"] == [unit_key(problem(q_len=3), "math")]
    record = store.read()[0]
    assert record["run"] == "a" and record["worker"] == "w" and record["extra"] == {"phase": "sweep"}


def test_truncated_last_line_is_skipped_and_isolated(tmp_path):
    path = tmp_path / "r.jsonl"
    store = ResultsStore(path)
    _append(store, [_point(1)], run="a", worker="w")
    with open(path, "ab") as handle:  # a writer killed mid-line
        handle.write(b'{"problem": {"batch": 1, "q_he')
    assert len(store.read()) == 1
    _append(store, [_point(2)], run="a", worker="w")
    assert [m.problem.q_len for m in store.measurements(run="a")] == [1, 2]
    assert store.skipped_lines == 1


def test_read_new_only_returns_complete_new_lines(tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl")
    tail = ResultsStore(tmp_path / "r.jsonl")
    _append(store, [_point(1)], run="a", worker="w")
    assert len(tail.read_new()) == 1 and tail.read_new() == []
    _append(store, [_point(2), _point(3)], run="a", worker="w")
    assert len(tail.read_new()) == 2


def _writer(path: str, index: int) -> None:
    store = ResultsStore(path)
    for i in range(PER_WRITER):
        _append(store, [_point(1000 * index + i + 1)], run="a", worker=f"w{index}")


def test_concurrent_writers(tmp_path):
    path = str(tmp_path / "r.jsonl")
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_writer, args=(path, i)) for i in range(WRITERS)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    lines = open(path, "rb").read().splitlines()
    assert len(lines) == WRITERS * PER_WRITER
    assert len({json.loads(line)["unit"] for line in lines}) == WRITERS * PER_WRITER
