"""A CPU table timed with another torch thread count than the process runs serves it quietly (no
warning, whatever the process does), never with another decision; `explain` states the count its
timings hold for, beside the process's; the same count, or a table that records none, says so or
nothing. (A `--threads 1` table is what a busy machine can calibrate; a warning in every process
that suggested more threads sent users round a loop the machine refused.)"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher.core import Dispatcher
from attn_dispatch.models.sharing import store_table
from tests.cli.tables import tiny_table
from tests.dispatcher.helpers import qkv

# Buckets (Lq 2^6, Lk 2^8) and (2^4, 2^7) of a float32 class (a table without a model: the prior ranks).
RANKINGS = {(6, 8): [("sdpa_math", 1e-5), ("math", 5e-5)], (4, 7): [("sdpa_math", 1e-5), ("math", 3e-5)]}
SHAPES = ({"q_len": 64, "kv_len": 256}, {"q_len": 16, "kv_len": 128})


@pytest.fixture
def threads():
    """This process's torch threads, restored after the test (a test may change them)."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def stored(tmp_path, timing_threads: int | None, created: str = "2026-11-30T00:00:00Z"):
    table = tiny_table(RANKINGS, created=created)
    table = replace(table, provenance=replace(table.provenance, timing_threads=timing_threads))
    return store_table(table, home=tmp_path / "attn-dispatch-home")


def inputs(shape: dict) -> dict:
    return qkv(heads=4, kv_heads=4, dim=32, dtype=torch.float32, **shape)


def thread_lines(decision) -> list[str]:
    return [note for note in decision.source.warnings if "torch thread" in note]


def test_another_count_serves_quietly_and_explain_states_both(tmp_path, threads):
    stored(tmp_path, timing_threads=threads + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the calls
        for shape in SHAPES:  # two buckets, two dispatchers
            dispatcher.attention(**inputs(shape))
        Dispatcher().attention(**inputs(SHAPES[0]))
    decision = dispatcher.explain(**inputs(SHAPES[0]))
    (line,) = thread_lines(decision)
    assert line.startswith(f"timing threads: {threads + 1} torch threads, its timings hold for that count; this "
                           f"process runs {threads} torch thread")
    assert f"torch.set_num_threads({threads + 1})" in line and "calibrate" not in line
    assert f"note: {line}" in str(decision)


def test_it_never_changes_a_decision(tmp_path, threads):
    stored(tmp_path, timing_threads=None)
    unsaid = [dispatcher.explain(**inputs(shape)).kernel for shape in SHAPES]
    dispatcher.reset()
    stored(tmp_path, timing_threads=threads + 1, created="2026-11-30T01:00:00Z")  # replaces it
    said = [dispatcher.explain(**inputs(shape)) for shape in SHAPES]
    assert [d.kernel for d in said] == unsaid
    assert all(thread_lines(d) for d in said)


def test_the_same_count_is_stated_and_no_count_says_nothing(tmp_path, threads):
    stored(tmp_path, timing_threads=threads)
    assert thread_lines(dispatcher.explain(**inputs(SHAPES[0]))) == [
        f"timing threads: {threads} torch thread{'s' if threads != 1 else ''}, as this process runs"]
    dispatcher.reset()
    stored(tmp_path, timing_threads=None, created="2026-11-30T01:00:00Z")
    assert thread_lines(dispatcher.explain(**inputs(SHAPES[0]))) == []
