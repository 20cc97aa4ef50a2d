"""Kernel sets, the accuracy policy for lossy conversions, and the triage that decides points
without timing them (unsupported, over the memory budget, hopeless)."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.calibration.candidates import CostEstimator, kernel_set, split_names, triage
from attn_dispatch.calibration.measure import measure
from attn_dispatch.calibration.timer import QUICK
from attn_dispatch.kernels.accuracy import AccuracyPolicy
from attn_dispatch.kernels.registry import portable_kernels, serving
from attn_dispatch.models.identity import DeviceIdentity, spec_for
from tests.calibration.helpers import problem

LOSSY = "convert[fp32->bf16]+chunked[q=512,kv=4096]"


def test_kernel_sets_and_names():
    assert split_names("math, chunked[q=128,kv=1024],small_q[splits=8]") == ["math", "chunked[q=128,kv=1024]", "small_q[splits=8]"]
    assert [k.name for k in kernel_set("portable", policy=AccuracyPolicy())] == [k.name for k in serving(portable_kernels())]
    assert not any(k.name.startswith("sdpa_") for k in kernel_set("portable", policy=AccuracyPolicy()))
    with pytest.raises(ValueError, match="unknown kernel"):
        kernel_set("math,warp_speed", policy=AccuracyPolicy())


def test_lossy_conversion_needs_the_policy_and_records_its_error():
    p = problem(dtype="float32")
    strict = kernel_set(LOSSY, policy=AccuracyPolicy())[0]
    allowed = kernel_set(LOSSY, policy=AccuracyPolicy.allowing("fp32->bf16"))[0]
    assert strict.reasons(p) and not allowed.reasons(p)
    point = measure(allowed, p, torch.device("cpu"), settings=QUICK)
    assert point.status == "ok" and 1e-4 < point.rel_error < 3e-2  # bf16 rounding, within bf16's tolerance


def test_triage_decides_unsupported_and_over_budget_points_without_timing():
    estimator = CostEstimator(spec_for(DeviceIdentity.detect("cpu"), probe=False))
    kernels = kernel_set("math,chunked[q=128,kv=1024],sdpa_cudnn", policy=AccuracyPolicy())
    big = problem(q_len=4096, kv_len=4096)
    plan = triage(big, kernels, estimator=estimator, memory_budget=big.q_bytes + big.kv_bytes + 64 * 2**20,
                  point_budget_s=1.0, device_key="k")
    decided = {m.kernel: m for m in plan.decided}
    assert decided["sdpa_cudnn"].status == "unsupported"
    assert decided["math"].status == "infeasible" and "memory budget" in decided["math"].reason
    assert [k.name for k in plan.to_time] == ["chunked[q=128,kv=1024]"]
    assert all(m.device_key == "k" for m in plan.decided)


class Compiling:
    """A kernel stand-in: supported, predicted `seconds`, compiling for `compile_s` on its next run."""

    def __init__(self, name: str, compile_s: float) -> None:
        self.name, self.compile_s = name, compile_s

    def reasons(self, problem):
        return []

    def workspace_bytes(self, problem):
        return 0

    def setup_seconds(self, problem):
        return self.compile_s


class Predicted:
    """An estimator answering fixed seconds per kernel name."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.table = seconds

    def seconds(self, problem, kernel):
        return self.table[kernel.name]


def test_triage_leaves_out_a_compile_that_costs_more_than_the_point_unless_predicted_near_the_fastest():
    kernels = [Compiling("fast", 0.0), Compiling("near", 5.0), Compiling("far", 5.0), Compiling("far_compiled", 0.0),
               Compiling("far_quick_compile", 0.5)]
    estimator = Predicted({"fast": 1e-4, "near": 1.5e-4, "far": 3e-4, "far_compiled": 3e-4, "far_quick_compile": 3e-4})
    plan = triage(problem(), kernels, estimator=estimator, memory_budget=None, point_budget_s=1.0, device_key="k")
    assert [k.name for k in plan.to_time] == ["fast", "near", "far_compiled", "far_quick_compile"]
    (skipped,) = plan.decided
    assert skipped.kernel == "far" and skipped.status == "infeasible" and skipped.extra["skipped"] == "compile"
    assert "compiles" in skipped.reason and "3x the fastest" in skipped.reason
