"""Every CLI test runs with its own table directory, one torch thread (the CI machine has two
cores, shared by the xdist workers), no memory budget, and a reset default dispatcher."""

from __future__ import annotations

import pytest
import torch

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher.cli import main


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path / "attn-dispatch-home"))
    monkeypatch.delenv("ATTN_DISPATCH_MEMORY_BUDGET", raising=False)
    monkeypatch.delenv("ATTN_DISPATCH_LOG", raising=False)
    monkeypatch.setenv("ATTN_DISPATCH_FAST_PATH", "0")  # calibrate builds none (`test_build_fast_path` builds)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dispatcher.reset()
    yield
    dispatcher.reset()
    torch.set_num_threads(threads)


@pytest.fixture
def cli(capsys):
    """Run ``attn-dispatch ARGS``; returns (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err

    return run
