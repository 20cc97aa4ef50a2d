"""Problem classes and log2 length buckets: the keys of a threshold table's decision map.

A problem's class is what changes which kernel wins at a given size: always its dtype, causality
and mask kind, and, as a table chooses (``class_fields``), its head dim, GQA ratio and a coarse
work size ``log2(batch * q_heads)``. A field a table does not split on is 0 ("any") in its keys;
the table then carries times from its representative problem to the actual one by the prior's
ratio. Within a class, a bucket is ``(ceil(log2 Lq), ceil(log2 Lk))``: bucket ``b`` holds lengths
in ``(2^(b-1), 2^b]`` and is represented by the length ``2^b``. (The dispatcher caches its
decisions per exact call shape; only the kernels that failed at run time are remembered per
length bucket, `dispatcher.selection.failure_bucket`.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attn_dispatch.kernels.problem import Problem

OPTIONAL_FIELDS = ("head_dim", "gqa_ratio", "work")
# Which optional fields tables split on by default: none. A calibration sweep samples ~100-160
# problems over ~1000 (dtype, causal, mask, head dim, GQA, work) combinations, so finer classes
# hold one measured problem each; held-out table evaluation (tests/models/test_fit.py) found the
# coarse classes with prior-ratio transfer as good, and tables 10-50x smaller.
DEFAULT_CLASS_FIELDS: tuple[str, ...] = ()
# Work-size buckets are this many powers of two wide when "work" is a class field (2: 1, 4, 16,
# 64, ... rows x heads).
WORK_STEP = 2


def length_bucket(length: int) -> int:
    """``ceil(log2(length))``; 0 for lengths 0 and 1."""
    return 0 if length <= 1 else math.ceil(math.log2(length))


def work_bucket(problem: Problem, *, step: int = WORK_STEP) -> int:
    """``log2(batch * q_heads)`` rounded up to a multiple of `step` (0 when step is 0)."""
    if step <= 0:
        return 0
    return step * math.ceil(length_bucket(problem.batch * problem.q_heads) / step)


@dataclass(frozen=True, order=True)
class ClassKey:
    """What a table's decision map is split by (0 in an optional field: any value)."""

    dtype: str
    causal: bool
    mask_kind: str
    head_dim: int = 0
    gqa_ratio: int = 0
    work_log2: int = 0

    def describe(self) -> str:
        parts = [self.dtype, "causal" if self.causal else "non-causal", f"mask {self.mask_kind}"]
        if self.head_dim:
            parts.append(f"head dim {self.head_dim}")
        if self.gqa_ratio:
            parts.append(f"GQA {self.gqa_ratio}")
        if self.work_log2:
            parts.append(f"batch x heads ~2^{self.work_log2}")
        return ", ".join(parts)

    def base(self) -> tuple[str, bool, str]:
        """The fields every table splits on."""
        return (self.dtype, self.causal, self.mask_kind)

    def distance(self, other: ClassKey, *, work_step: int) -> float:
        """How far apart two classes of one base are (log2 head dim, log2 GQA, and work buckets of
        `work_step` powers of two: the table's)."""
        return (
            abs(math.log2(max(self.head_dim, 1)) - math.log2(max(other.head_dim, 1)))
            + abs(math.log2(max(self.gqa_ratio, 1)) - math.log2(max(other.gqa_ratio, 1)))
            + abs(self.work_log2 - other.work_log2) / max(work_step, 1)
        )


def check_class_fields(fields: tuple[str, ...]) -> tuple[str, ...]:
    unknown = set(fields) - set(OPTIONAL_FIELDS)
    if unknown:
        raise ValueError(f"unknown class fields {sorted(unknown)}: choose among {OPTIONAL_FIELDS}")
    return tuple(f for f in OPTIONAL_FIELDS if f in fields)


def class_key(
    problem: Problem, *, fields: tuple[str, ...] = DEFAULT_CLASS_FIELDS, work_step: int = WORK_STEP
) -> ClassKey:
    """The class of `problem` in a table that splits on `fields`."""
    return ClassKey(
        problem.dtype, problem.causal, problem.mask_kind,
        head_dim=problem.head_dim if "head_dim" in fields else 0,
        gqa_ratio=problem.gqa_ratio if "gqa_ratio" in fields else 0,
        work_log2=work_bucket(problem, step=work_step) if "work" in fields else 0,
    )


def bucket_of(problem: Problem) -> tuple[int, int]:
    """``(q bucket, kv bucket)`` of a problem."""
    return length_bucket(problem.q_len), length_bucket(problem.kv_len)
