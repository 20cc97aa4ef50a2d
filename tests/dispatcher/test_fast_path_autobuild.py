"""The fast path builds itself in the background (`fast_path_autobuild`): one build per process and
home, only where it can work and is not turned off, one at a time across processes (a marker
file), a failure never retried; a dispatcher adopts the library at its next new shape, and SDPA as
`patched` installed it and `hf` attention functions move to the fast callable.

The build command is stood in for by a cheap child (copying the session's build into the home, or
exiting 1); one test runs the real command over an installed library (it finds it and exits)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attn_dispatch.dispatcher import Dispatcher, fast_path, fast_path_build, hf, patched
from attn_dispatch.dispatcher import fast_path_autobuild as autobuild
from attn_dispatch.dispatcher import fast_path_markers as markers
from attn_dispatch.dispatcher.fast_path_build import library_path, manifest_path
from attn_dispatch.models.environment import AUTO_BUILD
from tests.dispatcher.helpers import qkv

SDPA = torch._C._nn.scaled_dot_product_attention  # PyTorch's, never patched
CHILD_TIMEOUT_S = 300  # a child importing torch: seconds alone, far more on a busy machine
WARM_CALLS = 2  # a plan's first call makes it, its second makes it hot (`hot_path.HOT_AFTER`)
FIX = "run `attn-dispatch build-fast-path`"
GO_POLL_S = 0.05  # how often the waiting stand-in looks for its go file (no timing is asserted)

COPY = f"""
import os, shutil, sys
marker, built = sys.argv[1], sys.argv[2]
library = marker[:-len({markers.MARKER_SUFFIX!r})] + ".so"
shutil.copy(built, library + ".part")
os.replace(library + ".part", library)
shutil.copy(built[:-3] + ".json", library[:-3] + ".json")
"""
"""Stands in for the build: installs the session's library and manifest next to the marker."""
WAIT_FOR_GO = f"""
import os, sys, time
go = sys.argv[1]
deadline = time.monotonic() + {CHILD_TIMEOUT_S}
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep({GO_POLL_S})
"""
"""Stands in for a build that runs until the test creates its ``go`` file."""


@pytest.fixture(autouse=True)
def auto_build_on(monkeypatch, fast_path_build):
    """Auto-build on, this process's builds forgotten, and no library loaded yet (a new home's
    dispatcher then finds none); skipped where the session could not build the fast path."""
    if isinstance(fast_path_build, RuntimeError) or not fast_path.fast_path_enabled():
        pytest.skip(f"no fast path here ({fast_path_build})")
    monkeypatch.setenv(AUTO_BUILD.name, "1")
    monkeypatch.setattr(autobuild, "_builds", {})
    monkeypatch.setattr(autobuild, "_skipped", {})
    monkeypatch.setattr(autobuild, "_deferred", {})
    monkeypatch.setattr(autobuild, "builds_now", lambda: True)  # `test_a_cpu_process_using_every_core_builds_at_exit`
    monkeypatch.setattr(fast_path, "_loaded", {})


class StandIn:
    """Replaces `autobuild.build_command`: records each build it starts and runs `code` instead."""

    def __init__(self, monkeypatch, code: str, *args: str) -> None:
        self.markers: list[Path] = []
        self.code, self.args = code, args
        monkeypatch.setattr(autobuild, "build_command", self)

    def __call__(self, marker: Path) -> list[str]:
        self.markers.append(marker)
        return [sys.executable, "-c", self.code, str(marker), *self.args]


def finish(build: autobuild.Build) -> int:
    """Wait (bounded) for `build`'s child; its exit status as the build sees it."""
    build.process.wait(timeout=CHILD_TIMEOUT_S)
    return build.finished()


@pytest.fixture
def copying(monkeypatch, fast_path_build):
    return StandIn(monkeypatch, COPY, str(fast_path_build))


def test_one_build_per_process_and_home(copying, tmp_path):
    first = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path / "a"))
    second = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path / "a"))
    other = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path / "b"))
    assert first._fast is None and first._building.build is second._building.build
    assert other._building.build is not first._building.build
    assert copying.markers == [library_path(tmp_path / home).with_name(library_path(tmp_path / home).stem
                                                                       + markers.MARKER_SUFFIX) for home in "ab"]
    for ours in (first, other):
        assert finish(ours._building.build) == 0
        assert not ours._building.build.marker.exists()  # removed when the build ended
    assert Dispatcher(kernels=["sdpa_default"], home=str(tmp_path / "a"))._fast is not None  # built: loaded
    assert len(copying.markers) == 2


def test_not_started_when_switched_off(copying, monkeypatch, tmp_path):
    monkeypatch.setenv(AUTO_BUILD.name, "0")
    ours = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path))
    assert ours._fast is None and ours._building is None and copying.markers == []
    assert fast_path.status(tmp_path) == (f"not built: no auto-build (turned off by {AUTO_BUILD.name}=0); "
                                          f"{FIX}")


def test_not_started_without_a_compiler(copying, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    ours = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path))
    assert ours._building is None and copying.markers == []
    assert fast_path.status(tmp_path).startswith("not built: no auto-build (no C++ compiler found")


def marker_of(home: Path) -> Path:
    library = library_path(home)
    library.parent.mkdir(parents=True, exist_ok=True)
    return library.with_name(library.stem + markers.MARKER_SUFFIX)


def test_a_live_marker_means_another_process_builds_it_and_is_watched(copying, tmp_path, fast_path_build):
    marker = marker_of(tmp_path)
    marker.write_text(f"{os.getpid()} {time.time()}\n")  # a live builder: this very process
    ours = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path))
    assert copying.markers == [] and ours._building.build.process is None
    assert fast_path.status(tmp_path).startswith(f"not built yet: building in the background by another process "
                                                 f"(pid {os.getpid()}) since ")
    ours(**qkv())
    assert ours._fast is None  # still building
    subprocess.run([sys.executable, "-c", COPY, str(marker), str(fast_path_build)], check=True,
                   timeout=CHILD_TIMEOUT_S)  # the other process installs it and removes its marker
    marker.unlink()
    ours(**qkv(kv_len=40))
    assert ours._fast is not None and ours._building is None


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=CHILD_TIMEOUT_S)
    return child.pid


@pytest.mark.parametrize("recorded", ["dead builder", "too old"])
def test_a_stale_marker_is_replaced(copying, tmp_path, recorded):
    marker = marker_of(tmp_path)
    pid, started = (dead_pid(), time.time()) if recorded == "dead builder" else (
        os.getpid(), time.time() - markers.STALE_AFTER_S - 1)
    marker.write_text(f"{pid} {started}\n")
    ours = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path))
    assert copying.markers == [marker] and ours._building.build.process is not None
    assert finish(ours._building.build) == 0 and not marker.exists()


def test_a_failed_build_is_not_retried_and_status_says_so(monkeypatch, tmp_path):
    failing = StandIn(monkeypatch, "import sys; sys.exit(1)")
    ours = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path))
    build = ours._building.build
    assert finish(build) == 1
    ours(**qkv())  # a new shape: the dispatcher stops waiting, the Python path serves
    assert ours._building is None and ours._fast is None
    again = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path))
    assert again._building is None and len(failing.markers) == 1
    assert fast_path.status(tmp_path) == f"not built: auto-build failed (see {build.log}); {FIX}"


def test_status_while_building_and_no_adoption_before_the_end(monkeypatch, tmp_path):
    go = tmp_path / "go"
    StandIn(monkeypatch, WAIT_FOR_GO, str(go))
    ours = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path / "home"))
    build = ours._building.build
    since = time.strftime("%H:%M:%S", time.localtime(build.started))
    assert fast_path.status(tmp_path / "home") == (f"not built yet: building in the background since {since}, "
                                                   f"log: {build.log}")
    ours(**qkv())
    assert ours._building is not None and ours._fast is None
    go.touch()
    assert finish(build) == 0  # exited 0 but installed nothing: the dispatcher stops waiting at its next shape
    ours(**qkv(kv_len=40))
    assert ours._building is None and ours._fast is None
    assert fast_path.status(tmp_path / "home") == f"not built: {FIX}"


def tensors(**shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query ``[1, 4, L, 16]``, key and value ``[1, 2, S, 16]`` (grouped query heads)."""
    inputs = qkv(**shape)
    return inputs["query"], inputs["key"], inputs["value"]


def served_in_cpp(ours: Dispatcher, call) -> bool:
    before = ours._fast.hits
    call()
    return ours._fast.hits == before + 1


def test_adopted_at_the_next_new_shape_by_patching_and_hf(copying, tmp_path):
    ours = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path))
    original = F.scaled_dot_product_attention
    forward = hf.make_attention_function(ours)
    module = torch.nn.Module()
    q, k, v = tensors(q_len=1, kv_len=33)
    with patched(ours):
        assert F.scaled_dot_product_attention == ours.attention
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # planned on the Python path
        assert finish(ours._building.build) == 0
        for _ in range(WARM_CALLS):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        assert ours._fast is None  # the warm path never checks
        q2, k2, v2 = tensors(q_len=1, kv_len=57)
        F.scaled_dot_product_attention(q2, k2, v2, enable_gqa=True)  # a new shape: adopted
        assert ours._fast is not None and ours._building is None
        fast = F.scaled_dot_product_attention
        assert fast is ours.fast_attention and fast != ours.attention
        for _ in range(WARM_CALLS):
            fast(q, k, v, enable_gqa=True)
        out = []
        assert served_in_cpp(ours, lambda: out.append(F.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
        assert torch.equal(out[0], SDPA(q, k, v, enable_gqa=True))
        for _ in range(WARM_CALLS):
            forward(module, q2, k2, v2, None, is_causal=False)
        answer = []
        assert served_in_cpp(ours, lambda: answer.append(forward(module, q2, k2, v2, None, is_causal=False)))
        assert torch.equal(answer[0][0], SDPA(q2, k2, v2, enable_gqa=True).transpose(1, 2).contiguous())
    assert F.scaled_dot_product_attention is original


def test_an_attention_function_made_after_adoption_is_fast_and_a_plain_object_keeps_attention(copying, tmp_path):
    ours = Dispatcher(kernels=["sdpa_default"], home=str(tmp_path))
    assert finish(ours._building.build) == 0
    ours(**qkv())  # adopted
    bound = []
    autobuild.follow_fast_path(ours, bound.append)
    assert bound == [ours.fast_attention] and ours.fast_attention != ours.attention

    class OnlyAttention:
        def attention(self, *args, **kwargs):
            return SDPA(*args, **kwargs)

    plain, bound = OnlyAttention(), []
    autobuild.follow_fast_path(plain, bound.append)
    assert bound == [plain.attention]


def test_the_real_command_finds_an_installed_library_and_removes_its_marker(tmp_path, fast_path_build):
    """The child as shipped (lowered priority, `cli.main`'s build-fast-path), over an installed
    library: it reports the library as built, exits 0, and its own wrapper removed the marker."""
    library = library_path(tmp_path)
    library.parent.mkdir(parents=True)
    shutil.copy(fast_path_build, library)
    shutil.copy(manifest_path(fast_path_build), manifest_path(library))
    build = autobuild.start(tmp_path)
    build.process.wait(timeout=CHILD_TIMEOUT_S)
    assert not build.marker.exists()  # before this process looked: the child removed it
    assert build.finished() == 0
    assert "already built" in build.log.read_text()


def test_a_cpu_process_using_every_core_builds_at_exit(copying, tmp_path, monkeypatch):
    """Where a build now would slow this process (`builds_now` False), nothing starts until the
    interpreter exits: the exit hook starts the build, detached, for the next process."""
    hooks = []
    monkeypatch.setattr(autobuild, "builds_now", lambda: False)
    monkeypatch.setattr(autobuild.atexit, "register", hooks.append)
    home = str(tmp_path / "deferred")
    ours = Dispatcher(kernels=["sdpa_default"], home=home)
    Dispatcher(kernels=["sdpa_default"], home=home)
    assert ours._building is None and copying.markers == [] and hooks == [autobuild.start_deferred]
    assert "builds in the background when this process exits" in fast_path.status(home)
    hooks[0]()  # what atexit runs
    build = autobuild._builds[str(library_path(home))]
    assert copying.markers == [build.marker] and finish(build) == 0
    assert fast_path.status(home).startswith("loaded ")


def test_builds_now_where_a_core_is_free_or_a_gpu_runs_the_model(monkeypatch):
    monkeypatch.undo()  # the real `builds_now`
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert not autobuild.builds_now()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert autobuild.builds_now()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert autobuild.builds_now()


def test_a_deferred_build_is_not_promised_where_it_cannot_run(tmp_path, monkeypatch):
    """Turned off (or a tool missing): nothing is deferred, and the status line says why."""
    hooks = []
    monkeypatch.setattr(autobuild, "builds_now", lambda: False)
    monkeypatch.setattr(autobuild.atexit, "register", hooks.append)
    monkeypatch.setenv(AUTO_BUILD.name, "0")
    home = str(tmp_path / "off")
    Dispatcher(kernels=["sdpa_default"], home=home)
    assert hooks == [] and autobuild._deferred == {}
    assert fast_path.status(home) == f"not built: no auto-build (turned off by {AUTO_BUILD.name}=0); {FIX}"


def test_a_failed_child_keeps_every_later_process_from_building_until_an_explicit_build(
        copying, tmp_path, monkeypatch):
    """The child records its failure next to the library; a later process (this one with its
    builds forgotten) starts none and says why; `fast_path.build` clears the record."""
    home = tmp_path / "failing"
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(home))
    monkeypatch.setattr("attn_dispatch.dispatcher.cli.main", lambda argv: 1)
    library = library_path(str(home))
    marker = markers.marker_path(library)
    assert markers.claim(marker)
    assert autobuild.run_child(str(marker)) == 1 and not marker.exists()
    assert markers.failure_of(library).startswith("exit 1 at ")
    Dispatcher(kernels=["sdpa_default"], home=str(home))
    assert copying.markers == []
    status = fast_path.status(str(home))
    assert status.startswith("not built: no auto-build (the last background build failed, exit 1 at ") and status.endswith(FIX)
    monkeypatch.setattr("attn_dispatch.dispatcher.fast_path_build.rejection", lambda library: "")  # installed
    fast_path_build.build(str(home))  # what `build-fast-path`, `calibrate` and `fast_path.build` run
    assert markers.failure_of(library) is None


@pytest.mark.parametrize("builder", ["live", "dead"])
def test_status_names_another_process_build(tmp_path, builder):
    """Another process's marker: a build running there (its pid and start), or one interrupted."""
    library = library_path(str(tmp_path))
    library.parent.mkdir(parents=True)
    pid = os.getpid() if builder == "live" else dead_pid()
    markers.marker_path(library).write_text(f"{pid} {time.time()}\n")
    status = fast_path.status(str(tmp_path))
    expected = ("building in the background by another process" if builder == "live"
                else "a background build was interrupted")
    assert status.startswith(f"not built yet: {expected} (pid {pid})") and status.endswith(FIX)


def test_a_deferred_build_starts_nothing_where_the_library_was_built_meanwhile(copying, tmp_path, monkeypatch):
    """`calibrate` builds the fast path at its end: the exit hook then has nothing to start."""
    hooks = []
    monkeypatch.setattr(autobuild, "builds_now", lambda: False)
    monkeypatch.setattr(autobuild.atexit, "register", hooks.append)
    home = str(tmp_path / "built-meanwhile")
    Dispatcher(kernels=["sdpa_default"], home=home)
    built = autobuild.start(home)  # stands in for the explicit build that ran meanwhile
    assert finish(built) == 0 and len(copying.markers) == 1
    monkeypatch.setattr(autobuild, "_builds", {})  # as if this process had not started it
    hooks[0]()
    assert len(copying.markers) == 1 and autobuild._builds == {}
