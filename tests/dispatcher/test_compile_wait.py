"""A kernel that compiles on its first run in a process (Triton) waits until its bucket's calls
have lost as much to it as the compile costs (`selection.compile_deferred_order`)."""

from __future__ import annotations

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.kernels import MathKernel
from tests.dispatcher.helpers import FixedRanker, qkv, use_ranking

COMPILE_S = 10e-6
"""The fake compile: 10 calls' worth of the 1 us the ranker predicts between the first two kernels."""


class Compiling(MathKernel):
    """The math kernel under another name that 'compiles' on its first run in the process."""

    family = "compiling"

    def __init__(self) -> None:
        self.runs = 0

    @property
    def name(self) -> str:
        return "compiling"

    def setup_seconds(self, problem) -> float:
        return 0.0 if self.runs else COMPILE_S

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem):
        self.runs += 1
        return super().run(query, key, value, attn_mask, scale, enable_gqa, problem)


def _dispatcher(monkeypatch, compiling):
    use_ranking(monkeypatch, FixedRanker(["compiling", "math"]))  # predicted 1 us and 2 us
    return Dispatcher(kernels=[compiling, MathKernel()], measure=False)


def test_a_first_call_does_not_wait_for_a_compile(monkeypatch):
    compiling = Compiling()
    ours = _dispatcher(monkeypatch, compiling)
    ours.attention(**qkv())
    assert compiling.runs == 0
    decision = ours.explain(**qkv())
    assert decision.kernel == "math" and any("compiles on its first run" in note for note in decision.notes)


def test_the_bucket_compiles_once_its_calls_have_paid_for_it(monkeypatch):
    compiling = Compiling()
    ours = _dispatcher(monkeypatch, compiling)
    for _ in range(9):
        ours.attention(**qkv())
    assert compiling.runs == 0
    for _ in range(3):
        ours.attention(**qkv())
    assert compiling.runs >= 2  # settled on it after 10 calls, then served by it
    assert ours.explain(**qkv()).kernel == "compiling"


def test_the_calls_that_pay_for_a_compile_are_counted_over_the_bucket_s_shapes(monkeypatch):
    """A decode loop gives each key length a few calls: the bucket's calls add up."""
    compiling = Compiling()
    ours = _dispatcher(monkeypatch, compiling)
    for kv_len in range(9, 16):  # one bucket (9-16 keys), 3 calls each: 21 calls
        for _ in range(3):
            ours.attention(**qkv(kv_len=kv_len))
    assert compiling.runs > 0


def test_a_compiled_kernel_serves_new_shapes_at_once(monkeypatch):
    compiling = Compiling()
    compiling.runs = 1  # compiled earlier in the process
    ours = _dispatcher(monkeypatch, compiling)
    ours.attention(**qkv())
    assert compiling.runs == 2
