"""`explain` on gfx906 with bf16 inputs says what ``convert[bf16->fp16]`` would gain there (fp16 runs
at the card's dot2 rate, bf16 2.7x slower), predicted by the prior and labelled so, while the
conversion stays off (fp16's range); elsewhere, or once allowed, it says nothing of the kind."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher.decision import lossy_gain_note
from attn_dispatch.kernels import AccuracyPolicy, Problem
from attn_dispatch.models.identity import H200
from tests.dispatcher.helpers import fake_gfx906

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="fakes a gfx906 card: off any real GPU only")

WAN_LIKE = Problem(1, 40, 40, 4096, 4096, 128, 128, "bfloat16", device_type="cuda")


@pytest.fixture
def gfx906(monkeypatch):
    fake_gfx906(monkeypatch, triton=(3, 8))


def test_explain_on_gfx906_says_what_bf16_to_fp16_would_gain(gfx906):
    decision = Dispatcher(kernels="portable", measure=False).decide(WAN_LIKE, device="cuda:0")
    (note,) = [n for n in decision.notes if "would take" in n]
    assert note.startswith("convert[bf16->fp16]+triton_flash[bm=64,bn=32,w=4,s=2] would take")
    assert f"for {decision.kernel}," in note
    assert "predicted by the analytic prior of AMD Instinct MI50 32GB, unmeasured" in note
    assert "--allow-lossy bf16->fp16" in note and "65504" in note
    gain = float(note.split("x faster")[0].rsplit(" ", 1)[1])
    assert gain > 1.25
    assert any(name.startswith("convert[bf16->fp16]+triton_flash") for name, _ in decision.dropped)  # still off


def test_once_allowed_the_conversion_is_a_candidate_and_no_note_is_needed(gfx906):
    allowed = Dispatcher(kernels="portable", policy=AccuracyPolicy.allowing("bf16->fp16"), measure=False)
    decision = allowed.decide(WAN_LIKE, device="cuda:0")
    assert decision.kernel == "convert[bf16->fp16]+triton_flash[bm=64,bn=32,w=4,s=2]"
    assert not [n for n in decision.notes if "would take" in n]


def test_no_note_where_fp16_gains_nothing(gfx906):
    fp16 = Dispatcher(kernels="portable", measure=False).decide(
        Problem(1, 40, 40, 4096, 4096, 128, 128, "float16", device_type="cuda"), device="cuda:0")
    assert not [n for n in fp16.notes if "would take" in n]
    on_h200 = lossy_gain_note(fp16, H200, AccuracyPolicy())  # the H200 runs bf16 and fp16 at one rate
    assert on_h200 is None
