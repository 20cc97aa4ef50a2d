"""A recorded workload: the dispatcher writes one line per new bucket (deduplicated across
threads and runs), the calibration reads it back and measures every recorded problem first."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import attn_dispatch as ad
from attn_dispatch.calibration.plan import WORKLOAD_FORMAT, for_device, read_workload
from attn_dispatch.calibration.session import calibrate
from attn_dispatch.dispatcher.recording import FORMAT, WorkloadRecorder, record_problem, workload_bucket
from attn_dispatch.kernels.chunked import ChunkedKernel
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.models.environment import RECORD
from attn_dispatch.models.table_io import load_table
from tests.calibration.helpers import problem, small_config


def _call(q_len: int, kv_len: int, heads: int = 2) -> None:
    ad.attention(torch.randn(1, heads, q_len, 16), torch.randn(1, heads, kv_len, 16), torch.randn(1, heads, kv_len, 16))


def test_record_context_writes_each_bucket_once(tmp_path):
    path = tmp_path / "workload.jsonl"
    ad.reset()
    with ad.record(path):
        _call(10, 10)
        _call(12, 12)  # same length buckets (9..16) as 10 x 10: not a new line
        _call(100, 100)
        _call(10, 10, heads=4)  # heads are exact in a bucket: a new line
    _call(1000, 1000)  # outside the block: not recorded
    lines = [json.loads(text) for text in path.read_text().splitlines()]
    assert [(e["problem"]["q_len"], e["problem"]["q_heads"]) for e in lines] == [(10, 2), (100, 2), (10, 4)]
    assert [p.q_len for p in read_workload(path)] == [10, 100, 10]


def test_environment_variable_records_and_a_second_run_adds_only_new_buckets(tmp_path, monkeypatch):
    path = tmp_path / "env.jsonl"
    monkeypatch.setenv(RECORD.name, str(path))
    record_problem(problem(q_len=8, kv_len=64))
    again = WorkloadRecorder(path)  # a new process: reads the buckets already in the file
    assert not again.add(problem(q_len=7, kv_len=60))
    assert again.add(problem(q_len=8, kv_len=65))
    assert again.buckets == 2 and len(path.read_text().splitlines()) == 2


def test_threads_never_duplicate_or_interleave_lines(tmp_path):
    recorder = WorkloadRecorder(tmp_path / "threads.jsonl")
    shapes = [problem(q_len=2 ** (i % 6), kv_len=64 * (1 + i % 3)) for i in range(60)]
    workers = [threading.Thread(target=lambda chunk=shapes[i::6]: [recorder.add(p) for p in chunk]) for i in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    lines = (tmp_path / "threads.jsonl").read_text().splitlines()
    buckets = [json.dumps(json.loads(text)["bucket"]) for text in lines]
    expected = {json.dumps(workload_bucket(p)) for p in shapes}
    assert len(expected) > 1 and len(buckets) == len(set(buckets)) and set(buckets) == expected


def test_reader_and_writer_agree_on_the_format():
    assert FORMAT == WORKLOAD_FORMAT


def test_a_bad_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    WorkloadRecorder(path).add(problem())
    with open(path, "a") as handle:
        handle.write('{"format": 99, "bucket": []}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_workload(path)


def test_calibrate_measures_every_recorded_bucket_first_and_stores_each_as_a_measured_entry(tmp_path):
    path = tmp_path / "workload.jsonl"
    recorder = WorkloadRecorder(path)
    recorded = [problem(q_len=3, kv_len=700, device_type="cuda"), problem(q_len=40, kv_len=40, q_heads=2, kv_heads=2)]
    for p in recorded:
        recorder.add(p)
    config = small_config(tmp_path, problems=2, workload=str(path))
    summary = calibrate(config, show_progress=False, kernels=[MathKernel(), ChunkedKernel(q=128, kv=1024)])
    assert summary.workload_measured() == (2, 2)
    workload_phase = [m for m in summary.measurements if m.extra.get("phase") == "workload"]
    assert {m.problem for m in workload_phase} == set(for_device(recorded, "cpu"))
    assert min(m.timestamp for m in workload_phase) < min(
        m.timestamp for m in summary.measurements if m.extra.get("phase") == "sweep")
    assert any(line.startswith("workload: 2 of 2 recorded buckets measured") for line in summary.lines())
    # The target: every recorded bucket has an exact measured entry in the stored table,
    # which the dispatcher consults before its model (`ThresholdTable.measured_entry`).
    stored = load_table(summary.fit.table_paths[0])
    for p in for_device(recorded, "cpu"):
        entry = stored.measured_entry(p)
        assert entry is not None, f"no measured entry for the recorded bucket of {p}"
        assert {t.kernel for t in entry.times} == {"math", "chunked[q=128,kv=1024]"}
        assert stored.rank(p, [MathKernel(), ChunkedKernel(q=128, kv=1024)])[0][0] == entry.winner
