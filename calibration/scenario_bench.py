"""`attn-dispatch bench`: the scenarios' shapes (docs/COMMANDS.md) and the harness that times every
path of a shape; the report, with its verdict, is `calibration.bench_report`'s.

A *path* has the kernel protocol: the dispatcher, `PytorchDefault` (SDPA as a user calls it) and
every single kernel (so the oracle is known). Per shape, paths that cannot run, do not fit or are
predicted hopeless are recorded, not run; the rest go once through `calibration.measure.measure`,
then round-robin (order rotated each round so drift affects all alike).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from attn_dispatch.calibration.inputs import InputCache, rotation_count
from attn_dispatch.calibration.measure import SINGLE_SHOT, NamedShape, empty_cache, measure, on_device
from attn_dispatch.calibration.timer import (
    TimerSettings,
    calls_per_sample,
    interquartile_range,
    time_repetitions,
)
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from attn_dispatch.kernels.sdpa_default import SdpaDefaultKernel

SCENARIOS = ("prefill", "fill", "decode", "video")
EXTRA_SCENARIOS = ("heldout",)
SIZES = ("small", "full")

# Llama-3-8B attention; video DiT attention (CogVideoX's D=64, 16-24 heads); CPU stand-ins with
# the same GQA ratio and causality.
LLM_Q_HEADS, LLM_KV_HEADS, LLM_HEAD_DIM = 32, 8, 128
VIDEO_HEAD_DIM = 64
SMALL_Q_HEADS, SMALL_KV_HEADS, SMALL_HEAD_DIM = 8, 2, 64
SMALL_VIDEO_HEADS = 4

Shape = NamedShape  # `suite` is the scenario


def _llm(scenario: str, q_len: int, kv_len: int, dtype: str, *, small: bool, causal: bool = False,
         mask: bool = False) -> Shape:
    heads, kv_heads, dim = (SMALL_Q_HEADS, SMALL_KV_HEADS, SMALL_HEAD_DIM) if small else (
        LLM_Q_HEADS, LLM_KV_HEADS, LLM_HEAD_DIM)
    mask_kind, mask_shape = ("bool", (1, 1, q_len, kv_len)) if mask else ("none", ())
    return Shape(scenario, Problem(1, heads, kv_heads, q_len, kv_len, dim, dim, dtype, causal, mask_kind, mask_shape))


def _video(length: int, heads: int, dtype: str) -> Shape:
    return Shape("video", Problem(1, heads, heads, length, length, VIDEO_HEAD_DIM, VIDEO_HEAD_DIM, dtype))


def _heldout(batch: int, heads: int, kv_heads: int, q_len: int, kv_len: int, dim: int, dtype: str,
             causal: bool = False, mask_kind: str = "none") -> Shape:
    mask_shape = (batch, 1, q_len, kv_len) if mask_kind != "none" else ()
    return Shape("heldout", Problem(batch, heads, kv_heads, q_len, kv_len, dim, dim, dtype, causal, mask_kind, mask_shape))


# Held-out shapes: (batch, heads, kv heads, Lq, Lk, head dim, dtype, causal, mask kind).
FULL_HELDOUT = (
    (2, 16, 16, 3000, 3000, 96, "bfloat16", True, "none"),       # prefill, MHA, D=96
    (1, 40, 8, 6144, 6144, 128, "float16", True, "none"),        # prefill, GQA 5
    (4, 12, 12, 1536, 1536, 64, "float16", True, "none"),        # prefill, small model, batch 4
    (1, 32, 8, 2000, 2000, 128, "float32", True, "none"),        # prefill in fp32
    (4, 32, 4, 1, 20000, 128, "float16", False, "none"),         # decode, GQA 8, batch 4
    (8, 32, 32, 1, 8000, 128, "float16", False, "none"),         # decode, MHA, batch 8
    (2, 28, 4, 3, 50000, 128, "bfloat16", False, "none"),        # speculative decode, GQA 7
    (1, 64, 8, 8, 100000, 128, "float16", False, "none"),        # speculative decode, 64 heads
    (1, 32, 8, 1, 60000, 128, "float32", False, "none"),         # decode in fp32
    (1, 32, 8, 1000, 24000, 128, "float16", False, "bool"),      # chunked prefill, bool mask
    (2, 16, 2, 300, 9000, 128, "bfloat16", False, "float"),      # chunked prefill, float mask, GQA 8
    (2, 24, 24, 12000, 12000, 64, "bfloat16", False, "none"),    # video, batch 2
    (1, 30, 30, 45000, 45000, 64, "bfloat16", False, "none"),    # video, CogVideoX-2B heads
    (1, 16, 16, 20000, 20000, 80, "float16", False, "none"),     # video, D=80
    (1, 24, 24, 10000, 10000, 64, "float32", False, "none"),     # video in fp32
)
SMALL_HELDOUT = (
    (2, 6, 6, 300, 300, 96, "float32", True, "none"),
    (1, 10, 2, 600, 600, 64, "float32", True, "none"),
    (3, 8, 1, 1, 3000, 64, "float32", False, "none"),
    (2, 7, 1, 3, 5000, 64, "float32", False, "none"),
    (1, 8, 2, 100, 2400, 64, "float32", False, "bool"),
    (2, 4, 4, 700, 700, 80, "float32", False, "none"),
)


FULL_PREFILL = (512, 1024, 2048, 4096, 8192, 16384)
FULL_FILL_CHUNKS, FULL_FILL_CACHES = (512, 2048, 4096), (16384, 65536, 131072)
FULL_DECODE_QUERIES, FULL_DECODE_CACHES = (1, 4, 16), (4096, 32768, 131072)
FULL_VIDEO = ((8192, 24), (16384, 24), (32768, 24), (65536, 16), (131072, 16))
SMALL_PREFILL = (128, 256, 512)
SMALL_FILL_CHUNKS, SMALL_FILL_CACHES = (32, 128), (1024, 2048)
SMALL_DECODE_QUERIES, SMALL_DECODE_CACHES = (1, 8), (1024, 4096)
SMALL_VIDEO = ((512, SMALL_VIDEO_HEADS), (1024, SMALL_VIDEO_HEADS))


def _full(scenario: str) -> list[Shape]:
    if scenario == "heldout":
        return [_heldout(*row) for row in FULL_HELDOUT]
    if scenario == "prefill":
        return [_llm("prefill", n, n, dtype, small=False, causal=True)
                for dtype in ("float16", "bfloat16") for n in FULL_PREFILL]
    if scenario == "fill":
        return [_llm("fill", q, k, "float16", small=False, mask=True) for k in FULL_FILL_CACHES for q in FULL_FILL_CHUNKS]
    if scenario == "decode":
        return [_llm("decode", q, k, "float16", small=False) for k in FULL_DECODE_CACHES for q in FULL_DECODE_QUERIES]
    return [_video(n, heads, "bfloat16") for n, heads in FULL_VIDEO]


def _small(scenario: str, dtype: str) -> list[Shape]:
    if scenario == "heldout":
        return [_heldout(*row[:6], dtype, *row[7:]) for row in SMALL_HELDOUT]
    if scenario == "prefill":
        return [_llm("prefill", n, n, dtype, small=True, causal=True) for n in SMALL_PREFILL]
    if scenario == "fill":
        return [_llm("fill", q, k, dtype, small=True, mask=True) for k in SMALL_FILL_CACHES for q in SMALL_FILL_CHUNKS]
    if scenario == "decode":
        return [_llm("decode", q, k, dtype, small=True) for k in SMALL_DECODE_CACHES for q in SMALL_DECODE_QUERIES]
    return [_video(n, heads, dtype) for n, heads in SMALL_VIDEO]


def scenario_shapes(scenarios: str | tuple[str, ...], *, size: str, device_type: str,
                    small_dtype: str = "float32") -> list[Shape]:
    """The shapes of `scenarios` (a name, ``"all"`` or a tuple of names) at `size` (``"full"`` or
    ``"small"``: every shape in `small_dtype`), on `device_type`."""
    names = SCENARIOS if scenarios == "all" else (scenarios,) if isinstance(scenarios, str) else tuple(scenarios)
    unknown = [name for name in names if name not in SCENARIOS + EXTRA_SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}: choose among "
                         f"{', '.join(SCENARIOS + EXTRA_SCENARIOS)} or 'all'")
    if size not in SIZES:
        raise ValueError(f"size={size!r}: choose 'small' (CPU-sized) or 'full' (GPU-sized)")
    shapes = []
    for name in names:
        shapes += _full(name) if size == "full" else _small(name, small_dtype)
    return [on_device(shape, torch.device(device_type)) for shape in shapes]


def default_size(device_type: str) -> str:
    """``full`` on a GPU, ``small`` on the CPU (full sizes would take hours there)."""
    return "small" if device_type == "cpu" else "full"


SKIPPED = "skipped"
MIN_PAIRED_ROUNDS = 2  # rounds two paths must share for a paired ratio


class PytorchDefault(Kernel):
    """`F.scaled_dot_product_attention` called exactly as a user calls it (no canonicalisation):
    the baseline the dispatcher must beat."""

    family = "pytorch_default"
    _default = SdpaDefaultKernel()

    def reasons(self, problem: Problem) -> list[str]:
        return self._default.reasons(problem)

    def workspace_bytes(self, problem: Problem) -> int:
        return self._default.workspace_bytes(problem)

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem: Problem) -> torch.Tensor:
        gqa = {"enable_gqa": True} if enable_gqa else {}
        return pytorch_sdpa(query, key, value, attn_mask, 0.0, problem.causal, scale=scale, **gqa)


@dataclass(frozen=True)
class BenchSettings:
    """How hard the harness tries per shape: interleaved `rounds` (at least `min_rounds`, none
    started after `shape_budget_s`); a path `loser_factor` x the best is timed once; a kernel
    predicted `hopeless_factor` x the best and over `hopeless_min_s` is not run; past
    `first_pass_budget_s` the remaining single kernels are not run."""

    rounds: int = 10
    min_rounds: int = 3
    shape_budget_s: float = 3.0
    warmup: int = 1
    loser_factor: float = 4.0
    hopeless_factor: float = 10.0
    hopeless_min_s: float = 0.02
    first_pass_budget_s: float = 9.0

    def first_pass(self) -> TimerSettings:
        """What `measure` runs per path: warm-up, then one timed repetition."""
        return TimerSettings(warmup=self.warmup, min_reps=1, max_reps=1, target_relative_iqr=math.inf,
                             budget_s=self.shape_budget_s)


@dataclass(frozen=True)
class BenchPath:
    """A path to time: its label, the kernel-protocol object, its role, its predicted seconds."""

    label: str
    kernel: Kernel
    role: str = "kernel"
    predicted_s: float | None = None


@dataclass
class PathResult:
    """One path on one shape. `status`: ok / unsupported / infeasible / inaccurate / failed /
    skipped (not run: over budget or hopeless)."""

    label: str
    role: str
    status: str
    reason: str = ""
    samples: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    rel_error: float | None = None
    workspace_bytes: int | None = None
    timed_once: bool = False

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples) if self.status == "ok" and self.samples else math.inf

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0 with fewer than two samples)."""
        median = self.median_s
        return interquartile_range(self.samples) / median if math.isfinite(median) and median > 0 else 0.0

    def to_dict(self) -> dict:
        median = self.median_s
        return {
            "path": self.label, "role": self.role, "status": self.status, "reason": self.reason,
            "median_s": median if math.isfinite(median) else None, "spread": self.spread, "reps": len(self.samples),
            "timed_once": self.timed_once, "peak_bytes": self.peak_bytes, "rel_error": self.rel_error,
            "workspace_bytes": self.workspace_bytes,
        }


@dataclass
class ShapeResult:
    """Every path of one shape, the dispatcher's chosen kernel and the rounds timed."""

    shape: Shape
    paths: list[PathResult]
    chosen: str | None = None
    rounds: int = 0
    wall_s: float = 0.0
    notes: tuple[str, ...] = ()  # the dispatcher's decision notes (memory, tuning timings)

    def path(self, role: str) -> PathResult | None:
        return next((p for p in self.paths if p.role == role), None)

    @property
    def oracle(self) -> PathResult | None:
        """The fastest single kernel measured (PyTorch's default counts as one)."""
        timed = [p for p in self.paths if p.role != "dispatcher" and math.isfinite(p.median_s)]
        return min(timed, key=lambda p: p.median_s) if timed else None

    def ratio(self, role: str) -> float | None:
        """Dispatcher time / the oracle's (``role="oracle"``) or PyTorch's default's (``"pytorch"``)."""
        pair = self._pair(role)
        return None if pair is None else pair[0].median_s / pair[1].median_s

    def paired_ratio(self, role: str) -> float | None:
        """`ratio` taken round by round (the median of per-round ratios: load that changes between
        rounds cancels); the plain `ratio` where the two were not timed in the same rounds."""
        pair = self._pair(role)
        if pair is None:
            return None
        mine, other = pair
        if len(mine.samples) != len(other.samples) or len(mine.samples) < MIN_PAIRED_ROUNDS:
            return mine.median_s / other.median_s
        return statistics.median(m / o for m, o in zip(mine.samples, other.samples, strict=True))

    def _pair(self, role: str) -> tuple[PathResult, PathResult] | None:
        mine = self.path("dispatcher")
        other = self.oracle if role == "oracle" else self.path(role)
        if mine is None or other is None or not (math.isfinite(mine.median_s) and math.isfinite(other.median_s)):
            return None
        return mine, other

    def to_dict(self) -> dict:
        oracle = self.oracle
        return {
            "scenario": self.shape.suite, "label": self.shape.label, "problem": self.shape.problem.to_dict(),
            "chosen": self.chosen, "oracle": oracle.label if oracle else None,
            "ratio_to_oracle": self.ratio("oracle"), "ratio_to_pytorch": self.ratio("pytorch"),
            "paired_ratio_to_oracle": self.paired_ratio("oracle"),
            "paired_ratio_to_pytorch": self.paired_ratio("pytorch"),
            "rounds": self.rounds, "wall_s": self.wall_s, "decision_notes": list(self.notes),
            "unsupported": sum(1 for p in self.paths if p.status == "unsupported"),
            "paths": [p.to_dict() for p in self.paths if p.status != "unsupported"],
        }


def _precheck(path: BenchPath, problem: Problem, limit: int | None, best_predicted: float | None,
              settings: BenchSettings) -> PathResult | None:
    """A result for a path that is not run (unsupported, over budget, hopeless), else None."""
    why = path.kernel.reasons(problem)
    if why:
        return PathResult(path.label, path.role, "unsupported", "; ".join(why))
    workspace = int(path.kernel.workspace_bytes(problem))
    inputs = problem.input_bytes
    if limit is not None and workspace + inputs > limit:
        return PathResult(path.label, path.role, SKIPPED, f"skipped: over budget (inputs {inputs} B + workspace "
                          f"{workspace} B > {limit} B free or allowed)", workspace_bytes=workspace)
    predicted = path.predicted_s
    if (path.role == "kernel" and path.label != "math" and predicted is not None and best_predicted
            and predicted > max(settings.hopeless_factor * best_predicted, settings.hopeless_min_s)):
        return PathResult(path.label, path.role, SKIPPED, f"skipped: predicted hopeless ({predicted / best_predicted:.0f}x "
                          "the best predicted path)", workspace_bytes=workspace)
    return None


def _first_pass(path: BenchPath, problem: Problem, device: torch.device, cache: InputCache, settings: BenchSettings,
                memory_budget: int | None, best: float) -> PathResult:
    loser_above = settings.loser_factor * best if math.isfinite(best) else None
    point = measure(path.kernel, problem, device, settings=settings.first_pass(), memory_budget=memory_budget,
                    cache=cache, single_shot_above_s=loser_above)
    result = PathResult(path.label, path.role, point.status, point.reason, peak_bytes=point.peak_bytes,
                        rel_error=point.rel_error, workspace_bytes=point.extra.get("workspace_bytes"))
    if point.status == "ok":
        result.samples = [point.median_s]
        result.timed_once = point.extra.get("stopped") in ("early", "budget") or (
            loser_above is not None and point.median_s > loser_above)
    return result


def _rounds(contenders: list[tuple[BenchPath, PathResult]], problem: Problem, device: torch.device,
            cache: InputCache, settings: BenchSettings, cap: int | None, started: float) -> int:
    """Interleaved rounds; each contender's first-pass sample is replaced by the rounds' samples.
    `cap`: bytes the rotated input sets may take (None: no cap)."""
    inputs = cache.input_sets(problem, device, 0, rotation_count(problem, device, cap))
    calls = {result.label: calls_per_sample(result.median_s) for _, result in contenders}
    fresh: dict[str, list[float]] = {result.label: [] for _, result in contenders}
    done = 0
    with torch.inference_mode():
        while done < settings.rounds and (done < settings.min_rounds or time.perf_counter() - started < settings.shape_budget_s):
            for offset in range(len(contenders)):
                path, result = contenders[(done + offset) % len(contenders)]
                count = calls[result.label]

                def run(_: int, kernel=path.kernel, count=count, first=done * count) -> None:
                    for j in range(first, first + count):
                        x = inputs[j % len(inputs)]
                        kernel.run(x.query, x.key, x.value, x.attn_mask, None, x.enable_gqa, problem)

                fresh[result.label].append(time_repetitions(run, device, SINGLE_SHOT).median_s / count)
            done += 1
    for _, result in contenders:
        result.samples = fresh[result.label]
    return done


def bench_shape(shape: Shape, device: torch.device | str, paths: Sequence[BenchPath], *,
                settings: BenchSettings = BenchSettings(), memory_budget: int | None = None,
                workspace_limit: int | None = None) -> ShapeResult:
    """Time every path of `shape` (see module docstring); never raises for a path's failure.
    `paths`: the dispatcher, PyTorch's default, then the single kernels (the first pass's order).
    `memory_budget`: bytes one call may use, passed to `measure`; `workspace_limit`: paths whose
    inputs and workspace exceed it are skipped without running."""
    device = torch.device(device)
    problem = shape.problem
    started = time.perf_counter()
    predictions = [p.predicted_s for p in paths if p.predicted_s is not None and p.role == "kernel"]
    best_predicted = min(predictions) if predictions else None
    cache = InputCache()
    results: list[PathResult] = []
    contenders: list[tuple[BenchPath, PathResult]] = []
    best = math.inf
    try:
        for path in paths:
            result = _precheck(path, problem, workspace_limit, best_predicted, settings)
            spent = time.perf_counter() - started
            if result is None and path.role == "kernel" and path.label != "math" and spent > settings.first_pass_budget_s:
                result = PathResult(path.label, path.role, SKIPPED, f"skipped: the shape's first pass took {spent:.1f} s, "
                                    f"over its {settings.first_pass_budget_s:g} s budget")
            if result is None:
                result = _first_pass(path, problem, device, cache, settings, memory_budget, best)
                best = min(best, result.median_s)
                if result.status == "ok" and not result.timed_once:
                    contenders.append((path, result))
            results.append(result)
        contenders = [(p, r) for p, r in contenders if p.role != "kernel" or r.median_s <= settings.loser_factor * best]
        racing = {id(r) for _, r in contenders}
        for result in results:
            result.timed_once = result.status == "ok" and id(result) not in racing
        widest = max((r.workspace_bytes or 0 for _, r in contenders), default=0)
        one_set = problem.input_bytes
        cap = None if memory_budget is None else max(memory_budget - widest, one_set)
        rounds = _rounds(contenders, problem, device, cache, settings, cap, started) if contenders else 0
    finally:
        cache.clear()
        empty_cache(device)
    return ShapeResult(shape, results, rounds=rounds, wall_s=time.perf_counter() - started)
