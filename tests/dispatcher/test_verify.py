"""A table's pick is checked against PyTorch's own choice on a GPU bucket's first call
(`dispatcher.verify`): the default stays unless the measurement says otherwise. The stopwatch is
stood in for (timings never decide a test)."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.dispatcher import Dispatcher, planner, verify
from attn_dispatch.dispatcher.tuning import Tuned
from attn_dispatch.kernels import MathKernel, Problem, SdpaDefaultKernel
from tests.dispatcher.helpers import FixedRanker, assert_matches_reference, qkv, use_ranking

CUDA = torch.device("cuda")  # a device object only: nothing runs on it


def _options(monkeypatch, order):
    use_ranking(monkeypatch, FixedRanker(order))
    ours = Dispatcher(kernels=[MathKernel(), SdpaDefaultKernel()])
    return ours, ours._planner(torch.device("cpu"))


def test_verification_is_wanted_only_where_a_table_displaced_the_default_on_a_gpu(monkeypatch):
    _, cpu = _options(monkeypatch, ["math", "sdpa_default"])
    options = cpu.decide(qkv_problem(), None, budget=None, tune=False, on_failure=lambda *a: None).options
    assert [o.kernel.name for o in options] == ["math", "sdpa_default"]
    assert verify.verification_wanted(options, CUDA, measured_here=False)
    assert not verify.verification_wanted(options, torch.device("cpu"), measured_here=False)
    assert not verify.verification_wanted(options, CUDA, measured_here=True)  # a measured entry decides
    assert not verify.verification_wanted(options[::-1], CUDA, measured_here=False)  # the default is first
    assert not verify.verification_wanted(options[:1], CUDA, measured_here=False)  # no default to check against
    monkeypatch.setenv(verify.VERIFY_ENV, "0")
    assert not verify.verification_wanted(options, CUDA, measured_here=False)


def qkv_problem():
    return Problem(1, 4, 4, 1, 64, 16, 16, "float32")


@pytest.mark.parametrize(("winner", "first"), [("sdpa_default", "sdpa_default"), ("math", "math")])
def test_the_bucket_follows_the_measurement(monkeypatch, winner, first):
    ours, _ = _options(monkeypatch, ["math", "sdpa_default"])
    timed = []

    def stopwatch(options, inputs, problem, device, on_failure=None):
        timed.append([o.kernel.name for o in options])
        return Tuned(winner, (("math", 2e-3 if winner == "sdpa_default" else 1e-3), ("sdpa_default", 1.5e-3)))

    monkeypatch.setattr(verify, "tune", stopwatch)
    monkeypatch.setattr(planner, "verification_wanted", lambda options, device, measured_here: True)
    call = qkv(q_len=1, kv_len=60)
    assert_matches_reference(ours.attention(**call), call)
    assert timed == [["math", "sdpa_default"]]  # once, the two of them
    decision = ours.explain(**call)
    assert decision.kernel == first
    assert any("checked against PyTorch's own choice" in note for note in decision.notes)
    ours.attention(**qkv(q_len=1, kv_len=63))  # another shape of the bucket (lengths 33-64): no second check
    assert len(timed) == 1
