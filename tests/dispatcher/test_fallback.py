"""A kernel that raises at run time is replaced by the next candidate, remembered for its bucket,
and reported; only when nothing can run does the call raise, listing every kernel's reason."""

from __future__ import annotations

import logging

import pytest
import torch

from attn_dispatch.dispatcher import Dispatcher, NoKernelError
from attn_dispatch.dispatcher.selection import failure_bucket
from attn_dispatch.kernels import MathKernel, Problem
from tests.dispatcher.helpers import FailingKernel, FixedRanker, assert_matches_reference, qkv, use_ranking


def test_failing_kernel_falls_back_and_is_remembered(monkeypatch, caplog):
    use_ranking(monkeypatch, FixedRanker(["failing", "math"]))
    failing = FailingKernel()
    ours = Dispatcher(kernels=[failing, MathKernel()])
    inputs = qkv()
    assert ours.explain(**inputs).kernel == "failing"
    with caplog.at_level(logging.WARNING, logger="attn_dispatch"):
        out = ours.attention(**inputs)
    assert_matches_reference(out, inputs)
    assert failing.attempts == 1
    assert any("failing raised RuntimeError: injected" in r.getMessage() and "math" in r.getMessage() for r in caplog.records)
    decision = ours.explain(**inputs)
    assert decision.kernel == "math"
    assert "failed at run time" in decision.reason_dropped("failing")
    assert "injected failure" in decision.reason_dropped("failing")
    ours.attention(**inputs)
    longer = qkv(q_len=7, kv_len=6)  # another shape in the same power-of-two bucket
    assert_matches_reference(ours.attention(**longer), longer)
    assert failing.attempts == 1  # remembered: never tried again for this bucket
    assert ours.stats() == {"math": 3}


def test_failure_is_remembered_per_bucket_only(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["failing", "math"]))
    failing = FailingKernel()
    ours = Dispatcher(kernels=[failing, MathKernel()])
    ours.attention(**qkv(q_len=8, kv_len=8))
    ours.attention(**qkv(q_len=64, kv_len=64))  # another bucket: tried (and failing) again
    assert failing.attempts == 2


def test_every_kernel_failing_raises_with_every_reason(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["failing"]))
    ours = Dispatcher(kernels=[FailingKernel()])
    with pytest.raises(NoKernelError, match="failing: failed at run time") as raised:
        ours.attention(**qkv())
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "q_heads=4" in str(raised.value)


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB"),
    RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes"),
    MemoryError(),
], ids=["cuda", "cpu-allocator", "memory-error"])
def test_out_of_memory_everywhere_is_not_remembered_forever(monkeypatch, error):
    use_ranking(monkeypatch, FixedRanker(["failing"]))
    failing = FailingKernel(error)
    ours = Dispatcher(kernels=[failing])
    for attempt in (1, 2):
        with pytest.raises(NoKernelError):
            ours.attention(**qkv())
        assert failing.attempts == attempt  # tried again: memory may have been freed meanwhile


def test_other_failures_everywhere_stay_remembered(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["failing"]))
    failing = FailingKernel(RuntimeError("OutOfMemoryError lookalike: not an allocation failure"))
    ours = Dispatcher(kernels=[failing])
    for _ in (1, 2):
        with pytest.raises(NoKernelError):
            ours.attention(**qkv())
    assert failing.attempts == 1  # not out of memory: remembered, not retried


def test_out_of_memory_falls_back_to_the_next_kernel(monkeypatch):
    use_ranking(monkeypatch, FixedRanker(["failing", "math"]))
    ours = Dispatcher(kernels=[FailingKernel(torch.OutOfMemoryError("out of memory")), MathKernel()])
    inputs = qkv()
    assert_matches_reference(ours.attention(**inputs), inputs)
    assert "OutOfMemoryError" in ours.explain(**inputs).reason_dropped("failing")


def test_failure_on_the_training_route_with_backward_kernel(monkeypatch):
    class FailingWithBackward(FailingKernel):
        supports_backward = True

    use_ranking(monkeypatch, FixedRanker(["failing", "math"]))
    ours = Dispatcher(kernels=[FailingWithBackward(), MathKernel()])
    inputs = qkv()
    inputs["query"].requires_grad_(True)
    out = ours.attention(**inputs)
    assert_matches_reference(out.detach(), inputs)


def test_failure_buckets_round_batch_and_lengths_up_to_powers_of_two():
    def bucket(batch, q_len, kv_len):
        return failure_bucket(Problem(batch, 4, 2, q_len, kv_len, 16, 16, "float32"))

    assert bucket(3, 5, 9) == bucket(4, 8, 16) != bucket(4, 8, 17)
    assert bucket(1, 1, 1) == bucket(1, 1, 1) != bucket(2, 1, 1)
    assert bucket(4, 9, 16) != bucket(4, 8, 16)
