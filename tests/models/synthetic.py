"""A synthetic data set with a known answer: times from an analytic function the prior gets
wrong in specific ways (slower memory, dearer launches, a cache bonus for small score matrices,
a per-block penalty for small chunks), plus log-normal timing noise."""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from attn_dispatch.kernels import Problem
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.priors import kernel_named, prior_seconds
from attn_dispatch.models.probe_store import FALLBACK_CPU_SPEC

SYNTHETIC_KERNELS = (
    "math", "chunked[q=64,kv=512]", "chunked[q=256,kv=2048]", "chunked[q=1024,kv=8192]",
    "small_q[splits=1]", "small_q[splits=8]", "small_q[splits=32]",
    "convert[bf16->fp32]+chunked[q=256,kv=2048]", "convert[bf16->fp32]+small_q[splits=8]",
)
# The "true" card: half the memory bandwidth, 3x the launch cost and a third of the bf16 rate.
TRUE_SPEC = replace(
    FALLBACK_CPU_SPEC, bandwidth=FALLBACK_CPU_SPEC.bandwidth / 2,
    launch_overhead_s=FALLBACK_CPU_SPEC.launch_overhead_s * 3,
    matrix_flops=MappingProxyType({**FALLBACK_CPU_SPEC.matrix_flops, "bfloat16": FALLBACK_CPU_SPEC.matrix_flops["bfloat16"] / 3}),
)
CACHE_BYTES = 2**20


def true_seconds(problem: Problem, name: str) -> float:
    """The known analytic time of a kernel on a problem."""
    kernel = kernel_named(name)
    seconds = prior_seconds(problem, kernel, TRUE_SPEC)
    if problem.score_elements * 4 < CACHE_BYTES and "math" in name:
        seconds *= 0.6  # small score matrices stay in cache
    if "q=64," in name:
        seconds *= 1.0 + 0.1 * math.log2(max(problem.q_len, 1))  # small chunks pay per block
    if "splits=32" in name and problem.kv_len < 1024:
        seconds *= 1.3  # too many splits for a short cache
    return seconds


def synthetic_problems(count: int, seed: int, device_type: str = "cpu") -> list[Problem]:
    rng = np.random.default_rng(seed)
    problems = []
    while len(problems) < count:
        kv_len = int(2 ** rng.uniform(6, 14))
        q_len = int(rng.choice([1, 2, 8, 32, int(2 ** rng.uniform(6, 11)), kv_len]))
        kv_heads = int(rng.choice([1, 2, 4, 8]))
        q_heads = kv_heads * int(rng.choice([1, 2, 4]))
        batch = int(rng.choice([1, 2, 4]))
        if batch * q_heads * q_len * kv_len > 1 << 24:
            continue
        dtype = str(rng.choice(["float32", "bfloat16"]))
        causal = bool(q_len == kv_len and rng.random() < 0.7)
        head_dim = int(rng.choice([64, 128]))
        problems.append(Problem(batch, q_heads, kv_heads, q_len, kv_len, head_dim, head_dim, dtype, causal,
                                device_type=device_type))
    return problems


def synthetic_measurements(
    count: int, *, seed: int = 0, noise: float = 0.03, device_type: str = "cpu"
) -> list[Measurement]:
    """`count` problems x every supported synthetic kernel, timed by `true_seconds` x noise."""
    rng = np.random.default_rng(seed + 1)
    points = []
    for problem in synthetic_problems(count, seed, device_type):
        for name in SYNTHETIC_KERNELS:
            if kernel_named(name).reasons(problem):
                continue
            seconds = true_seconds(problem, name) * math.exp(rng.normal(0.0, noise))
            points.append(Measurement(problem, name, median_s=seconds, iqr_s=seconds * noise, reps=10))
    return points
