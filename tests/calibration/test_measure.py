"""One point: OOM and unsupported kernels are recorded (never raised), the numerics gate marks a
wrong kernel, the memory budget decides without running, inputs and references are reused."""

from __future__ import annotations

import math

import pytest
import torch

from attn_dispatch.calibration.inputs import InputCache, make_inputs
from attn_dispatch.calibration.measure import is_out_of_memory, measure
from attn_dispatch.calibration.timer import QUICK
from attn_dispatch.kernels.chunked import ChunkedKernel
from attn_dispatch.kernels.math_kernel import MathKernel
from tests.calibration.helpers import (
    BrokenKernel,
    CpuOutOfMemoryKernel,
    OutOfMemoryKernel,
    RefusingKernel,
    WrongKernel,
    problem,
)

CPU = torch.device("cpu")


def test_ok_point_has_timing_error_and_peak():
    point = measure(MathKernel(), problem(), CPU, settings=QUICK, device_key="dev")
    assert point.status == "ok" and point.ok and point.device_key == "dev"
    assert math.isfinite(point.median_s) and point.median_s > 0 and point.reps >= 1
    assert point.rel_error is not None and point.rel_error < 1e-5
    assert point.peak_bytes is not None and point.peak_bytes > 0
    assert point.extra["workspace_bytes"] >= problem().out_bytes


@pytest.mark.parametrize("kernel", [OutOfMemoryKernel(), CpuOutOfMemoryKernel()])
def test_out_of_memory_is_infeasible(kernel):
    point = measure(kernel, problem(), CPU, settings=QUICK)
    assert point.status == "infeasible" and point.median_s == math.inf
    assert point.reason.startswith("out of memory")


def test_unsupported_is_recorded_without_running():
    point = measure(RefusingKernel(), problem(), CPU, settings=QUICK)
    assert point.status == "unsupported" and "refuses everything" in point.reason


def test_other_errors_are_failed_points():
    point = measure(BrokenKernel(), problem(), CPU, settings=QUICK)
    assert point.status == "failed" and point.reason == "ValueError: backend bug"


def test_numerics_gate_marks_a_slightly_wrong_kernel():
    point = measure(WrongKernel(), problem(), CPU, settings=QUICK)
    assert point.status == "inaccurate" and not point.ok
    assert point.rel_error == pytest.approx(0.1, rel=0.05)
    assert "exceeds the float32 tolerance" in point.reason


def test_gate_sees_the_tail_rows():
    """A kernel wrong only in its last query block is caught (the gate checks head and tail)."""

    class WrongTail(MathKernel):
        family = "wrong_tail"

        def run(self, *args, **kwargs):
            out = super().run(*args, **kwargs)
            out[:, :, -1] += 1.0
            return out

    point = measure(WrongTail(), problem(q_len=200, kv_len=64, causal=True, kv_heads=4), CPU, settings=QUICK)
    assert point.status == "inaccurate"


def test_memory_budget_decides_without_running():
    big = problem(q_len=2048, kv_len=2048)
    point = measure(RefusingKernel.__mro__[1](), big, CPU, settings=QUICK, memory_budget=1_000_000)
    assert point.status == "infeasible" and "exceed the memory budget" in point.reason


def test_masks_gqa_and_strided_inputs_pass_the_gate():
    masked = problem(q_len=70, kv_len=90, mask_kind="float", mask_shape=(1, 1, 70, 90), strided=True, batch=2)
    for kernel in (MathKernel(), ChunkedKernel(q=32, kv=32)):
        point = measure(kernel, masked, CPU, settings=QUICK)
        assert point.status == "ok", point.reason


def test_input_cache_reuses_inputs_and_is_never_all_zeros():
    cache = InputCache()
    first = cache.input_sets(problem(), CPU, 0, 2)
    again = cache.input_sets(problem(), CPU, 0, 1)
    assert again[0].query is first[0].query
    assert not torch.equal(first[0].query, first[1].query)
    assert first[0].query.abs().sum() > 0
    cache.input_sets(problem(q_len=9), CPU, 0, 1)  # another problem frees the first
    assert cache.input_sets(problem(), CPU, 0, 1)[0].query is not first[0].query
    torch.testing.assert_close(make_inputs(problem(), CPU, 0).query, first[0].query)


def test_oom_detection():
    assert is_out_of_memory(torch.OutOfMemoryError("x"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_a_clear_loser_is_timed_once():
    loser = measure(MathKernel(), problem(), CPU, settings=QUICK, single_shot_above_s=1e-9)
    assert loser.status == "ok" and loser.reps == 1 and loser.extra["stopped"] == "early"
    normal = measure(MathKernel(), problem(), CPU, settings=QUICK, single_shot_above_s=10.0)
    assert normal.reps >= QUICK.min_reps or normal.extra["stopped"] == "budget"
