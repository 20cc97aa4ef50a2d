"""A calibration in-process on CPU with deliberately broken kernels: out-of-memory and
unsupported kernels recorded as such, a wrong kernel excluded by the numerics gate, nothing raised;
tuning runs; a second run resumes without measuring anything again."""

from __future__ import annotations

from collections import Counter

from attn_dispatch.calibration.results import ResultsStore
from attn_dispatch.calibration.session import calibrate
from attn_dispatch.kernels.chunked import ChunkedKernel
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.kernels.small_q import SmallQKernel
from tests.calibration.helpers import (
    BrokenKernel,
    OutOfMemoryKernel,
    RefusingKernel,
    WrongKernel,
    small_config,
)


def test_broken_kernels_are_recorded_and_the_wrong_one_excluded(tmp_path):
    kernels = [MathKernel(), ChunkedKernel(q=128, kv=1024), WrongKernel(), OutOfMemoryKernel(), RefusingKernel(), BrokenKernel()]
    config = small_config(tmp_path, problems=4)
    summary = calibrate(config, show_progress=False, kernels=kernels, out=tmp_path / "table.json")
    by_kernel = {}
    for m in summary.measurements:
        by_kernel.setdefault(m.kernel, Counter())[m.status] += 1
    problems = len({m.problem for m in summary.measurements})
    assert problems == 4
    assert by_kernel["math"] == Counter(ok=problems)
    assert by_kernel["oom_math"] == Counter(infeasible=problems)
    assert by_kernel["refusing"] == Counter(unsupported=problems)
    assert by_kernel["broken"] == Counter(failed=problems)
    assert by_kernel["wrong_math"] == Counter(inaccurate=problems)
    assert any("wrong_math unusable for" in line for line in summary.fit.excluded)
    assert (tmp_path / "table.json").exists() and len(summary.fit.table_paths) == 2
    assert "wrong_math" not in (tmp_path / "table.json").read_text()
    assert all(m.device_key == summary.identity.key for m in summary.measurements)
    assert any("out of memory" in line for line in summary.lines())


def test_tuning_and_a_resume_that_measures_nothing(tmp_path):
    kernels = [MathKernel(), ChunkedKernel(q=128, kv=1024), SmallQKernel(splits=8)]
    config = small_config(tmp_path, problems=8, tune_trials=4)
    first = calibrate(config, show_progress=False, kernels=kernels, fit=False)
    phases = Counter(m.extra.get("phase") for m in first.measurements)
    assert phases["sweep"] > 0 and phases["tune"] > 0
    assert first.timed_now == sum(1 for m in first.measurements if m.status != "unsupported")
    again = calibrate(config, show_progress=False, kernels=kernels, fit=False)
    assert again.timed_now == 0 and again.resumed_points == len(ResultsStore(config.results).read())
    units = [r["unit"] for r in ResultsStore(config.results).read()]
    assert len(units) == len(set(units))
