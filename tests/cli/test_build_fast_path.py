"""`attn-dispatch build-fast-path`: builds the fast path where Dispatchers load it, or says in one
line what is missing and exits non-zero; `calibrate` builds it best effort."""

from __future__ import annotations

import shutil

import pytest

from attn_dispatch.dispatcher import fast_path
from attn_dispatch.dispatcher.commands.build_fast_path import build_after_calibration
from tests.dispatcher.conftest import FAST_PATH_TEST_HOME


@pytest.mark.skipif(not any(shutil.which(c) for c in ("c++", "g++")), reason="no C++ compiler found")
def test_builds_under_the_home_directory(cli, monkeypatch):
    """Into the tests' shared home (built there once per session by tests/dispatcher/conftest.py:
    ninja then finds nothing to do, or builds it here)."""
    code, out, err = cli("build-fast-path", "--home", FAST_PATH_TEST_HOME)
    assert code == 0, err
    library = fast_path.library_path(FAST_PATH_TEST_HOME)
    assert out.startswith("built the fast path in ") and str(library) in out
    assert library.is_file()
    monkeypatch.setattr(fast_path, "_loaded", {})
    assert fast_path.load(FAST_PATH_TEST_HOME) is not None


def test_a_missing_compiler_is_one_line_and_a_failure(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    code, out, err = cli("build-fast-path", "--home", tmp_path)
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "no C++ compiler found" in err and "no-such-compiler" in err


def test_calibrate_s_build_never_fails(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTN_DISPATCH_FAST_PATH", "1")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(fast_path, "_loaded", {})
    note = build_after_calibration(str(tmp_path))
    assert note.startswith("note: the fast path was not built") and "no C++ compiler found" in note
