"""explain(), the decision log and `attn-dispatch explain`."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher.cli import main
from attn_dispatch.dispatcher.cold_path import TRAINING_COUNT
from attn_dispatch.dispatcher.decision import TRAINING_KERNEL, Candidate, Decision, logger
from attn_dispatch.kernels import Problem
from tests.dispatcher.helpers import TEST_SOURCE, FixedRanker, qkv, use_ranking


def test_explain_does_not_run_and_matches_what_runs(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["small_q[splits=8]", "math"]))
    ours = Dispatcher(kernels="portable")
    inputs = qkv(q_len=1, kv_len=64)
    decision = ours.explain(**inputs)
    assert ours.stats() == {}
    ours.attention(**inputs)
    assert ours.stats() == {decision.kernel: 1} and decision.kernel == "small_q[splits=8]"
    assert decision.problem.q_len == 1 and decision.device == "cpu"
    assert decision.free_bytes and decision.budget_bytes is None
    assert "convert[fp32->bf16]" in str(decision)  # why lossy conversions were dropped
    assert "accuracy policy" in decision.reason_dropped("convert[fp32->bf16]+small_q[splits=8]")


def test_the_candidates_header_says_when_the_first_is_not_the_fastest_predicted():
    def listed(*times: tuple[str, float | None]) -> str:
        decision = Decision(kernel=times[0][0], params={}, problem=Problem(1, 4, 4, 8, 8, 16, 16, "float32"),
                            device="cpu", source=TEST_SOURCE, candidates=tuple(Candidate(n, t, 0) for n, t in times))
        (header,) = [line for line in str(decision).splitlines() if line.startswith("  candidates")]
        return header

    assert listed(("sdpa_default", 2e-6), ("math", 1e-6), ("sdpa_math", 3e-6)) == (
        "  candidates, in the order they are tried (sdpa_default first although math is predicted faster: the "
        "ranked-by line or a note says why):")
    assert listed(("math", 1e-6), ("sdpa_default", 2e-6)) == "  candidates, in the order they are tried:"
    assert listed(("math", None), ("sdpa_default", 2e-6)) == "  candidates, in the order they are tried:"


def test_log_each_new_decision_once(monkeypatch, caplog):
    monkeypatch.setenv("ATTN_DISPATCH_LOG", "1")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    with caplog.at_level(logging.INFO, logger="attn_dispatch"):
        for _ in range(3):
            dispatcher.attention(**qkv())
        dispatcher.attention(**qkv(q_len=3))
    decisions = [r for r in caplog.records if r.levelno == logging.INFO and "->" in r.getMessage()]
    assert len(decisions) == 2
    assert "Lq=8" in decisions[0].getMessage() and "Lq=3" in decisions[1].getMessage()


def test_no_info_log_without_the_switch(caplog):
    with caplog.at_level(logging.INFO, logger="attn_dispatch"):
        dispatcher.attention(**qkv())
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and "->" in r.getMessage()]


def test_cli_explain_text(capsys):
    assert main(["explain", "--lq", "64", "--lk", "512", "--heads", "8", "--kv-heads", "2", "--head-dim", "32",
                 "--dtype", "fp32", "--causal", "--device", "cpu", "--memory-budget", "64MiB"]) == 0
    out = capsys.readouterr().out
    assert "Lq=64 Lk=512" in out and "causal" in out and "candidates" in out and "budget 64.0 MiB" in out


def test_cli_explain_json_with_mask(capsys):
    assert main(["explain", "--lq", "1", "--lk", "300", "--mask", "bool", "--dtype", "bf16", "--device", "cpu",
                 "--kernels", "portable", "--json"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["problem"]["mask_kind"] == "bool" and decision["problem"]["dtype"] == "bfloat16"
    assert decision["kernel"] == decision["candidates"][0]["name"]
    assert all(not d["name"].startswith("sdpa_flash") for d in decision["candidates"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--lq", "8", "--memory-budget", "lots"], "--memory-budget"),
     (["--lq", "8", "--heads", "6", "--kv-heads", "4"], "--kv-heads"),
     (["--lq", "8", "--allow-lossy", "fp32->int8"], "conversion")],
)
def test_cli_explain_errors(argv, message, capsys):
    assert main(["explain", "--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:could not identify meta")
def test_several_devices_keep_separate_state():
    """cpu and meta tensors in one process: each device gets its own ranking and decisions."""
    ours = Dispatcher(kernels=["math", "sdpa_default"])
    inputs = qkv()
    meta = {name: t.to("meta") if isinstance(t, torch.Tensor) else t for name, t in inputs.items()}
    ours.attention(**inputs)
    out = ours.attention(**meta)  # shapes only: PyTorch's SDPA serves meta calls, no decision (issue 13)
    assert out.device.type == "meta" and out.shape == (1, 4, 8, 16)
    assert set(ours._cold.planners) == {torch.device("cpu")}
    assert ours.explain(**meta).device == "meta" and ours.explain(**inputs).device == "cpu"
    assert set(ours._cold.planners) == {torch.device("cpu"), torch.device("meta")}


@pytest.mark.parametrize("kernel", ["sdpa_math", "math"])  # with and without backward
@pytest.mark.parametrize("grad_enabled", [True, False])
@pytest.mark.parametrize("dropout_p", [0.0, 0.5])
@pytest.mark.parametrize("query_grad", [False, True])
@pytest.mark.parametrize("mask_grad", [None, False, True])  # None: no mask
def test_explain_reports_the_route_attention_takes(kernel, grad_enabled, dropout_p, query_grad, mask_grad):
    inputs = qkv(heads=2, kv_heads=2)
    if query_grad:
        inputs["query"].requires_grad_(True)
    if mask_grad is not None:
        inputs["attn_mask"] = torch.zeros(1, 1, 8, 8, requires_grad=mask_grad)
    ours = Dispatcher(kernels=[kernel])
    with torch.set_grad_enabled(grad_enabled):
        decision = ours.explain(**inputs, dropout_p=dropout_p)
        ours.attention(**inputs, dropout_p=dropout_p)
    ran = next(iter(ours.stats()))
    training = dropout_p != 0.0 or (grad_enabled and (query_grad or bool(mask_grad)))
    assert decision.route == ("training" if training else "dispatch"), (decision.route, ran)
    assert decision.kernel == (TRAINING_KERNEL if ran == TRAINING_COUNT else ran)
    if ran == TRAINING_COUNT:
        note = decision.notes[-1]
        assert ("dropout_p=0.5" in note) == (dropout_p != 0.0)
        assert ("has no backward" in note) == (dropout_p == 0.0 and not (grad_enabled and mask_grad))
