"""`attn-dispatch calibrate` reads --memory-budget as every other command does
(`dispatcher.decision.parse_memory_size`: K/M/G/T alone are binary), without calibrating."""

from __future__ import annotations

import pytest

from attn_dispatch.dispatcher.cli import build_parser
from attn_dispatch.dispatcher.commands.calibrate import _config
from attn_dispatch.dispatcher.decision import parse_memory_size


def _budget(size: str) -> int | None:
    args = build_parser().parse_args(["calibrate", "--device", "cpu", "--memory-budget", size])
    return _config(args).memory_budget


@pytest.mark.parametrize("size", ["16G", "16GiB", "16GB", "512MiB", "1.5G", "1048576"])
def test_memory_budget_means_what_bench_and_check_mean(size):
    assert _budget(size) == parse_memory_size(size)


def test_memory_budget_units():
    assert _budget("16G") == 16 * 2**30
    assert _budget("16GB") == 16 * 10**9


def test_bad_memory_budgets_are_errors(cli):
    code, _, err = cli("calibrate", "--device", "cpu", "--memory-budget", "lots")
    assert code == 2 and "--memory-budget='lots' is not a memory size" in err
    code, _, err = cli("calibrate", "--device", "cpu", "--memory-budget", "0")
    assert code == 2 and "memory budget must be positive" in err


@pytest.fixture
def two_gpus_current_one(monkeypatch):
    """PyTorch reports two GPUs, the current one cuda:1 (no GPU is touched)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


@pytest.mark.parametrize("given", [["--device", "cuda"], [], ["--devices", "cuda,cuda:0"]])
def test_a_gpu_without_an_index_is_the_current_one(two_gpus_current_one, given):
    """`torch.cuda.set_device` and the memory cap need an index: `--device cuda` (and the default on a
    GPU machine) calibrate the current GPU, named with its index."""
    devices = _config(build_parser().parse_args(["calibrate", *given])).devices
    assert devices == (("cuda:1", "cuda:0") if "--devices" in given else ("cuda:1",))
