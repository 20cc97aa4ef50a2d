"""A bucket is ranked with backend probes deferred (`sdpa_default.probes_deferred`): a first call runs
none, and whatever is about to run a kernel probes it first (the planner's plan, a trial's candidate,
the training route), so a backend whose probe fails never runs."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.kernels import MathKernel, sdpa_default
from tests.dispatcher.helpers import FixedRanker, assert_matches_reference, qkv, use_ranking


class ProbedMath(MathKernel):
    """The math kernel under another name, with a probe that fails: it reports no reason while
    probes are deferred, and `reason` once probed."""

    family = "probed"
    supports_backward = True

    def __init__(self, label: str = "probed", reason: str | None = "its probe failed on this build") -> None:
        self.label, self.reason, self.runs = label, reason, 0

    @property
    def name(self) -> str:
        return self.label

    def reasons(self, problem):
        return [] if sdpa_default._DEFERRED.get() or self.reason is None else [self.reason]

    def run(self, *args):
        self.runs += 1
        return super().run(*args)


@pytest.fixture
def clean_probes():
    sdpa_default.clear_probe_cache()
    yield
    sdpa_default.clear_probe_cache()


@pytest.mark.measuring
def test_a_first_call_that_runs_pytorchs_default_runs_no_probe(clean_probes, monkeypatch):
    ran = []
    monkeypatch.setattr(sdpa_default, "_run_probe", lambda kernel, *key: ran.append((kernel.family, *key)))
    inputs = qkv(q_len=64, kv_len=64)
    out = Dispatcher(remember_tunings=False).attention(**inputs)  # the analytic prior: PyTorch's default first
    assert_matches_reference(out, inputs)
    assert ran == []


def test_the_kernel_a_plan_runs_is_probed_first(monkeypatch):
    probed = ProbedMath()
    use_ranking(monkeypatch, FixedRanker(["probed", "math"]))
    ours = Dispatcher(kernels=[probed, MathKernel()], measure=False)
    inputs = qkv()
    assert_matches_reference(ours.attention(**inputs), inputs)
    assert probed.runs == 0
    decision = ours.explain(**inputs)
    assert decision.kernel == "math" and decision.reason_dropped("probed") == "its probe failed on this build"


def test_a_kernel_whose_probe_passes_runs(monkeypatch):
    probed = ProbedMath(reason=None)
    use_ranking(monkeypatch, FixedRanker(["probed", "math"]))
    ours = Dispatcher(kernels=[probed, MathKernel()], measure=False)
    ours.attention(**qkv())
    assert probed.runs == 1


def test_the_training_route_probes_before_it_runs(monkeypatch):
    probed = ProbedMath()
    use_ranking(monkeypatch, FixedRanker(["probed", "math"]))
    ours = Dispatcher(kernels=[probed, MathKernel()], measure=False)
    inputs = qkv()
    query = inputs["query"].clone().requires_grad_()
    out = ours.attention(query, inputs["key"], inputs["value"], enable_gqa=True)
    out.sum().backward()
    assert probed.runs == 0 and query.grad is not None and torch.isfinite(query.grad).all()
