"""Portable mode (`portable_kernels`, ``--kernels portable``: what a gfx906 owner has) includes the
Triton kernels where Triton can compile for the card and falls back to the portable PyTorch kernels
where it cannot (no Triton, or one older than 3.8 on gfx906), with the reason in `explain`."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.calibration.candidates import kernel_set
from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.kernels import AccuracyPolicy, Problem, base, portable_kernels
from attn_dispatch.kernels.registry import TRITON_FAMILIES, working_family
from tests.dispatcher.helpers import fake_gfx906

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="fakes a gfx906 card: off any real GPU only")

VIDEO = Problem(1, 24, 24, 8192, 8192, 64, 64, "float16", device_type="cuda")
DECODE = Problem(8, 32, 8, 1, 32768, 128, 128, "float16", device_type="cuda")
PORTABLE_FAMILIES = ("math", "chunked", "small_q")


def triton_names(names) -> set[str]:
    return {name for name in names if name.split("[")[0] in TRITON_FAMILIES}


def test_the_portable_set_holds_the_triton_kernels():
    names = [kernel.name for kernel in portable_kernels()]
    assert {working_family(k) for k in portable_kernels()} >= {*TRITON_FAMILIES, *PORTABLE_FAMILIES}
    assert not any(name.startswith("sdpa_") or "+sdpa_" in name for name in names)
    assert "convert[bf16->fp16]+triton_flash[bm=64,bn=32,w=4,s=2]" in names


def test_calibrate_and_bench_portable_time_triton_where_it_compiles(monkeypatch):
    """``--kernels portable`` of calibrate and bench: the Triton kernels, except under Triton's
    interpreter (it gives right answers, never speed: nothing to time)."""
    monkeypatch.setenv(base.INTERPRETER_VARIABLE, "0")
    assert triton_names(k.name for k in kernel_set("portable", policy=AccuracyPolicy()))
    monkeypatch.setenv(base.INTERPRETER_VARIABLE, "1")
    assert not triton_names(k.name for k in kernel_set("portable", policy=AccuracyPolicy()))


@pytest.mark.parametrize("problem", [VIDEO, DECODE], ids=["video", "decode"])
def test_gfx906_with_triton_3_8_offers_the_triton_kernels(monkeypatch, problem):
    fake_gfx906(monkeypatch, triton=(3, 8))
    decision = Dispatcher(kernels="portable", measure=False).decide(problem, device="cuda:0")
    assert triton_names(c.name for c in decision.candidates)
    refused = dict(decision.dropped)
    assert not any("Triton" in refused[name] for name in triton_names(refused))  # only block-size or row limits


@pytest.mark.parametrize(("triton", "why"), [((3, 6), "needs Triton >= 3.8"), (None, "Triton is not installed")])
def test_gfx906_without_a_triton_for_it_falls_back_to_the_portable_kernels(monkeypatch, triton, why):
    fake_gfx906(monkeypatch, triton=triton)
    for problem in (VIDEO, DECODE):
        decision = Dispatcher(kernels="portable", measure=False).decide(problem, device="cuda:0")
        assert not triton_names(c.name for c in decision.candidates)
        assert decision.kernel.split("+")[-1].split("[")[0] in PORTABLE_FAMILIES
        dropped = dict(decision.dropped)
        assert all(why in dropped[name] for name in triton_names(dropped))
        assert "docs/GFX906.md" in dropped["triton_flash[bm=64,bn=32,w=4,s=2]"] or triton is None
