"""Which buckets measure on their calls, and which candidates (`dispatcher.selection.measured_candidates`):
PyTorch's default first, then the ranking's first choices, flash on a GPU, each family of ours on
a CPU; nothing where a measured entry of this card decides."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher.selection import (
    Option,
    measured_candidates,
    measuring_wanted,
    own_family_options,
)
from attn_dispatch.kernels import Problem, kernel_from_name
from tests.dispatcher.helpers import FixedRanker, qkv, use_ranking

pytestmark = pytest.mark.measuring

CUDA = torch.device("cuda")  # a device object only: nothing runs on it
CPU = torch.device("cpu")
DECODE = Problem(1, 4, 4, 1, 64, 16, 16, "float32")
GPU_PREFILL = Problem(1, 4, 4, 16, 64, 16, 16, "float16", device_type="cuda")


def _options(monkeypatch, order, problem=DECODE, kernels=None):
    use_ranking(monkeypatch, FixedRanker(order))
    ours = Dispatcher(kernels=kernels if kernels is not None else order)
    planner = ours._cold.planner(CPU)
    return planner.decide(problem, budget=None, measure=False, on_failure=lambda *a: None).options


def _names(options):
    return [o.kernel.name for o in options]


def test_the_default_comes_first_then_the_rankings_first_two_and_on_a_gpu_flash(monkeypatch):
    options = _options(monkeypatch, ["small_q[splits=8]", "math", "chunked[q=128,kv=1024]", "sdpa_flash",
                                     "sdpa_default"], Problem(1, 4, 4, 16, 64, 16, 16, "float32"))
    assert _names(options)[:2] == ["small_q[splits=8]", "math"]
    assert _names(measured_candidates(options, CUDA, GPU_PREFILL)) == [
        "sdpa_default", "small_q[splits=8]", "math", "sdpa_flash"]
    assert _names(measured_candidates(options, CPU, GPU_PREFILL)) == [  # and each family of ours
        "sdpa_default", "small_q[splits=8]", "math", "chunked[q=128,kv=1024]"]


def test_decode_on_a_gpu_measures_only_a_pick_that_displaced_the_default(monkeypatch):
    options = _options(monkeypatch, ["math", "sdpa_default"])
    decode = Problem(1, 4, 4, 1, 64, 16, 16, "float16", device_type="cuda")
    assert _names(measured_candidates(options, CUDA, decode)) == ["sdpa_default", "math"]
    assert measured_candidates(options[::-1], CUDA, decode) == ()


def test_decode_on_a_gpu_without_its_own_table_measures_like_any_shape(monkeypatch):
    """Ranked by the prior or another card's table, a GPU decode bucket measures the ranking's first two and flash."""
    options = _options(monkeypatch, ["sdpa_default", "small_q[splits=8]", "math", "chunked[q=128,kv=1024]", "sdpa_flash"])
    decode = Problem(1, 4, 4, 1, 64, 16, 16, "float16", device_type="cuda")
    assert measured_candidates(options, CUDA, decode) == ()
    assert _names(measured_candidates(options, CUDA, decode, own_table=False)) == [
        "sdpa_default", "small_q[splits=8]", "math", "sdpa_flash"]


def test_where_the_default_sets_up_per_shape_flash_or_a_set_up_free_option_is_measured(monkeypatch):
    options = _options(monkeypatch, ["sdpa_default", "small_q[splits=8]", "math", "sdpa_flash"])
    decode = Problem(1, 4, 4, 1, 64, 16, 16, "float16", device_type="cuda")
    assert measured_candidates(options, CUDA, decode) == ()
    setup = {"sdpa_default": 1.0}  # PyTorch's default sets up per shape
    assert _names(measured_candidates(options, CUDA, decode, setup_s=setup)) == ["sdpa_default", "sdpa_flash"]
    no_flash = tuple(o for o in options if o.kernel.name != "sdpa_flash")
    assert _names(measured_candidates(no_flash, CUDA, decode, setup_s=setup)) == ["sdpa_default", "small_q[splits=8]"]


def test_the_portable_set_measures_its_rankings_choices_first_one_as_baseline(monkeypatch):
    options = _options(monkeypatch, ["small_q[splits=8]", "chunked[q=128,kv=1024]", "math"], kernels="portable")
    assert not any(o.kernel.name == "sdpa_default" and not getattr(o.kernel, "last_resort", False) for o in options)
    picked = measured_candidates(options, CUDA, GPU_PREFILL, portable=True)
    assert _names(picked)[:3] == _names(options)[:3] and picked[0] is options[0]


def test_on_a_cpu_each_family_of_ours_is_measured_once(monkeypatch):
    options = _options(monkeypatch, ["sdpa_default", "sdpa_flash", "convert[contiguous]+sdpa_flash", "small_q[splits=8]",
                                     "chunked[q=128,kv=1024]", "small_q[splits=1]", "math"])
    assert _names(measured_candidates(options, CPU, DECODE)) == [
        "sdpa_default", "sdpa_flash", "small_q[splits=8]", "chunked[q=128,kv=1024]", "math"]
    names = ("sdpa_default", "convert[fp32->bf16]+sdpa_flash", "convert[fp32->bf16]+math", "math", "small_q[splits=1]")
    options = [Option(kernel_from_name(name), 1e-3, 0) for name in names]
    own = own_family_options(options, options[:2])  # a conversion counts as its inner kernel's family
    assert _names(own) == ["convert[fp32->bf16]+math", "small_q[splits=1]"]


def test_one_candidate_alone_is_nothing_to_measure(monkeypatch):
    options = _options(monkeypatch, ["sdpa_default"])
    assert measured_candidates(options, CPU, DECODE) == ()


@pytest.mark.parametrize(("level", "entry_decides", "wanted"), [
    ("exact", True, False), ("model", True, False),  # a measured entry of this card decides
    ("exact", False, True), ("prior", False, True),
    ("family", True, True),  # another card's entry, scaled: measured here all the same
])
def test_a_bucket_measures_unless_an_entry_of_this_card_decides_it(level, entry_decides, wanted):
    assert measuring_wanted(CPU, entry_decides=entry_decides, level=level) is wanted
    assert not measuring_wanted(torch.device("meta"), entry_decides=False, level=level)  # no clock reads it


def test_a_tied_entry_leaves_the_bucket_to_be_measured_and_explain_says_why(monkeypatch):
    """A measured entry whose winner, PyTorch's default, only ties a faster kernel (their spreads
    overlap) does not decide: the bucket measures as one with no entry."""
    from attn_dispatch.models.measured import MeasuredEntry, MeasuredTime, entry_key

    class WithEntry(FixedRanker):
        def measured_entry(self, problem):
            times = (MeasuredTime("math", 2.4e-5, 2.2e-5, 4.5e-5, 20),
                     MeasuredTime("sdpa_default", 3.0e-5, 2.9e-5, 3.1e-5, 20))
            return MeasuredEntry(entry_key(problem), problem.batch, problem.q_len, problem.kv_len, times)

    use_ranking(monkeypatch, WithEntry(["sdpa_default", "math"]))
    ours = Dispatcher(kernels=["sdpa_default", "math"])
    inputs = qkv(q_len=8, kv_len=60)
    ours.attention(**inputs)
    decision = ours.explain(**inputs)
    assert any("only by a tie" in note for note in decision.notes)
    assert any(note.startswith("measurement pending") for note in decision.notes)

