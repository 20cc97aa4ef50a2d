"""Which problems a calibration measures, in which order: the sweep (a fixed, seeded sample ordered
cheapest first within each round). Every plan is published once through the shared storage (the first worker's
wins; a resumed run reloads it), so all workers follow the same one.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from optuna.storages import BaseStorage

from attn_dispatch.calibration.candidates import CostEstimator
from attn_dispatch.calibration.claims import publish_once, published
from attn_dispatch.calibration.results import study_name
from attn_dispatch.kernels.base import Kernel
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
    total = sum(shares)
    edges = list(itertools.accumulate(share / total for share in shares))
    return min(bisect.bisect_right(edges, u), len(shares) - 1)


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
    # Imported where the sweep samples: a calibration refused as busy never imports it.
    from scipy.stats import qmc

    count = profile.problems if count is None else count
    sampler = qmc.Halton(d=len(DIMENSIONS), scramble=True, seed=seed)
    return list(dict.fromkeys(
        fit_problem(_point(u, profile, device_type), memory_bytes=memory_bytes,
                    fraction=profile.input_memory_fraction, max_fastest_s=profile.max_fastest_s,
                    fastest_s=fastest_s)
        for u in sampler.random(count)
    ))


WORKLOAD_FORMAT = 1


def read_workload(path: str | os.PathLike) -> list[Problem]:
    """The recorded problems, one per bucket, in recording order. Raises FileNotFoundError (no
    such file) or ValueError (naming a line that is not a workload line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--workload {path}: no such file; record one with ATTN_DISPATCH_RECORD={path}")
    problems, seen = [], set()
    with open(path, encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                entry = json.loads(text)
                if not isinstance(entry, dict) or entry.get("format") != WORKLOAD_FORMAT or "bucket" not in entry:
                    raise ValueError(f"not a format-{WORKLOAD_FORMAT} workload line")
                problem = Problem.from_dict(entry.get("problem"))
            except ValueError as error:
                raise ValueError(f"--workload {path}, line {number}: {error}; delete the line or record the workload again") from None
            key = json.dumps(entry["bucket"])
            if key not in seen:
                seen.add(key)
                problems.append(problem)
    return problems


def for_device(problems: list[Problem], device_type: str) -> list[Problem]:
    """The problems as this device measures them: its device type, inputs that do not broadcast
    (the same kernel work); duplicates dropped, order kept."""
    return list(dict.fromkeys(replace(p, device_type=device_type, broadcast_inputs=False) for p in problems))


# Problems per round: each round is a contiguous slice of the space-filling sample (so a run cut
# short has covered the space) and is measured cheapest first.
ROUND_SIZE = 16


def problem_cost(problem: Problem, kernels: list[Kernel], estimator: CostEstimator, point_budget_s: float) -> float:
    """Predicted seconds to decide `problem`: its supported kernels' predictions, each capped at the
    per-point budget (unknown predictions count as one budget)."""
    total = 0.0  # added in order (Python 3.12's `sum` rounds floats differently)
    for kernel in kernels:
        if not kernel.reasons(problem):
            guess = estimator.seconds(problem, kernel)
            total += min(guess, point_budget_s) if math.isfinite(guess) else point_budget_s
    return total


def order_rounds(problems: list[Problem], cost) -> list[Problem]:
    """Sample order kept between rounds of `ROUND_SIZE`; cheapest first inside each round."""
    ordered = []
    for start in range(0, len(problems), ROUND_SIZE):
        ordered += sorted(problems[start:start + ROUND_SIZE], key=cost)
    return ordered


def build_sweep(profile: SpaceProfile, *, kernels: list[Kernel], estimator: CostEstimator, device_type: str,
                memory_bytes: int, point_budget_s: float, seed: int, count: int | None) -> list[Problem]:
    """The first sweep's problems, ordered (see module docstring)."""
    problems = sample_problems(profile, device_type=device_type, memory_bytes=memory_bytes, seed=seed, count=count,
                               fastest_s=lambda p: estimator.fastest(p, kernels))
    return order_rounds(problems, lambda p: problem_cost(p, kernels, estimator, point_budget_s))


def plan_name(calibration_id: str, stage: str) -> str:
    return study_name(calibration_id, "plan", stage)


def agree_on(storage: BaseStorage, calibration_id: str, stage: str, problems: list[Problem]) -> list[Problem]:
    """Publish `problems` as stage `stage`'s plan unless one is there; return the agreed plan."""
    value = publish_once(storage, plan_name(calibration_id, stage), {"problems": [p.to_dict() for p in problems]})
    return [Problem.from_dict(p) for p in value["problems"]]


def agreed(storage: BaseStorage, calibration_id: str, stage: str) -> list[Problem] | None:
    """Stage `stage`'s plan if one was published."""
    value = published(storage, plan_name(calibration_id, stage))
    return None if value is None else [Problem.from_dict(p) for p in value["problems"]]
