"""Test doubles: a ranker with a fixed order, and kernels that fail on purpose."""

from __future__ import annotations

import torch

from attn_dispatch.dispatcher import cold_path
from attn_dispatch.dispatcher.decision import RankingSource
from attn_dispatch.dispatcher.device_ranking import DeviceRanking
from attn_dispatch.kernels import (
    TOLERANCES,
    Kernel,
    MathKernel,
    Problem,
    reference_attention,
    relative_errors,
)

TEST_SOURCE = RankingSource("exact", "test table (fixed order)", "<test>", "test-device")
PRIOR_SOURCE = RankingSource("prior", "test prior", None, "test-device")


class FixedRanker:
    """Ranks the supported kernels among `order` in that order (1 us, 2 us, ...)."""

    def __init__(self, order: list[str]) -> None:
        self.order = order
        self.calls = 0

    def rank(self, problem: Problem, kernels: list[Kernel]) -> list[tuple[str, float]]:
        self.calls += 1
        return [(name, 1e-6 * (i + 1)) for i, name in enumerate(self.order)]


class BrokenRanker:
    """A table whose `rank` raises (a corrupt file that passed loading)."""

    def rank(self, problem, kernels):
        raise KeyError("bucket missing from table")


def use_ranking(monkeypatch, table, prior=None) -> None:
    """Make every new device state of every dispatcher rank with `table` (then `prior`)."""

    def resolve(device, *, home=None):
        return DeviceRanking(table=table, prior=prior, source=TEST_SOURCE, prior_source=PRIOR_SOURCE)

    monkeypatch.setattr(cold_path, "resolve_ranking", resolve)


class FailingKernel(MathKernel):
    """The math kernel's capabilities, but `run` raises `error` (and counts its attempts)."""

    family = "failing"

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error if error is not None else RuntimeError("injected failure: unsupported case")
        self.attempts = 0

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem):
        self.attempts += 1
        raise self.error


def assert_matches_reference(out: torch.Tensor, inputs: dict) -> None:
    """`out` is SDPA's answer for `inputs` within the dtype's tolerance."""
    reference = reference_attention(**inputs)
    assert out.shape == reference.shape and out.dtype == inputs["query"].dtype
    rel_l2, rel_max = relative_errors(out, reference)
    tolerance = TOLERANCES[str(inputs["query"].dtype).removeprefix("torch.")]
    assert tolerance.accepts(rel_l2, rel_max), f"relative error {rel_l2:.2e} / {rel_max:.2e} over {tolerance}"


def qkv(batch=1, heads=4, kv_heads=2, q_len=8, kv_len=8, dim=16, dtype=torch.float32, seed=0) -> dict:
    """Random SDPA inputs (GQA when kv_heads < heads)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "query": torch.randn(batch, heads, q_len, dim, generator=generator, dtype=dtype),
        "key": torch.randn(batch, kv_heads, kv_len, dim, generator=generator, dtype=dtype),
        "value": torch.randn(batch, kv_heads, kv_len, dim, generator=generator, dtype=dtype),
        "enable_gqa": heads != kv_heads,
    }


GFX906_LDS = 64 * 1024
"""Shared memory (LDS) one program may use on a gfx906 card."""


def fake_gfx906(monkeypatch, *, triton: tuple[int, int] | None) -> None:
    """Make ``cuda:0`` a faked MI50 32GB on ROCm (its properties as tests/models/conftest.py fakes
    them) with Triton `triton` (None: not installed), ranked by its analytic prior, 32 GiB free;
    Triton's interpreter off, as on the card (the kernel sets that serve leave interpreted kernels
    out). For deciding only: nothing can run there."""
    from attn_dispatch.dispatcher import device_planner as planner
    from attn_dispatch.dispatcher.decision import RankingSource
    from attn_dispatch.kernels import _triton_support as support
    from attn_dispatch.kernels import base, triton_decode, triton_flash
    from attn_dispatch.models.identity import MI50_32GB, DeviceIdentity
    from attn_dispatch.models.priors import PriorRanker
    from tests.models.conftest import fake_identity

    monkeypatch.setenv(base.INTERPRETER_VARIABLE, "0")
    identity = fake_identity("mi50_32")
    monkeypatch.setattr(DeviceIdentity, "detect", classmethod(lambda cls, device: identity))
    monkeypatch.setattr(support, "gpu_architecture", lambda device_index=None: ("gfx906", (9, 0)))
    monkeypatch.setattr(support, "triton_version", lambda: triton)
    monkeypatch.setattr(support.torch.version, "hip", "6.2")
    for module in (triton_flash, triton_decode):
        monkeypatch.setattr(module, "shared_memory_limit", lambda device_index=None: GFX906_LDS)
    monkeypatch.setattr(planner, "free_bytes", lambda device: 32 * 2**30)
    source = RankingSource("prior", "analytic prior of AMD Instinct MI50 32GB", None, identity.key)
    monkeypatch.setattr(cold_path, "resolve_ranking", lambda device, *, home=None, **options: DeviceRanking(
        table=None, prior=PriorRanker(MI50_32GB), source=source, prior_source=source))
