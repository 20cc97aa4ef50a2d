"""How much of the score matrix a blocked kernel visits under top-left causal masking."""

from __future__ import annotations

import math

import numpy as np

# Above this many query blocks the visited count uses the continuous approximation (the exact
# count costs one numpy pass over the blocks; the approximation is within a block per row).
EXACT_BLOCK_LIMIT = 1 << 16


def visited_fraction(q_len: int, kv_len: int, q_block: int, kv_block: int, causal: bool) -> tuple[float, float, int]:
    """(fraction of score elements computed, key blocks visited, query blocks).

    A block is skipped when every key in it lies after every query in it (kernels/_blocks.py
    `fully_blocked_by_causality`); a visited block is computed whole.
    """
    n_q = max(1, math.ceil(q_len / q_block)) if q_len else 1
    n_kv = max(1, math.ceil(kv_len / kv_block)) if kv_len else 1
    total = n_q * n_kv
    if not causal or q_len == 0 or kv_len == 0:
        return 1.0, float(total), n_q
    if n_q <= EXACT_BLOCK_LIMIT:
        ends = np.minimum(np.arange(1, n_q + 1, dtype=np.int64) * q_block, q_len)
        visited = float(np.minimum(n_kv, (ends - 1) // kv_block + 1).sum())
    else:
        mean_end = (q_len + q_block) / 2
        visited = n_q * min(n_kv, mean_end / kv_block + 0.5)
    return visited / total, visited, n_q
