"""Problem classes and log2 length buckets: the keys of a threshold table's decision map.

A problem's class is what changes which kernel wins at a given size (dtype, head dim, causality,
GQA ratio, mask kind, and a coarse work size ``log2(batch * q_heads)``); within a class, a
bucket is ``(ceil(log2 Lq), ceil(log2 Lk))``: bucket ``b`` holds lengths in ``(2^(b-1), 2^b]``
and is represented by the length ``2^b``. The dispatcher caches decisions per (class, bucket).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernels.problem import Problem

# Work-size buckets are this many powers of two wide (2: 1, 4, 16, 64, ... rows x heads). Decode
# and small-Q choices depend on how many (batch x head) rows there are to spread over compute
# units; a factor of 4 between buckets keeps the table small (tests/models/test_table.py).
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
    """What a table's decision map is split by."""

    dtype: str
    head_dim: int
    causal: bool
    gqa_ratio: int
    mask_kind: str
    work_log2: int

    def describe(self) -> str:
        return (
            f"{self.dtype}, head dim {self.head_dim}, {'causal' if self.causal else 'non-causal'}, "
            f"GQA {self.gqa_ratio}, mask {self.mask_kind}, batch x heads ~2^{self.work_log2}"
        )

    def base(self) -> tuple:
        """Everything but the work bucket (classes that may stand in for each other)."""
        return (self.dtype, self.head_dim, self.causal, self.gqa_ratio, self.mask_kind)


def class_key(problem: Problem, *, work_step: int = WORK_STEP) -> ClassKey:
    return ClassKey(
        problem.dtype, problem.head_dim, problem.causal, problem.gqa_ratio, problem.mask_kind,
        work_bucket(problem, step=work_step),
    )


def bucket_of(problem: Problem) -> tuple[int, int]:
    """``(q bucket, kv bucket)`` of a problem."""
    return length_bucket(problem.q_len), length_bucket(problem.kv_len)
