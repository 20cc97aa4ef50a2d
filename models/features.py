"""Feature rows of (problem, kernel) pairs for the cost model: the kernel's family and parameters
(blocks, splits, visited blocks, warps, stages: columns shared across families), the problem's
shape (log2), dtype, causality, mask kind, and analytic terms (log seconds of roofline and prior).
A feature's name is its definition (a stored model reads columns by name): a changed meaning takes
a new name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from attn_dispatch.kernels.chunked import ChunkedKernel
from attn_dispatch.kernels.convert import ConvertKernel
from attn_dispatch.kernels.problem import ITEMSIZE, MASK_KINDS, Problem
from attn_dispatch.kernels.registry import PLAIN_FAMILIES
from attn_dispatch.kernels.small_q import SmallQKernel, effective_splits
from attn_dispatch.models.identity import CardSpec
from attn_dispatch.models.priors import (
    PRIOR_VERSION,
    kernel_named,
    prior_seconds,
    roofline_seconds,
    score_bytes_per_element,
)
from attn_dispatch.models.rates import visited_fraction

_FAMILIES = tuple(PLAIN_FAMILIES)
_DTYPES = tuple(ITEMSIZE)
TINY_SECONDS = 1e-9  # floor for logs of analytic times (a nanosecond)
PRIOR_FEATURE = f"log_prior_s_v{PRIOR_VERSION}"
"""Names the prior's version (`models.priors.PRIOR_VERSION`; version 1's was ``log_prior_s``)."""

FAMILY_FEATURE_PREFIX = "family="
"""One-hot columns of the working kernel family: ``family=chunked``, ... (a model's fitted families)."""
FEATURE_NAMES: tuple[str, ...] = (
    *(f"{FAMILY_FEATURE_PREFIX}{family}" for family in _FAMILIES),
    "convert_dtype", "convert_layout", "log2_convert_size_ratio",
    "log2_q_chunk", "log2_kv_chunk", "log2_splits", "log2_blocks_visited", "visited_fraction",
    "log2_block_score_bytes", "log2_warps", "log2_stages",
    "log2_q_len", "log2_kv_len", "log2_head_dim", "log2_value_dim", "log2_batch", "log2_q_heads",
    "log2_gqa_ratio", "log2_rows_per_kv_head",
    *(f"dtype={dtype}" for dtype in _DTYPES),
    "causal", *(f"mask={kind}" for kind in MASK_KINDS if kind != "none"), "strided", "broadcast_inputs",
    "log_flops", "log_io_bytes", "log_score_bytes", "log_workspace_bytes", "log_roofline_s", PRIOR_FEATURE,
)
PRIOR_COLUMN = FEATURE_NAMES.index(PRIOR_FEATURE)
"""Column of the log prior time (the cost model's residual baseline)."""
_KERNEL_ONLY_NAMES = ("log_workspace_bytes", PRIOR_FEATURE)
PROBLEM_COLUMNS: tuple[int, ...] = tuple(
    i for i, name in enumerate(FEATURE_NAMES)
    if i >= FEATURE_NAMES.index("log2_q_len") and name not in _KERNEL_ONLY_NAMES
)
"""Columns that depend on the problem alone (equal for every kernel run on one problem): the
cost model finds a problem's rows by them and fits its problem-level offset on them only."""


def _log2(value: float) -> float:
    return math.log2(max(value, 1.0))


def _kernel_params(kernel, problem: Problem) -> tuple[float, float, float, float, float]:
    """(log2 q block, log2 kv block, log2 effective splits, log2 blocks visited, visited fraction)
    with chunks clipped to the problem's lengths (a 4096 chunk on 100 keys is one 100-key block);
    a Triton kernel's blocks are its program's tiles (computed whole, padding included)."""
    L, S = problem.q_len, problem.kv_len
    if isinstance(kernel, ChunkedKernel):
        q_block, kv_block = max(1, min(kernel.q_chunk, L)), max(1, min(kernel.kv_chunk, S))
        fraction, visited, _ = visited_fraction(L, S, q_block, kv_block, problem.causal)
        return _log2(q_block), _log2(kv_block), 0.0, _log2(visited), fraction
    if isinstance(kernel, SmallQKernel):
        return _log2(L), _log2(S), _log2(effective_splits(kernel.splits, S)), 0.0, 1.0
    if kernel.family == "triton_flash":
        config = kernel.config
        fraction, visited, _ = visited_fraction(L, S, config.block_m, config.block_n, problem.causal)
        return _log2(config.block_m), _log2(config.block_n), 0.0, _log2(visited), fraction
    if kernel.family == "triton_decode":
        layout = kernel.layout(problem)
        visited = layout.row_blocks * math.ceil(layout.key_count / layout.block_n)
        return (_log2(layout.block_m), _log2(layout.block_n), _log2(layout.splits), _log2(visited),
                layout.key_count / max(S, 1))
    return _log2(L), _log2(S), 0.0, 0.0, 1.0


def _launch_params(kernel) -> tuple[float, float]:
    """(log2 warps, log2 pipeline stages) of a Triton kernel; zeros for the others."""
    if kernel.family == "triton_flash":
        return _log2(kernel.config.warps), _log2(kernel.config.stages)
    if kernel.family == "triton_decode":
        return _log2(kernel.warps), _log2(kernel.stages)
    return 0.0, 0.0


def feature_row(problem: Problem, kernel_name: str, spec: CardSpec) -> list[float]:
    """The features of one (problem, kernel) pair, in `FEATURE_NAMES` order."""
    kernel = kernel_named(kernel_name)
    inner, run_problem = kernel, problem
    convert_dtype = convert_layout = 0.0
    ratio = 0.0
    if isinstance(kernel, ConvertKernel):
        inner, run_problem = kernel.inner, kernel.converted(problem)
        convert_layout = 1.0 if kernel.source is None else 0.0
        convert_dtype = 1.0 - convert_layout
        ratio = math.log2(run_problem.itemsize / problem.itemsize)
    row = [1.0 if inner.family == family else 0.0 for family in _FAMILIES]
    row += [convert_dtype, convert_layout, ratio]
    params = _kernel_params(inner, run_problem)
    row += list(params)
    # One block's fp32 scores (the working set that decides whether it stays in cache).
    row.append(params[0] + params[1] + _log2(run_problem.batch * run_problem.q_heads * 4))
    row += _launch_params(inner)
    row += [
        _log2(problem.q_len), _log2(problem.kv_len), _log2(problem.head_dim), _log2(problem.value_dim),
        _log2(problem.batch), _log2(problem.q_heads), _log2(problem.gqa_ratio),
        _log2(problem.gqa_ratio * problem.q_len),
    ]
    row += [1.0 if problem.dtype == dtype else 0.0 for dtype in _DTYPES]
    row += [float(problem.causal)] + [1.0 if problem.mask_kind == kind else 0.0 for kind in MASK_KINDS if kind != "none"]
    row += [float(problem.strided), float(problem.broadcast_inputs)]
    score_bytes = problem.score_elements * score_bytes_per_element(problem)
    row += [
        math.log(max(problem.flops, 1)), math.log(max(problem.io_bytes, 1)), math.log(max(score_bytes, 1)),
        math.log(max(kernel.workspace_bytes(problem), 1)),
        math.log(max(roofline_seconds(problem, spec), TINY_SECONDS)),
        math.log(max(prior_seconds(problem, kernel, spec), TINY_SECONDS)),
    ]
    return row


def feature_matrix(problems: Sequence[Problem], kernel_names: Sequence[str], spec: CardSpec) -> np.ndarray:
    """``float64 [n, len(FEATURE_NAMES)]`` features of ``problems[i]`` run by ``kernel_names[i]``."""
    if len(problems) != len(kernel_names):
        raise ValueError(
            f"feature_matrix needs one kernel name per problem: got {len(problems)} problems and "
            f"{len(kernel_names)} kernel names; pair them row by row"
        )
    rows = [feature_row(problem, name, spec) for problem, name in zip(problems, kernel_names, strict=True)]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(FEATURE_NAMES))
