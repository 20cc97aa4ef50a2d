"""The problem sample: seeded and identical on every call, space-filling prefixes, fitted to the
card's memory and the time cap, covering the categorical dimensions."""

from __future__ import annotations

from dataclasses import replace

from attn_dispatch.calibration.plan import FULL_GPU, QUICK_CPU, fit_problem, sample_problems
from tests.calibration.helpers import problem

GIB = 2**30


def _flops_time(p):  # a stand-in for the prior: 10 TFLOP/s
    return p.flops / 1e13


def test_same_seed_same_sample_and_prefix_property():
    a = sample_problems(FULL_GPU, device_type="cuda", memory_bytes=16 * GIB, fastest_s=_flops_time, seed=3, count=40)
    b = sample_problems(FULL_GPU, device_type="cuda", memory_bytes=16 * GIB, fastest_s=_flops_time, seed=3, count=40)
    c = sample_problems(FULL_GPU, device_type="cuda", memory_bytes=16 * GIB, fastest_s=_flops_time, seed=4, count=40)
    assert a == b and a != c
    prefix = sample_problems(FULL_GPU, device_type="cuda", memory_bytes=16 * GIB, fastest_s=_flops_time, seed=3, count=10)
    assert prefix == a[: len(prefix)]


def test_caps_and_coverage():
    memory = 16 * GIB
    sample = sample_problems(FULL_GPU, device_type="cuda", memory_bytes=memory, fastest_s=_flops_time, seed=0, count=120)
    assert len(sample) > 100
    for p in sample:
        assert p.input_bytes <= FULL_GPU.input_memory_fraction * memory
        assert p.q_len <= FULL_GPU.max_q_len and 16 <= p.kv_len <= FULL_GPU.max_kv_len
        assert not (p.causal and p.mask_kind != "none")
        assert p.device_type == "cuda"
    assert {p.dtype for p in sample} == set(FULL_GPU.dtypes)
    assert {p.head_dim for p in sample} == set(FULL_GPU.head_dims)
    assert {p.mask_kind for p in sample} == {"none", "bool", "float"}
    assert any(p.causal for p in sample) and any(p.strided for p in sample)
    assert any(p.q_len == 1 for p in sample) and max(p.kv_len for p in sample) >= 16384
    assert {p.gqa_ratio for p in sample} >= {1, 2, 4, 8}


def test_fit_problem_shrinks_batch_then_heads_then_lengths():
    big = problem(q_len=8192, kv_len=8192, batch=8, q_heads=32, kv_heads=8, mask_kind="bool", mask_shape=(8, 1, 8192, 8192))
    small = fit_problem(big, memory_bytes=GIB, fraction=0.25, max_fastest_s=1e-3, fastest_s=_flops_time)
    assert small.batch == 1 and small.gqa_ratio == big.gqa_ratio
    assert small.input_bytes <= 0.25 * GIB and _flops_time(small) <= 1e-3
    assert small.mask_shape == (1, 1, small.q_len, small.kv_len)


def test_quick_cpu_profile_is_small():
    sample = sample_problems(QUICK_CPU, device_type="cpu", memory_bytes=8 * GIB, fastest_s=_flops_time, seed=0)
    assert len(sample) <= QUICK_CPU.problems
    assert all(p.q_len <= QUICK_CPU.max_q_len and p.kv_len <= QUICK_CPU.max_kv_len for p in sample)
    assert replace(QUICK_CPU, problems=3).problems == 3
