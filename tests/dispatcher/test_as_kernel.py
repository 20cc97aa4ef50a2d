"""The dispatcher behind the kernel protocol (what the bench times): a lossy conversion its policy
allows is judged by that conversion's tolerance, not by the input dtype's."""

from __future__ import annotations

import torch

from attn_dispatch.calibration.measure import measure
from attn_dispatch.calibration.timer import QUICK
from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher.as_kernel import DispatchedKernel
from attn_dispatch.kernels import TOLERANCES, AccuracyPolicy, Problem
from tests.dispatcher.helpers import FixedRanker, use_ranking

LOSSY = "convert[fp32->bf16]+math"


def test_a_lossy_choice_is_held_to_its_own_tolerance(monkeypatch):
    use_ranking(monkeypatch, FixedRanker([LOSSY, "math"]))
    subject = DispatchedKernel(Dispatcher(kernels=[LOSSY, "math"], policy=AccuracyPolicy.allowing("fp32->bf16")), "cpu")
    problem = Problem(1, 4, 2, 16, 32, 16, 16, "float32")
    assert subject.tolerance(problem).relative_l2 >= TOLERANCES["bfloat16"].relative_l2
    point = measure(subject, problem, torch.device("cpu"), settings=QUICK)
    assert point.status == "ok" and point.rel_error > TOLERANCES["float32"].relative_l2


def test_a_lossless_choice_keeps_the_input_dtypes_tolerance(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["math"]))
    subject = DispatchedKernel(Dispatcher(kernels=["math"]), "cpu")
    assert subject.tolerance(Problem(1, 4, 2, 16, 32, 16, 16, "float32")) == TOLERANCES["float32"]
