"""`attn-dispatch build-fast-path`: builds the fast path where Dispatchers load it, in a private
folder (a killed build's stale lock hangs nothing; two builds at once install one library), or
says in one line what is missing and exits non-zero; `calibrate` builds it best effort; `devices`
says whether it is loaded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from attn_dispatch.dispatcher import fast_path, fast_path_build
from attn_dispatch.dispatcher.commands.build_fast_path import build_after_calibration
from attn_dispatch.models.environment import FAST_PATH
from tests.dispatcher.conftest import FAST_PATH_TEST_HOME

needs_compiler = pytest.mark.skipif(not any(shutil.which(c) for c in ("c++", "g++")), reason="no C++ compiler found")
BUILD_TIMEOUT_S = 600  # one compile is 16-25 s on 2 idle cores; a hang (the stale-lock bug) never ends
BUILD = "from attn_dispatch.dispatcher.cli import main; raise SystemExit(main(['build-fast-path', '--home', {home!r}]))"


@needs_compiler
def test_builds_under_the_home_directory_and_devices_says_it_is_loaded(cli, monkeypatch):
    """Into the tests' shared home (built there once per session by tests/dispatcher/conftest.py:
    then kept, as its manifest matches, or built here)."""
    code, out, err = cli("build-fast-path", "--home", FAST_PATH_TEST_HOME)
    assert code == 0, err
    library = fast_path.library_path(FAST_PATH_TEST_HOME)
    assert out.startswith(("built the fast path in ", "the fast path is already built")) and str(library) in out
    assert fast_path_build.rejection(library) == ""
    monkeypatch.setattr(fast_path, "_loaded", {})
    assert fast_path.load(FAST_PATH_TEST_HOME) is not None
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(FAST_PATH_TEST_HOME))
    monkeypatch.setenv(FAST_PATH.name, "1")
    if fast_path.fast_path_enabled():
        code, out, _ = cli("devices")
        assert code == 0 and out.splitlines()[-1].startswith(f"fast path: loaded {library} (")


@needs_compiler
def test_a_killed_build_s_stale_lock_hangs_nothing_and_two_builds_at_once_install_one(tmp_path):
    """torch's ``lock`` (left by a build killed with SIGKILL), an unheld ``install.lock`` in the
    final folder and a killed build's private folder; two builds start at once: both finish, one
    library matching its manifest is installed, and no private build folder is left."""
    home = tmp_path / "home"
    folder = fast_path_build.build_directory(home)
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")
    (folder / fast_path_build.LOCK_NAME).write_text("")
    (folder.parent / f".{fast_path_build.module_name()}-build-killed").mkdir()  # a killed build's private folder
    builds = [subprocess.Popen([sys.executable, "-c", BUILD.format(home=str(home))], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        results = [(build.wait(timeout=BUILD_TIMEOUT_S), *build.communicate()) for build in builds]
    finally:
        for build in builds:
            build.kill()
    assert all(code == 0 for code, _, _ in results), results
    first, second = sorted(out for _, out, _ in results)  # one compiles; the other waits on its lock, then keeps it
    assert first.startswith("built the fast path in ") and second.startswith("the fast path is already built"), results
    assert fast_path_build.rejection(fast_path.library_path(home)) == ""
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]


def test_a_failed_build_leaves_no_private_folder(monkeypatch, tmp_path):
    def failing(folder):
        raise RuntimeError("building the fast path failed: injected")

    monkeypatch.setattr(fast_path_build, "_compile", failing)
    monkeypatch.setattr(fast_path_build, "missing_tool", lambda: "")
    with pytest.raises(RuntimeError, match="injected"):
        fast_path.build(tmp_path)
    folder = fast_path_build.build_directory(tmp_path)
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]
    assert fast_path_build.rejection(fast_path.library_path(tmp_path)) is None


def test_devices_says_the_fast_path_is_off_or_not_built(cli, monkeypatch):
    code, out, _ = cli("devices")  # the CLI tests run with ATTN_DISPATCH_FAST_PATH=0
    assert code == 0 and out.splitlines()[-1] == "fast path: off (ATTN_DISPATCH_FAST_PATH=0)"
    monkeypatch.setenv(FAST_PATH.name, "1")
    monkeypatch.setattr(fast_path, "_loaded", {})
    expected = (f"not built: run `attn-dispatch build-fast-path` ({fast_path.WITHOUT_IT})" if fast_path.fast_path_enabled()
                else "unavailable on torch < 2.5 (no torch.compiler.substitute_in_graph)")
    code, out, _ = cli("devices")
    assert code == 0 and out.splitlines()[-1] == f"fast path: {expected}"
    code, out, _ = cli("devices", "--json")
    assert code == 0 and {record["fast_path"] for record in json.loads(out)} == {expected}


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


def test_devices_says_a_build_is_for_another_version(cli, monkeypatch, tmp_path):
    monkeypatch.setenv(FAST_PATH.name, "1")
    monkeypatch.setattr(fast_path, "_loaded", {})
    if not fast_path.fast_path_enabled():
        pytest.skip("torch < 2.5: no fast path")
    (fast_path.build_directory(tmp_path).parent / "attn_dispatch_fast_call_0123456789abcdef").mkdir(parents=True)
    assert fast_path.status(tmp_path).startswith("not built for this attn-dispatch and torch")
