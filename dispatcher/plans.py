"""What the warm path reads: an exact shape's cached decision (`Plan`), its cache key, the bounded caches
(`BoundedCache`), and `PreparedAttention` (planned once by `Dispatcher.plan`, run with no lookup); and what a process
counts per exact shape: calls (`CallCounts`, `SpentCalls`) and set-up paid (`SeenShapes`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Generic, TypeVar

import torch

from attn_dispatch.dispatcher.decision import Decision
from attn_dispatch.kernels import Kernel, Problem

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.core import Dispatcher
    from attn_dispatch.dispatcher.device_planner import Bucket

MAX_PLANS = 4096
"""Exact shapes whose plans are kept per dispatcher (oldest evicted first; a miss re-plans from its bucket)."""

MAX_BUCKETS = 1024
"""Size buckets whose decisions are kept per dispatcher."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """A dict of at most `limit` entries, evicting the oldest (FIFO: a hit is one ``dict.get``) to ``on_evict``."""

    def __init__(self, limit: int, on_evict: Callable[[K, V], None] | None = None) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self._items: dict[K, V] = {}
        self.get = self._items.get  # bound once
        self.table = self._items
        """The dict itself for subscript lookups on the warm path; change it through the methods only."""
        self._on_evict = on_evict

    def put(self, key: K, value: V) -> None:
        items = self._items
        if key not in items:
            while len(items) >= self.limit:
                oldest = next(iter(items))
                evicted = items.pop(oldest)
                if self._on_evict is not None:
                    self._on_evict(oldest, evicted)
        items[key] = value

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._items.pop(key, default)

    def values(self):
        return self._items.values()

    def __iter__(self):
        return iter(self._items)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items


class CallCounts:
    """Calls per kernel that no cached plan counts (evicted or replaced plans, the training route, measuring calls
    run by another candidate, traced graphs); `stats` adds the plans' own `Plan.count` cells."""

    def __init__(self, lock) -> None:
        self._cells: dict[str, list[int]] = {}
        self._lock = lock

    def cell(self, name: str) -> list[int]:
        cell = self._cells.get(name)
        if cell is None:
            with self._lock:
                cell = self._cells.setdefault(name, [0])
        return cell

    def fold(self, plan: Plan) -> None:
        """An evicted or replaced plan's calls stay in `stats`."""
        if plan.count[0]:
            self.cell(plan.kernel.name)[0] += plan.count[0]

    def stats(self, plans: Iterable[Plan]) -> dict[str, int]:
        """Calls per kernel name, these counts plus the cached `plans`'; approximate under concurrent calls."""
        with self._lock:
            counts = {name: cell[0] for name, cell in self._cells.items()}
            for plan in list(plans):
                counts[plan.kernel.name] = counts.get(plan.kernel.name, 0) + plan.count[0]
        return {name: count for name, count in counts.items() if count}

    def clear(self) -> None:
        self._cells.clear()


MAX_SEEN_SHAPES = 1 << 16
"""Exact shapes remembered per kernel (and in `SpentCalls`); past it new shapes count as unseen."""


class SeenShapes:
    """Per kernel, the exact shapes (plan cache keys) it has run in this process, its per-shape set-up paid."""

    def __init__(self) -> None:
        self._seen: dict[str, set] = {}

    def add(self, kernel_name: str, shape_key: tuple) -> None:
        seen = self._seen.setdefault(kernel_name, set())
        if len(seen) < MAX_SEEN_SHAPES:
            seen.add(shape_key)

    def has(self, kernel_name: str, shape_key: tuple) -> bool:
        return shape_key in self._seen.get(kernel_name, ())


class SpentCalls:
    """Calls of shapes whose plans were evicted before settling: the shape's next plan settles that much sooner."""

    def __init__(self) -> None:
        self._calls: dict[tuple, int] = {}

    def add(self, shape_key: tuple, calls: int) -> None:
        if calls > 0 and (shape_key in self._calls or len(self._calls) < MAX_SEEN_SHAPES):
            self._calls[shape_key] = self._calls.get(shape_key, 0) + calls

    def settle_at(self, shape_key: tuple, settle_at: int) -> int:
        """`settle_at` less the calls spent on `shape_key` before (at least 1)."""
        spent = self._calls.pop(shape_key, 0)
        return max(1, settle_at - spent) if settle_at and spent else settle_at


class Plan:
    """A decision for one exact call shape, ready to run.

    `run`: the kernel's `runner`, bound once. `recheck`: re-plan before each call (large workspace,
    `selection.RECHECK_FRACTION`, or the bucket's measuring decided). `count`: one-cell call counter, bumped in place
    on the warm path. `notes`, `skipped`: what this shape adds to the bucket's decision. `settle_at`: call count at
    which the shape is re-planned on the decided order (`selection.settle_after`; 0: never). `sdpa_call` /
    `sdpa_flags`: where running is exactly one call of PyTorch's SDPA, made by the warm path itself
    (`Kernel.sdpa_call`; never for a 1-D mask, which PyTorch refuses; `mask_ndim`: the mask's dimensions, None
    without one). `trial`: the `measuring.Trial` its calls run, else None."""

    __slots__ = ("problem", "device", "kernel", "run", "sdpa_call", "sdpa_flags", "workspace", "recheck", "count",
                 "bucket", "notes", "skipped", "settle_at", "unguardable", "trial", "mask_ndim", "_decision")

    def __init__(self, problem: Problem, device: torch.device, kernel: Kernel, workspace: int, recheck: bool,
                 bucket: Bucket, notes: tuple[str, ...] = (), skipped: tuple[tuple[str, str], ...] = (), *,
                 settle_at: int = 0, mask_ndim: int | None = None) -> None:
        self.problem = problem
        self.device = device
        self.kernel = kernel
        self.mask_ndim = mask_ndim
        self._bind()
        self.workspace = workspace
        self.recheck = recheck
        self.count = [0]
        self.bucket = bucket
        self.notes = notes
        self.skipped = skipped
        self.settle_at = settle_at
        self.unguardable = False
        """No hot-path guard could be built for its tensors (`hot_path.HotSlots.make_hot`): not tried again."""
        self.trial = None
        self._decision: Decision | None = None

    def _bind(self) -> None:
        """`run`, `sdpa_call` and `sdpa_flags` from the kernel."""
        self.run = self.kernel.runner(self.problem)
        # a 1-D mask is the problem's (1, 1, 1, S) to the kernels, but PyTorch's SDPA raises IndexError
        # on it: only the kernel's `run` (which reshapes it) may take it
        mask_ndim = self.mask_ndim
        self.sdpa_call = None if mask_ndim is not None and mask_ndim < 2 else self.kernel.sdpa_call(self.problem)
        self.sdpa_flags = sdpa_flags(self.sdpa_call, self.problem)

    def stop_measuring(self) -> None:
        """Undo `measure_with` where its trial ended deciding nothing (`measuring.Trial.cancel`): the plan's calls run
        its kernel again, and it may go hot."""
        self.trial = None
        self._bind()
        self.unguardable = False

    def measure_with(self, trial) -> None:
        """Make this plan's calls run `trial`'s candidates (no direct SDPA call, hot path or settling)."""
        self.trial = trial
        self.run = trial.runner(self)
        self.sdpa_call = self.sdpa_flags = None
        self.unguardable = True
        self.settle_at = 0
        trial.plans.append(self)

    @property
    def decision(self) -> Decision:
        """The bucket's decision as it applies to this shape (`explain`; while measuring, with what is measured)."""
        if self._decision is not None:
            return self._decision
        decision = self.bucket.decision_for(self.problem, self.kernel, self.workspace, self.notes, self.skipped)
        if self.trial is None:
            self._decision = decision
        return decision


def sdpa_flags(call: tuple[bool, bool, bool] | None, problem: Problem) -> dict[str, bool] | None:
    """The warm path's form of `Kernel.sdpa_call`: the keyword flags that are on, for ``sdpa(query, key, value,
    attn_mask, **flags)``; None where the call's mask use does not match the problem's."""
    if call is None or call[0] != (problem.mask_kind != "none"):
        return None
    return {name: True for name, on in (("is_causal", call[1]), ("enable_gqa", call[2])) if on}


def mask_ndim_of(key: tuple) -> int | None:
    """The mask's number of dimensions in a `cache_key` (None: no mask)."""
    mask = key[10]  # `cache_key`'s mask field: (shape, dtype, device, class) or None
    return None if mask is None else len(mask[0])


def cache_key(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
              is_causal: bool, enable_gqa: bool, *, mask_class: type | None = None) -> tuple:
    """Everything `Problem.from_tensors` validates and reads, from tensor attributes only: each input's shape, dtype
    and device, whether all three are contiguous, the mask's shape, dtype, device and class (`mask_class` overrides
    it when tracing), and the flags. Equal keys mean the same `Problem` and validity.

    Raises AttributeError for non-tensors and `Problem.from_tensors`'s NotImplementedError for nested tensors."""
    if query.is_nested or key.is_nested or value.is_nested:
        Problem.from_tensors(query, key, value, attn_mask, is_causal, enable_gqa)
    mask = None if attn_mask is None else (attn_mask.shape, attn_mask.dtype, attn_mask.device,
                                           mask_class or attn_mask.__class__)
    return (query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype, query.device,
            key.device, value.device, query.is_contiguous() and key.is_contiguous() and value.is_contiguous(),
            mask, is_causal, enable_gqa)


def family_key(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
               is_causal: bool, enable_gqa: bool) -> tuple:
    """`cache_key` without the key length (`problem_at_key_length`), noting whether the mask's key dim broadcasts.
    IndexError for a 0-D input or mask."""
    mask = None if attn_mask is None else (attn_mask.shape[:-1], attn_mask.shape[-1] == 1, attn_mask.dtype,
                                           attn_mask.device, attn_mask.__class__)
    return (query.shape, key.shape[:-2], key.shape[-1], value.shape[:-2], value.shape[-1], query.dtype,
            key.dtype, value.dtype, query.device, key.device, value.device,
            query.is_contiguous() and key.is_contiguous() and value.is_contiguous(), mask, is_causal,
            enable_gqa)


def problem_at_key_length(sibling: Problem, key: torch.Tensor, value: torch.Tensor,
                          attn_mask: torch.Tensor | None) -> Problem | None:
    """The `Problem` of a call with `sibling`'s `family_key`, without validating again: only the key length is
    checked (value's and the mask's must match). None when it does not hold."""
    kv_len = key.shape[-2]
    if value.shape[-2] != kv_len or kv_len < 1:
        return None
    mask_shape = sibling.mask_shape
    if attn_mask is not None and attn_mask.shape[-1] != 1:
        if attn_mask.shape[-1] != kv_len:
            return None
        mask_shape = (*mask_shape[:-1], kv_len)
    return sibling.at_key_length(kv_len, mask_shape)


def check_scale(scale: object) -> None:
    """SDPA's own check of `scale` (not in the cache key), before a bad argument is blamed on the kernels."""
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scaled_dot_product_attention(): argument 'scale' must be float or None, not {type(scale).__name__}")


_grad_enabled = torch.is_grad_enabled


class PreparedAttention:
    """``prepared(query, key, value, attn_mask=None)``: SDPA with the flags given to `Dispatcher.plan`, run by the
    kernel decided there. A call of other shapes, dtypes, devices or layouts raises ValueError; calls needing a
    gradient through a kernel without backward go through `Dispatcher.attention`."""

    __slots__ = ("_dispatcher", "_plan", "_key", "_causal", "_scale", "_gqa", "_count")

    def __init__(self, dispatcher: Dispatcher, plan: Plan, key: tuple, *, is_causal: bool, scale: float | None,
                 enable_gqa: bool) -> None:
        self._dispatcher = dispatcher
        self._plan = plan
        self._key = key
        self._causal = is_causal
        self._scale = scale
        self._gqa = enable_gqa
        # `stats()` counts calls that ran a kernel; meta calls compute shapes only (as `attention`'s)
        self._count = [0] if plan.problem.device_type == "meta" else plan.count

    @property
    def kernel(self) -> str:
        return self._plan.kernel.name

    @property
    def decision(self):
        return self._plan.decision

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        given = cache_key(query, key, value, attn_mask, self._causal, self._gqa)
        if given != self._key:
            raise ValueError(_mismatch(self._key, given))
        plan = self._plan
        if _grad_enabled() and not plan.kernel.supports_backward and (
                query.requires_grad or key.requires_grad or value.requires_grad
                or (attn_mask is not None and attn_mask.requires_grad)):
            return self._dispatcher.attention(query, key, value, attn_mask, 0.0, self._causal, scale=self._scale,
                                              enable_gqa=self._gqa)
        self._count[0] += 1
        try:
            return plan.run(query, key, value, attn_mask, self._scale, self._gqa, plan.problem)
        except Exception as error:  # noqa: BLE001 - the dispatcher's fallback takes over
            return self._dispatcher._cold.recover(plan, self._key, error, query, key, value, attn_mask, self._scale, self._gqa)

    def __repr__(self) -> str:
        return f"PreparedAttention({self._plan.decision.summary()})"


_FIELDS = ("query shape", "key shape", "value shape", "query dtype", "key dtype", "value dtype", "query device",
           "key device", "value device", "query, key and value contiguous", "mask (shape, dtype, device, class)",
           "is_causal", "enable_gqa")


def _mismatch(planned: tuple, given: tuple) -> str:
    """One line naming every field where `given` differs from `planned`."""
    diffs = [f"{name} {want} planned, {got} given" for name, want, got in zip(_FIELDS, planned, given, strict=True)
             if want != got]
    return ("this PreparedAttention was planned for another call: " + "; ".join(diffs)
            + " (call dispatcher.plan(...) for the new shape)")
