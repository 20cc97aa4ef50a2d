"""Block sizes of `triton_flash` and the shared memory they need (plain Python: imports no Triton).

The forward keeps one query block (``bm`` rows) on chip and streams key/value blocks (``bn`` rows)
through ``s`` pipeline stages. Each backward kernel keeps one large block resident (keys for the
dK/dV kernel, queries for the dQ kernel) and streams small blocks of the other side; its blocks
are derived from the forward's and shrunk until they fit the card (`backward_blocks`), so a
forward that fits always has a backward that fits.
"""

from __future__ import annotations

from typing import NamedTuple

from attn_dispatch.kernels._triton_ops import BOOL_MASK, FLOAT_MASK, NO_MASK  # noqa: F401 - the tiles' mask kinds
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.triton_flash import MAX_HEAD_DIM, MIN_BLOCK, padded_dim  # noqa: F401 (the tiles')

BACKWARD_RESIDENT_MAX = 128
"""Largest resident block of a backward kernel: its fp32 dK and dV (or dQ) accumulators stay in
registers, two ``128 x 128`` tiles at head dim 128 (Triton's fused-attention tutorial uses 128)."""
BACKWARD_STREAMED_MAX = 32
"""Largest streamed block of a backward kernel (Triton's fused-attention tutorial streams 32 rows
against a resident block of 128)."""



class FlashConfig(NamedTuple):
    """One parameterisation: query rows per block, key rows per block, warps, pipeline stages."""

    block_m: int
    block_n: int
    warps: int
    stages: int


class BackwardBlocks(NamedTuple):
    """The backward kernels' blocks: `resident` rows kept on chip, `streamed` rows per step."""

    resident: int
    streamed: int
    stages: int


def forward_shared_bytes(config: FlashConfig, head_dim: int, value_dim: int, itemsize: int) -> int:
    """Estimated shared memory of one forward program: the query block, plus a key block and a
    value block for each of the ``s - 1`` loads Triton's pipeliner keeps in flight (at least one;
    padded head dims, input itemsize). Against what Triton 3.9 allocates for sm_90 (compiled here
    without a GPU) it reads 1.0-2.0x on half inputs and 0.8x on fp32 ones; a configuration it
    lets through that does not fit fails at its first launch, which the dispatcher remembers."""
    d, dv = padded_dim(head_dim), padded_dim(value_dim)
    return (config.block_m * d + max(config.stages - 1, 1) * config.block_n * (d + dv)) * itemsize


def backward_shared_bytes(blocks: BackwardBlocks, head_dim: int, value_dim: int, itemsize: int) -> int:
    """Estimated shared memory of one backward program (dK/dV: keys and values resident, queries
    and output gradients streamed; dQ the other way round: the same amount)."""
    width = padded_dim(head_dim) + padded_dim(value_dim)
    return (blocks.resident + max(blocks.stages, 1) * blocks.streamed) * width * itemsize


def backward_blocks(config: FlashConfig, head_dim: int, value_dim: int, itemsize: int,
                    shared_limit: int | None) -> BackwardBlocks:
    """The backward's blocks for a forward `config`: resident ``min(bm, 128)``, streamed
    ``min(bn, 32)``, the forward's stages; then fewer stages, a smaller streamed block and a
    smaller resident block, in that order, until `backward_shared_bytes` fits `shared_limit`
    (None: no limit, as under Triton's interpreter). Never below `MIN_BLOCK` and one stage."""
    blocks = BackwardBlocks(min(config.block_m, BACKWARD_RESIDENT_MAX), min(config.block_n, BACKWARD_STREAMED_MAX),
                            config.stages)
    while shared_limit is not None and backward_shared_bytes(blocks, head_dim, value_dim, itemsize) > shared_limit:
        if blocks.stages > 1:
            blocks = blocks._replace(stages=blocks.stages - 1)
        elif blocks.streamed > MIN_BLOCK:
            blocks = blocks._replace(streamed=blocks.streamed // 2)
        elif blocks.resident > MIN_BLOCK:
            blocks = blocks._replace(resident=blocks.resident // 2)
        else:
            break
    return blocks


def row_statistics_bytes(problem: Problem) -> int:
    """One fp32 value per query row and head (the log-sum-exp, or the backward's ``rowsum(dO*O)``)."""
    return problem.batch * problem.q_heads * problem.q_len * 4
