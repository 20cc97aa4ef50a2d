"""Every dispatcher test runs with its own table directory, no budget, no log switch, a
reset default dispatcher and nothing installed."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher import fast_path, measuring, patching
from attn_dispatch.kernels import _triton_support

FAST_PATH_TEST_HOME = Path(tempfile.gettempdir()) / "attn-dispatch-test-fast-path"


@pytest.fixture(scope="session", autouse=True)
def fast_path_build():
    """Every dispatcher test runs with the fast path (`fast_path`), built once into the temp
    directory (keyed by torch, Python and source: reused by later sessions, xdist workers and other
    checkouts; `fast_path_build` compiles in a private folder under a lock and installs atomically,
    so they never meet a partial file or a stale lock): the installed library's path, or the
    RuntimeError that says why it did not build (`test_fast_path` then skips or fails)."""
    try:
        return fast_path.build(FAST_PATH_TEST_HOME)
    except RuntimeError as error:
        return error


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path / "attn-dispatch-home"))
    monkeypatch.delenv("ATTN_DISPATCH_MEMORY_BUDGET", raising=False)
    monkeypatch.delenv("ATTN_DISPATCH_LOG", raising=False)
    monkeypatch.setattr(measuring, "_variants_run", set())  # what "this process" has run: per test
    monkeypatch.setattr(_triton_support, "_compiled", set())
    dispatcher.reset()
    yield
    dispatcher.reset()
    leaked = patching.is_installed()
    while patching.is_installed():
        patching.uninstall()
    assert not leaked, "a test left F.scaled_dot_product_attention patched"


@pytest.fixture
def fresh_dynamo():
    """torch.compile tests: Dynamo's caches and counters reset before and after (what one test
    compiled never serves another)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()
