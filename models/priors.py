"""The analytic prior: how long a kernel should take on a card, from its spec sheet alone.

A roofline per kernel family: matrix products at the card's rate (derated by occupancy), passes
over the score matrix at its bandwidth, and a launch cost per eager op; each constant's source is
in docs/RESULTS.md#where-the-priors-constants-come-from. Also the `Ranker` interface (`rank`:
supported kernels' names with predicted seconds, fastest first), `PriorRanker`, and the helpers
every ranker shares (`kernel_named`, `supported`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from attn_dispatch.kernels._blocks import accumulation_itemsize
from attn_dispatch.kernels.accuracy import AccuracyPolicy
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.chunked import ChunkedKernel
from attn_dispatch.kernels.convert import ConvertKernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import kernel_from_name
from attn_dispatch.kernels.sdpa_default import SdpaDefaultKernel
from attn_dispatch.kernels.sdpa_gqa_fold import SdpaGqaFoldKernel, folded_problem
from attn_dispatch.kernels.small_q import SmallQKernel, effective_splits
from attn_dispatch.models.identity import CardSpec
from attn_dispatch.models.rates import (
    FUSED_EFFICIENCY,
    MATMUL_TILE,
    SOFTMAX_FLOPS_PER_ELEMENT,
    Rates,
    visited_fraction,
)

if TYPE_CHECKING:  # the Triton modules load only with a Triton kernel (checked by `family`)
    from attn_dispatch.kernels.triton_decode import TritonDecodeKernel
    from attn_dispatch.kernels.triton_flash import TritonFlashKernel

# Kernel names are validated against the registry under the most permissive policy: whether a
# lossy conversion may *run* is the dispatcher's policy, not a property of the name.
_ANY_POLICY = AccuracyPolicy.allowing("any")


@runtime_checkable
class Ranker(Protocol):
    """Predicts which kernels are fastest for a problem."""

    def rank(self, problem: Problem, kernels: Iterable[Kernel]) -> list[tuple[str, float]]:
        """Supported kernels' names and predicted seconds, fastest first."""
        ...


def supported(problem: Problem, kernels: Iterable[Kernel]) -> list[Kernel]:
    """The kernels of `kernels` whose `reasons(problem)` is empty, in order, without duplicates."""
    seen: set[str] = set()
    result = []
    for kernel in kernels:
        if kernel.name not in seen and not kernel.reasons(problem):
            seen.add(kernel.name)
            result.append(kernel)
    return result


UNPRICED = float("inf")
"""Predicted seconds of a kernel no model can price (not a registry kernel): ranked last."""


def priceable(kernel: Kernel) -> bool:
    """True for kernels the registry can build from their name (the ones priors and models know)."""
    try:
        kernel_named(kernel.name)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def kernel_named(name: str) -> Kernel:
    """A kernel object for a canonical name (cached); ValueError for names that are not ours."""
    return kernel_from_name(name, policy=_ANY_POLICY)


PRIOR_VERSION = 2
"""Bumped whenever `prior_seconds` changes its numbers: the prior's feature name carries it
(`models.features.PRIOR_FEATURE`), so a model fitted against another version is not evaluated.
Version 2: fused kernels without key splitting stream keys per block, in waves."""

FUSED_CAUSAL_EFFICIENCY = 0.6
# Which fused kernels split the keys across compute units for few query rows (flash-decoding):
# docs/RESULTS.md#where-the-priors-constants-come-from.
FUSED_SPLITS_KEYS = {"sdpa_cudnn": "one query row", "sdpa_flash": "always", "sdpa_efficient": "never"}
FUSED_LAUNCHES = 3  # the kernel, the log-sum-exp buffer, the output allocation
# The prior keeps PyTorch's own pick among its fused backends unless its estimate for a backend
# forced by name is better by more than this factor (docs/RESULTS.md#where-the-priors-constants-come-from);
# only calibration (measured times) overrides it.
FORCED_BACKEND_FACTOR = 1.25
# Query rows per block of a fused attention kernel (FlashAttention-2 uses 64-128).
FUSED_Q_TILE = 128
# Eager op counts of the portable kernels (from kernels/_blocks.py, kernels/math_kernel.py,
# kernels/chunked.py, kernels/small_q.py): per key block (scores, softmax, online merge), per
# query block (scale the rows, normalise, scatter), and per call.
MATH_OPS = 14
SMALL_Q_OPS = 16
CHUNKED_OPS_PER_BLOCK = 11
CHUNKED_MERGE_OPS = 12
CHUNKED_OPS_PER_Q_BLOCK = 7
MASK_OPS = 2
SDPA_MATH_OPS = 6
CONVERT_OPS = 4  # Q, K, V converted, the output converted back


def _masked(problem: Problem) -> bool:
    return problem.causal or problem.mask_kind != "none"


def score_bytes_per_element(problem: Problem) -> int:
    """Bytes moved per score element by the portable kernels (kernels/_blocks.py): the product
    writes scores, fp32 conversion, mask, max, subtract, exp, sum, conversion back, and the
    value product reads them."""
    item, acc = problem.itemsize, accumulation_itemsize(problem)
    total = 2 * item + 6 * acc
    if item != acc:
        total += 2 * (item + acc)
    if _masked(problem):
        total += 2 * acc + (1 if problem.mask_kind == "bool" else 4 if problem.mask_kind == "float" else 0)
    return total


def roofline_seconds(problem: Problem, spec: CardSpec) -> float:
    """The plain roofline: max(FLOPs / peak, fewest bytes / bandwidth); no efficiencies."""
    return max(problem.flops / spec.flops(problem.dtype), problem.io_bytes / spec.bandwidth)


def _tiles(*extents: float) -> float:
    return math.prod(max(1.0, math.ceil(extent / MATMUL_TILE)) for extent in extents)


def _unfused_seconds(
    problem: Problem, spec: CardSpec, *, q_block: int, kv_block: int, splits: int = 1,
    ops_per_block: float, ops_per_q_block: float, ops_fixed: float, merge_bytes: float = 0.0,
) -> float:
    """Portable kernels: blocks of ``q_block x kv_block`` scores per head, products in the input
    dtype, softmax in fp32 (see `score_bytes_per_element`)."""
    rates = Rates(problem, spec)
    L, S = problem.q_len, problem.kv_len
    q_block, kv_block = max(1, min(q_block, L)), max(1, min(kv_block, S))
    fraction, visited, n_q = visited_fraction(L, S, q_block, kv_block, problem.causal)
    elements = problem.score_elements * fraction
    heads_kv, rows = problem.batch * problem.kv_heads, problem.gqa_ratio * q_block
    item = problem.itemsize
    key_bytes = visited * heads_kv * kv_block * problem.head_dim * item
    value_bytes = visited * heads_kv * kv_block * problem.value_dim * item
    chunk = kv_block / splits
    qk = rates.product(2 * elements * problem.head_dim, key_bytes, heads_kv * splits * _tiles(rows, chunk))
    pv = rates.product(2 * elements * problem.value_dim, value_bytes, heads_kv * splits * _tiles(rows, problem.value_dim))
    softmax = max(
        elements * score_bytes_per_element(problem) / rates.bandwidth,
        elements * SOFTMAX_FLOPS_PER_ELEMENT / rates.vector,
    )
    stream = (problem.q_bytes + problem.out_bytes + merge_bytes + 2 * Kernel.input_copy_bytes(problem)) / rates.bandwidth
    mask_ops = MASK_OPS if _masked(problem) else 0
    ops = visited * (ops_per_block + mask_ops) + n_q * ops_per_q_block + ops_fixed
    return qk + pv + softmax + stream + ops * rates.launch


def math_seconds(problem: Problem, spec: CardSpec) -> float:
    return _unfused_seconds(problem, spec, q_block=problem.q_len, kv_block=problem.kv_len,
                            ops_per_block=0, ops_per_q_block=0, ops_fixed=MATH_OPS)


def chunked_seconds(problem: Problem, kernel: ChunkedKernel, spec: CardSpec) -> float:
    """Blocks skipped above the causal diagonal; an online-softmax merge per extra key block."""
    q_block = max(1, min(kernel.q_chunk, problem.q_len))
    kv_block = max(1, min(kernel.kv_chunk, problem.kv_len))
    _, visited, n_q = visited_fraction(problem.q_len, problem.kv_len, q_block, kv_block, problem.causal)
    merges = max(0.0, visited - n_q)
    acc = accumulation_itemsize(problem)
    merge_bytes = merges * problem.batch * problem.q_heads * q_block * (problem.value_dim + 2) * acc * 4
    return _unfused_seconds(
        problem, spec, q_block=q_block, kv_block=kv_block,
        ops_per_block=CHUNKED_OPS_PER_BLOCK + CHUNKED_MERGE_OPS * merges / max(visited, 1.0),
        ops_per_q_block=CHUNKED_OPS_PER_Q_BLOCK, ops_fixed=0, merge_bytes=merge_bytes,
    )


def small_q_seconds(problem: Problem, kernel: SmallQKernel, spec: CardSpec) -> float:
    """One pass over all keys, the value product split ``P`` ways (more parallel tiles), plus the
    per-split partial outputs written and summed."""
    splits = effective_splits(kernel.splits, problem.kv_len)
    rows = problem.batch * problem.q_heads * problem.q_len
    partial_bytes = 2 * splits * rows * problem.value_dim * problem.itemsize
    return _unfused_seconds(problem, spec, q_block=problem.q_len, kv_block=problem.kv_len, splits=splits,
                            ops_per_block=0, ops_per_q_block=0, ops_fixed=SMALL_Q_OPS, merge_bytes=partial_bytes)


def sdpa_math_seconds(problem: Problem, spec: CardSpec) -> float:
    """PyTorch's math backend: scores, one fused softmax, the value product; half inputs are
    upcast to fp32 first on GPU builds (kernels/sdpa_backends.py `SdpaMathKernel`)."""
    rates = Rates(problem, spec)
    acc = accumulation_itemsize(problem)
    elements = problem.score_elements
    heads, L, S = problem.batch * problem.q_heads, max(problem.q_len, 1), max(problem.kv_len, 1)
    upcast = 2 * (problem.q_bytes + problem.kv_bytes) * acc / problem.itemsize if problem.itemsize < acc else 0
    qk = rates.product(2 * elements * problem.head_dim, problem.kv_bytes, heads * _tiles(L, S))
    pv = rates.product(2 * elements * problem.value_dim, problem.kv_bytes, heads * _tiles(L, problem.value_dim))
    passes = 4 + (2 if _masked(problem) else 0)
    softmax = max(elements * passes * acc / rates.bandwidth, elements * SOFTMAX_FLOPS_PER_ELEMENT / rates.vector)
    stream = (upcast + problem.io_bytes) / rates.bandwidth
    return qk + pv + softmax + stream + (SDPA_MATH_OPS + (MASK_OPS if _masked(problem) else 0)) * rates.launch


def splits_keys(family: str, problem: Problem) -> bool:
    """Whether `family` spreads one block's keys over several compute units (`FUSED_SPLITS_KEYS`),
    by the caller's query length (docs/RESULTS.md, "What we tried and dropped")."""
    rule = FUSED_SPLITS_KEYS[family]
    return rule == "always" or (rule == "one query row" and problem.q_len == 1)


def fused_seconds(problem: Problem, family: str, spec: CardSpec, *, folded: bool = False) -> float:
    """A fused kernel: no score traffic, FLOPs at a family efficiency, causal blocks skipped, in
    waves of `FUSED_Q_TILE`-row blocks (`folded`: a K/V head's group stacked as rows); unsplit keys
    stream through one compute unit per block (docs/RESULTS.md#where-the-priors-constants-come-from)."""
    rates = Rates(problem, spec)
    efficiency = FUSED_EFFICIENCY[family] * (FUSED_CAUSAL_EFFICIENCY if problem.causal else 1.0)
    fraction, _, _ = visited_fraction(problem.q_len, problem.kv_len, FUSED_Q_TILE, FUSED_Q_TILE, problem.causal)
    group = problem.gqa_ratio if folded else 1
    tiles = problem.batch * (problem.q_heads // group) * math.ceil(max(problem.q_len * group, 1) / FUSED_Q_TILE)
    bias = problem.batch * problem.q_heads * problem.q_len * problem.kv_len * problem.itemsize if problem.mask_kind != "none" else 0
    # Derated by the unsplit blocks' waves even where the keys split (flash): over-prices flash on long
    # keys, but counting the split blocks made the picks worse (docs/RESULTS.md#where-the-priors-constants-come-from).
    compute = problem.flops * fraction / (rates.matmul * efficiency) / rates.wave_occupancy(tiles)
    streamed = problem.io_bytes + 2 * bias + 2 * Kernel.input_copy_bytes(problem)
    if splits_keys(family, problem):
        tiles *= math.ceil(max(problem.kv_len, 1) / FUSED_Q_TILE)
        memory = streamed / rates.bandwidth / rates.wave_occupancy(tiles)
    else:
        block_bytes = problem.kv_len * (problem.head_dim + problem.value_dim) * problem.itemsize * fraction
        memory = max(streamed / rates.bandwidth, rates.waves(tiles) * block_bytes * rates.units / rates.bandwidth)
    return max(compute, memory) + FUSED_LAUNCHES * rates.launch


def triton_seconds(problem: Problem, kernel: TritonFlashKernel | TritonDecodeKernel, spec: CardSpec) -> float:
    """Our Triton kernels (`models.triton_costs`), times `FORCED_BACKEND_FACTOR` on a card with
    fused kernels (PyTorch's own choice keeps the call unless these are clearly faster)."""
    from attn_dispatch.models.triton_costs import triton_decode_seconds, triton_flash_seconds

    if kernel.family == "triton_flash":
        seconds = triton_flash_seconds(problem, kernel, spec)
    else:
        seconds = triton_decode_seconds(problem, kernel, spec)
    return seconds * FORCED_BACKEND_FACTOR if spec.fused_attention else seconds


def default_backend(problem: Problem, spec: CardSpec) -> str:
    """The family `sdpa_default` is expected to run: cuDNN (half) or efficient (fp32) on a card
    with fused kernels, flash on CPU, the math backend elsewhere (gfx906)."""
    if problem.device_type == "cpu":
        return "sdpa_flash"
    if not spec.fused_attention or problem.dtype == "float64":
        return "sdpa_math"
    return "sdpa_cudnn" if problem.itemsize == 2 else "sdpa_efficient"


def prior_seconds(problem: Problem, kernel: Kernel, spec: CardSpec) -> float:
    """Predicted seconds of `kernel` on `problem` from `spec` alone (support is not checked)."""
    if isinstance(kernel, ConvertKernel):
        inner = kernel.converted(problem)
        if kernel.source is None:
            copy = 2 * (problem.q_bytes + problem.kv_bytes)
        else:
            copy = (problem.q_bytes + problem.kv_bytes) * (1 + inner.itemsize / problem.itemsize)
            copy += problem.out_bytes * (1 + inner.itemsize / problem.itemsize)
        rates = Rates(problem, spec)
        return copy / rates.bandwidth + CONVERT_OPS * rates.launch + prior_seconds(inner, kernel.inner, spec)
    family = kernel.family
    if family == "math":
        return math_seconds(problem, spec)
    if isinstance(kernel, ChunkedKernel):
        return chunked_seconds(problem, kernel, spec)
    if isinstance(kernel, SmallQKernel):
        return small_q_seconds(problem, kernel, spec)
    if family == "sdpa_math":
        return sdpa_math_seconds(problem, spec)
    if family == "sdpa_default":
        backend = default_backend(problem, spec)
        return sdpa_math_seconds(problem, spec) if backend == "sdpa_math" else fused_seconds(problem, backend, spec)
    if family in ("triton_flash", "triton_decode"):
        return triton_seconds(problem, kernel, spec)
    # Estimated, never measured by the prior's sources: PyTorch's own choice keeps the call unless
    # these are clearly faster, as for a forced backend.
    if isinstance(kernel, SdpaGqaFoldKernel):
        return prior_seconds(folded_problem(problem), SdpaDefaultKernel(), spec) * FORCED_BACKEND_FACTOR
    if family in FUSED_EFFICIENCY:
        folded = problem.gqa_ratio > 1 and kernel._gqa_mode(problem) == "fold"
        return fused_seconds(problem, family, spec, folded=folded) * FORCED_BACKEND_FACTOR
    raise ValueError(f"no prior for kernel family {family!r} (kernel {kernel.name}); add one to models/priors.py")


class PriorRanker:
    """Ranks kernels by `prior_seconds` on one card (the ranker of an uncalibrated card)."""

    def __init__(self, spec: CardSpec) -> None:
        self.spec = spec

    def __repr__(self) -> str:
        return f"PriorRanker({self.spec.name!r})"

    def rank(self, problem: Problem, kernels: Iterable[Kernel]) -> list[tuple[str, float]]:
        """Supported kernels' names and prior seconds, fastest first (ties by name); kernels that
        are not attn-dispatch's own come last with infinite seconds."""
        scored = [
            (k.name, prior_seconds(problem, k, self.spec) if priceable(k) else UNPRICED)
            for k in supported(problem, kernels)
        ]
        return sorted(scored, key=lambda item: (item[1], item[0]))
