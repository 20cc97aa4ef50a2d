"""How `triton_decode` lays a problem out on its Triton programs: block sizes, row blocks, splits,
and the memory that takes. Pure arithmetic (no Triton import): `reasons` and `workspace_bytes`
read it without compiling anything, the launch follows it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.triton_decode import MAX_BLOCK_ROWS, MIN_DOT_SIZE

MERGE_BLOCK_ROWS = 4
"""Most rows per program of the merge kernel: a decode step's GQA group (4 rows at 32/8 heads)."""
MERGE_BLOCK_ELEMENTS = 4096
"""Partial-output elements the merge kernel holds per step (rows x splits x value dim): 32 fp32
registers per thread at 4 warps."""
FP32_BYTES = 4
LAYOUTS_KEPT = 64
"""Layouts remembered (`from_sizes`): a decode step's layers share one; the key count moves every step."""


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= `n` (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def visible_key_count(problem: Problem) -> int:
    """`key_limit` of a problem."""
    return key_limit(problem.kv_len, problem.q_len, problem.causal, problem.causal_offset)


def key_limit(kv_len: int, q_len: int, causal: bool, causal_offset: int) -> int:
    """Keys any query row can see: all of them, or with causality up to the last row's diagonal
    (``L + causal_offset``, clamped to ``[0, S]``). Keys past it are never read."""
    if not causal:
        return kv_len
    return max(0, min(kv_len, q_len + causal_offset))


@dataclass(frozen=True)
class DecodeLayout:
    """One problem's launch geometry.

    rows: packed rows per K/V head (``G * L``); block_m: rows per program; row_blocks: programs
    per (batch x K/V head, split) along the rows; block_n: keys per inner step; block_d /
    block_dv: head dims padded to powers of two; key_count: keys read (`visible_key_count`);
    keys_per_split: a multiple of ``block_n``; splits: programs along the keys (<= requested).
    """

    rows: int
    block_m: int
    row_blocks: int
    block_n: int
    block_d: int
    block_dv: int
    key_count: int
    keys_per_split: int
    splits: int

    @classmethod
    def of(cls, problem: Problem, splits: int, block_n: int) -> DecodeLayout:
        """The layout of `problem` with `splits` requested and `block_n` keys per step."""
        return cls.from_sizes(problem.gqa_ratio * problem.q_len, problem.head_dim, problem.value_dim,
                              visible_key_count(problem), splits, block_n)

    @classmethod
    @lru_cache(maxsize=LAYOUTS_KEPT)
    def from_sizes(cls, rows: int, head_dim: int, value_dim: int, key_count: int, splits: int,
                   block_n: int) -> DecodeLayout:
        """The layout from the sizes the launch sees (`of` for a `Problem`); the same sizes give the same
        (immutable) layout object, computed once."""
        block_m = min(max(MIN_DOT_SIZE, next_power_of_two(rows)), MAX_BLOCK_ROWS)
        per_split = -(-max(key_count, 1) // splits)
        keys_per_split = -(-per_split // block_n) * block_n
        return cls(
            rows=rows,
            block_m=block_m,
            row_blocks=max(1, -(-rows // block_m)),
            block_n=block_n,
            block_d=max(MIN_DOT_SIZE, next_power_of_two(head_dim)),
            block_dv=max(MIN_DOT_SIZE, next_power_of_two(value_dim)),
            key_count=key_count,
            keys_per_split=keys_per_split,
            splits=max(1, -(-key_count // keys_per_split)),
        )

    @cached_property
    def merge_block_rows(self) -> int:
        """Rows per merge program (a power of two, at least 2: no block dimension of size 1)."""
        return max(2, min(next_power_of_two(self.rows), MERGE_BLOCK_ROWS))

    @cached_property
    def merge_block_splits(self) -> int:
        """Splits the merge program reads per step (a power of two)."""
        fit = max(1, MERGE_BLOCK_ELEMENTS // (self.merge_block_rows * self.block_dv))
        return min(next_power_of_two(self.splits), fit)

    @property
    def direct(self) -> bool:
        """One split: the split program writes the output itself (no partials, no merge)."""
        return self.splits == 1

    def partial_bytes(self, problem: Problem) -> int:
        """The splits' fp32 partial outputs, row maxima and row sums (0 when `direct`)."""
        if self.direct:
            return 0
        per_row = (problem.value_dim + 2) * FP32_BYTES
        return problem.batch * problem.kv_heads * self.splits * self.rows * per_row

    def shared_memory_bytes(self, itemsize: int, stages: int) -> int:
        """Estimated shared memory of one split program: K and V blocks per pipeline stage, the
        query block, and the probabilities staged for the second product."""
        kv_block = self.block_n * (self.block_d + self.block_dv) * itemsize
        return max(stages, 1) * kv_block + self.block_m * (self.block_d + self.block_n) * itemsize
