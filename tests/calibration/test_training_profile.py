"""The training profile times forward+backward of kernels with a backward, skips what does not
fit or fails, and writes a file the training route reads."""

from __future__ import annotations

import json

import torch

from attn_dispatch.calibration.timer import QUICK
from attn_dispatch.calibration.training_profile import (
    main,
    measure_profile,
    training_kernels,
    training_problems,
    write_profile,
)
from attn_dispatch.kernels import ChunkedKernel, MathKernel, Problem
from attn_dispatch.kernels.base import training_bytes
from attn_dispatch.models.environment import TRAINING_PROFILE
from attn_dispatch.models.training_times import TrainingTimes

PROBLEM = Problem(1, 2, 2, 64, 64, 16, 16, "float32", causal=True)


def test_every_kernel_in_the_profile_has_a_backward():
    kernels = training_kernels("portable")
    assert kernels and all(kernel.supports_backward for kernel in kernels)
    assert {"chunked", "sdpa_default"} <= {kernel.family for kernel in kernels}
    assert all(problem.device_type == "cpu" for problem in training_problems("cpu", quick=True))


def test_profile_times_what_fits_and_skips_the_rest():
    small, big = ChunkedKernel(q=16, kv=32), ChunkedKernel(q=64, kv=64)
    budget = training_bytes(small, PROBLEM)
    assert training_bytes(big, PROBLEM) > budget
    profile = measure_profile(torch.device("cpu"), [PROBLEM], [small, big, MathKernel()], budget=budget, settings=QUICK)
    assert [entry["kernel"] for entry in profile["entries"]] == [small.name]
    assert profile["entries"][0]["seconds"] > 0
    reasons = {row["kernel"]: row["reason"] for row in profile["skipped"]}
    assert "over the budget" in reasons[big.name]
    times = TrainingTimes.from_dict(json.loads(json.dumps(profile)))
    assert set(times.lookup(PROBLEM, torch.device("cpu"))) == {small.name}


def test_a_failing_kernel_is_skipped_with_its_error():
    class Broken(ChunkedKernel):
        def run(self, *args, **kwargs):
            raise RuntimeError("injected")

    profile = measure_profile(torch.device("cpu"), [PROBLEM], [Broken(q=16, kv=16)], budget=None, settings=QUICK)
    assert profile["entries"] == [] and "injected" in profile["skipped"][0]["reason"]


def test_command_line_writes_a_profile(tmp_path, monkeypatch):
    monkeypatch.setattr("attn_dispatch.calibration.training_profile.training_problems",
                        lambda device_type, quick: [PROBLEM])
    monkeypatch.setattr("attn_dispatch.calibration.training_profile.training_kernels",
                        lambda kernel_set: [ChunkedKernel(q=32, kv=32)])
    out = tmp_path / "profile.json"
    assert main(["--device", "cpu", "--quick", "--memory-budget-gib", "1", "--out", str(out)]) == 0
    assert TrainingTimes.load(out).lookup(PROBLEM, torch.device("cpu")) != {}


def test_default_path_is_where_the_training_route_looks(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path))
    monkeypatch.delenv(TRAINING_PROFILE.name, raising=False)
    monkeypatch.setattr("attn_dispatch.calibration.training_profile.training_problems", lambda device_type, quick: [PROBLEM])
    monkeypatch.setattr("attn_dispatch.calibration.training_profile.training_kernels",
                        lambda kernel_set: [ChunkedKernel(q=32, kv=32)])
    summary = write_profile("cpu", kernel_set="portable", budget=None, quick=True)
    assert str(tmp_path / "training_profile.json") in summary
    assert TrainingTimes.from_env().lookup(PROBLEM, torch.device("cpu")) != {}


def test_calibrate_training_flag_writes_the_profile(tmp_path, monkeypatch, capsys):
    from attn_dispatch.dispatcher.cli import main as cli_main

    class Summary:
        def lines(self):
            return ["calibrated (stand-in)"]

    calls = {}
    monkeypatch.setattr("attn_dispatch.calibration.session.calibrate", lambda config, **kwargs: Summary())
    monkeypatch.setattr("attn_dispatch.calibration.training_profile.write_profile",
                        lambda device, **kwargs: calls.update(device=device, **kwargs) or "training profile: stand-in")
    assert cli_main(["calibrate", "--device", "cpu", "--quick", "--kernels", "portable", "--memory-budget", "1GiB",
                     "--training"]) == 0
    assert calls == {"device": "cpu", "kernel_set": "portable", "budget": 2**30, "quick": True}
    assert "training profile: stand-in" in capsys.readouterr().out
