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


SHARED_SLACK_BYTES = 1024
"""Shared memory Triton allocates beyond its tiles (reductions' scratch): 512 B on sm_90, Triton 3.6."""


def mask_element_bytes(mask_kind: str, itemsize: int) -> int:
    """Shared-memory bytes per element of a staged mask tile: a float mask in the input dtype; a bool
    mask 2 (Triton 3.6 on sm_90 allocated 1.5 per element: its bytes and a converted copy)."""
    return {"none": 0, "bool": 2}.get(mask_kind, itemsize)


def forward_shared_bytes(config: FlashConfig, head_dim: int, value_dim: int, itemsize: int,
                         mask_bytes: int = 0) -> int:
    """Estimated shared memory of one forward program: the query block, a key block and a value
    block for each of the ``s - 1`` loads Triton's pipeliner keeps in flight (at least one), and a
    ``bm x bn`` mask tile (`mask_bytes` an element, `mask_element_bytes`) for each of the ``s``
    stages, on padded head dims. Triton 3.6 on sm_90 allocated exactly this (plus 512 B) for fp32
    inputs with a float mask; for half inputs Triton 3.9 allocates 0.3-1.0x of it."""
    d, dv = padded_dim(head_dim), padded_dim(value_dim)
    tiles = (config.block_m * d + max(config.stages - 1, 1) * config.block_n * (d + dv)) * itemsize
    return tiles + config.stages * config.block_m * config.block_n * mask_bytes + SHARED_SLACK_BYTES


def backward_shared_bytes(blocks: BackwardBlocks, head_dim: int, value_dim: int, itemsize: int,
                          mask_bytes: int = 0) -> int:
    """Estimated shared memory of one backward program (dK/dV: keys and values resident, queries
    and output gradients streamed; dQ the other way round: the same amount), with a staged
    ``resident x streamed`` mask tile as in `forward_shared_bytes`."""
    width = padded_dim(head_dim) + padded_dim(value_dim)
    tiles = (blocks.resident + max(blocks.stages, 1) * blocks.streamed) * width * itemsize
    mask = max(blocks.stages, 1) * blocks.resident * blocks.streamed * mask_bytes
    return tiles + mask + SHARED_SLACK_BYTES


def backward_blocks(config: FlashConfig, head_dim: int, value_dim: int, itemsize: int,
                    shared_limit: int | None, mask_bytes: int = 0) -> BackwardBlocks:
    """The backward's blocks for a forward `config`: resident ``min(bm, 128)``, streamed
    ``min(bn, 32)``, the forward's stages; then fewer stages, a smaller streamed block and a
    smaller resident block, in that order, until `backward_shared_bytes` fits `shared_limit`
    (None: no limit, as under Triton's interpreter). Never below `MIN_BLOCK` and one stage."""
    blocks = BackwardBlocks(min(config.block_m, BACKWARD_RESIDENT_MAX), min(config.block_n, BACKWARD_STREAMED_MAX),
                            config.stages)
    while shared_limit is not None and backward_shared_bytes(blocks, head_dim, value_dim, itemsize, mask_bytes) > shared_limit:
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
