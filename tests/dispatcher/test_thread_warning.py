"""A CPU table timed with another torch thread count than the process runs is said once per
process and table (a `ThreadsWarning`, a `TableWarning`), in `explain`'s notes too, and never
changes a decision; the same count, or a table that does not record one, says nothing."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher import TableWarning
from attn_dispatch.dispatcher.core import Dispatcher
from attn_dispatch.dispatcher.thread_warning import ThreadsWarning
from attn_dispatch.models.sharing import store_table
from tests.cli.tables import tiny_table
from tests.dispatcher.helpers import qkv

# Buckets (Lq 2^6, Lk 2^8) and (2^4, 2^7) of a float32 class, ranking PyTorch's math backend first.
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


def thread_warnings(run) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, ThreadsWarning)]


def test_another_count_is_said_once_per_process_and_table(tmp_path, threads):
    path = stored(tmp_path, timing_threads=threads + 1)

    def calls():
        for shape in SHAPES:  # two buckets: the table ranks twice
            dispatcher.attention(**inputs(shape))
        Dispatcher().attention(**inputs(SHAPES[0]))  # a second dispatcher, the same table

    said = thread_warnings(calls)
    assert len(said) == 1
    assert said[0].startswith(f"threshold table {path} was timed with {threads + 1} torch threads, but this process "
                              f"runs {threads} torch thread")
    assert f"--threads {threads}`" in said[0] and f"torch.set_num_threads({threads + 1})" in said[0]
    assert issubclass(ThreadsWarning, TableWarning)
    decision = dispatcher.explain(**inputs(SHAPES[0]))
    assert said[0] in decision.source.warnings and f"note: {said[0]}" in str(decision)


def test_it_never_changes_a_decision(tmp_path, threads):
    stored(tmp_path, timing_threads=None)
    unsaid = [dispatcher.explain(**inputs(shape)).kernel for shape in SHAPES]
    dispatcher.reset()
    stored(tmp_path, timing_threads=threads + 1, created="2026-11-30T01:00:00Z")  # replaces it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ThreadsWarning)
        said = [dispatcher.explain(**inputs(shape)) for shape in SHAPES]
    assert [d.kernel for d in said] == unsaid == ["sdpa_math", "sdpa_math"]
    assert all(any("torch thread" in w for w in d.source.warnings) for d in said)


def test_the_same_count_or_no_count_says_nothing(tmp_path, threads):
    stored(tmp_path, timing_threads=threads)
    assert thread_warnings(lambda: dispatcher.attention(**inputs(SHAPES[0]))) == []
    dispatcher.reset()
    stored(tmp_path, timing_threads=None, created="2026-11-30T01:00:00Z")
    assert thread_warnings(lambda: dispatcher.attention(**inputs(SHAPES[0]))) == []


def test_a_count_changed_after_the_first_call_is_said_at_the_next_new_bucket(tmp_path, threads):
    stored(tmp_path, timing_threads=threads)
    assert thread_warnings(lambda: dispatcher.attention(**inputs(SHAPES[0]))) == []
    torch.set_num_threads(threads + 1)
    said = thread_warnings(lambda: dispatcher.attention(**inputs(SHAPES[1])))
    assert len(said) == 1 and f"this process runs {threads + 1} torch threads" in said[0]
