"""The problem space calibration samples, and a seeded, space-filling sample of it.

Dimensions: query and KV length (log-spaced), head dim, dtype, query heads and GQA ratio, causal,
mask kind, batch, and the layout (contiguous or a transposed ``[B, L, H, D]`` view). A scrambled
Halton sequence gives the points, so every prefix of the sample covers the space evenly. Each point
is shrunk (batch, heads, lengths) until its inputs fit the memory cap and its fastest kernel's
predicted time fits the per-problem cap; the same seed and caps give the same sample everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np
from scipy.stats import qmc

from attn_dispatch.kernels.problem import Problem

# Sequence lengths above `EXACT_BELOW` are rounded to a multiple of `LENGTH_MULTIPLE`.
LENGTH_MULTIPLE = 8
EXACT_BELOW = 64
MIN_KV_LEN = 16  # the shortest KV length sampled, and where shrinking stops
MIN_SHRINK_LENGTH = MIN_KV_LEN
# Scrambled Halton dimensions, in order (`_point` reads them by index).
DIMENSIONS = ("scenario", "q_len", "kv_len", "head_dim", "dtype", "heads", "gqa", "causal", "mask", "batch", "layout")


@dataclass(frozen=True)
class SpaceProfile:
    """The ranges and shares of one kind of calibration (quick or full, CPU or GPU): `problems`
    in the first sweep; `self_share` of self-attention points, `causal_share` of those causal;
    `mask_shares` of no, bool and float masks (``[batch, 1, L, S]``; never with causal);
    `strided_share` of transposed views; one point's inputs use at most `input_memory_fraction` of
    the memory and its fastest kernel's predicted time at most `max_fastest_s`."""

    name: str
    problems: int
    max_q_len: int
    max_kv_len: int
    head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]
    q_heads: tuple[int, ...]
    gqa_ratios: tuple[int, ...]
    batches: tuple[int, ...]
    self_share: float
    causal_share: float
    mask_shares: tuple[float, float, float]
    strided_share: float
    input_memory_fraction: float
    max_fastest_s: float

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SpaceProfile:
        tuples = {k: tuple(v) for k, v in data.items() if isinstance(v, list)}
        return cls(**{**data, **tuples})


ALL_HEAD_DIMS = (64, 80, 96, 128, 256)
ALL_DTYPES = ("float16", "bfloat16", "float32")
INPUT_MEMORY_FRACTION = 0.25
FULL_GPU = SpaceProfile(
    name="full-gpu", problems=160, max_q_len=65536, max_kv_len=131072, head_dims=ALL_HEAD_DIMS,
    dtypes=ALL_DTYPES, q_heads=(8, 16, 32), gqa_ratios=(1, 2, 4, 8), batches=(1, 2, 4, 8),
    self_share=0.35, causal_share=0.6, mask_shares=(0.6, 0.2, 0.2), strided_share=0.2,
    input_memory_fraction=INPUT_MEMORY_FRACTION, max_fastest_s=0.02,
)
QUICK_GPU = replace(FULL_GPU, name="quick-gpu", problems=40, max_fastest_s=0.005)
FULL_CPU = replace(
    FULL_GPU, name="full-cpu", problems=80, max_q_len=4096, max_kv_len=16384, q_heads=(4, 8, 16),
    batches=(1, 2, 4), max_fastest_s=0.05,
)
QUICK_CPU = replace(
    FULL_CPU, name="quick-cpu", problems=36, max_q_len=1024, max_kv_len=4096, head_dims=(64, 128),
    q_heads=(4, 8), gqa_ratios=(1, 4), batches=(1, 2), max_fastest_s=0.01,
)


def profile_for(device_type: str, *, quick: bool) -> SpaceProfile:
    """The profile a device type gets (ROCm devices are "cuda" devices)."""
    if device_type == "cpu":
        return QUICK_CPU if quick else FULL_CPU
    return QUICK_GPU if quick else FULL_GPU


def _pick(options: tuple, u: float):
    return options[min(int(u * len(options)), len(options) - 1)]


def _share(shares: tuple[float, ...], u: float) -> int:
    """Index of the share interval `u` falls into."""
    total, edge = sum(shares), 0.0
    for index, share in enumerate(shares):
        edge += share / total
        if u < edge:
            return index
    return len(shares) - 1


def _length(u: float, top: int, bottom: int = 1) -> int:
    """Log-uniform length in [bottom, top]."""
    value = int(round(2 ** (math.log2(bottom) + u * math.log2(top / bottom))))
    if value > EXACT_BELOW:
        value = int(round(value / LENGTH_MULTIPLE)) * LENGTH_MULTIPLE
    return max(bottom, min(top, value))


def _point(u: np.ndarray, profile: SpaceProfile, device_type: str) -> Problem:
    self_attention = bool(u[0] < profile.self_share)
    q_len = _length(u[1], profile.max_q_len, MIN_KV_LEN if self_attention else 1)
    kv_len = q_len if self_attention else _length(u[2], profile.max_kv_len, MIN_KV_LEN)
    head_dim = _pick(profile.head_dims, u[3])
    q_heads = _pick(profile.q_heads, u[5])
    ratio = min(_pick(profile.gqa_ratios, u[6]), q_heads)
    causal = self_attention and bool(u[7] < profile.causal_share)
    mask_kind = "none" if causal else ("none", "bool", "float")[_share(profile.mask_shares, u[8])]
    batch = _pick(profile.batches, u[9])
    return Problem(
        batch=batch, q_heads=q_heads, kv_heads=q_heads // ratio, q_len=q_len, kv_len=kv_len,
        head_dim=head_dim, value_dim=head_dim, dtype=_pick(profile.dtypes, u[4]), causal=causal,
        mask_kind=mask_kind, mask_shape=(batch, 1, q_len, kv_len) if mask_kind != "none" else (),
        device_type=device_type, strided=bool(u[10] < profile.strided_share),
    )


def resized(problem: Problem, **changes) -> Problem:
    """`problem` with `changes`, its mask (calibration masks are [B, 1, L, S]) resized to match."""
    new = replace(problem, **changes)
    if new.mask_shape:
        new = replace(new, mask_shape=(new.batch, 1, new.q_len, new.kv_len))
    return new


def shrink_step(problem: Problem) -> Problem | None:
    """One step smaller: halve the batch, else the heads (keeping the GQA ratio), else the longer
    length (both, for self-attention). None when nothing can shrink."""
    if problem.batch > 1:
        return resized(problem, batch=problem.batch // 2)
    if problem.kv_heads > 1 and problem.q_heads > 1:
        return resized(problem, q_heads=problem.q_heads // 2, kv_heads=problem.kv_heads // 2)
    if problem.q_len == problem.kv_len and problem.q_len > MIN_SHRINK_LENGTH:
        length = max(MIN_SHRINK_LENGTH, _round_length(problem.q_len // 2))
        return resized(problem, q_len=length, kv_len=length)
    if max(problem.q_len, problem.kv_len) > MIN_SHRINK_LENGTH:
        if problem.kv_len >= problem.q_len:
            return resized(problem, kv_len=max(MIN_SHRINK_LENGTH, _round_length(problem.kv_len // 2)))
        return resized(problem, q_len=max(MIN_SHRINK_LENGTH, _round_length(problem.q_len // 2)))
    return None


def _round_length(value: int) -> int:
    return value if value <= EXACT_BELOW else max(LENGTH_MULTIPLE, value // LENGTH_MULTIPLE * LENGTH_MULTIPLE)


def fit_problem(problem: Problem, *, memory_bytes: int, fraction: float, max_fastest_s: float,
                fastest_s: Callable[[Problem], float]) -> Problem:
    """Shrink `problem` until its inputs fit ``fraction * memory_bytes`` and ``fastest_s(problem)``
    is at most `max_fastest_s`."""
    while problem.input_bytes > fraction * memory_bytes or fastest_s(problem) > max_fastest_s:
        smaller = shrink_step(problem)
        if smaller is None:
            break
        problem = smaller
    return problem


def sample_problems(profile: SpaceProfile, *, device_type: str, memory_bytes: int,
                    fastest_s: Callable[[Problem], float], seed: int = 0, count: int | None = None) -> list[Problem]:
    """The first `count` (default ``profile.problems``) points of the seeded sample, fitted to the
    card, duplicates removed, in sample order (each prefix covers the space)."""
    count = profile.problems if count is None else count
    sampler = qmc.Halton(d=len(DIMENSIONS), scramble=True, seed=seed)
    problems: list[Problem] = []
    seen: set[Problem] = set()
    for u in sampler.random(count):
        problem = fit_problem(
            _point(u, profile, device_type), memory_bytes=memory_bytes,
            fraction=profile.input_memory_fraction, max_fastest_s=profile.max_fastest_s, fastest_s=fastest_s,
        )
        if problem not in seen:
            seen.add(problem)
            problems.append(problem)
    return problems
