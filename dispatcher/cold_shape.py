"""What a kernel pays the first time it meets an exact shape, and when that should change a decision.

Some kernels set up per exact shape: PyTorch's cuDNN attention builds (and caches) an execution
plan for every new combination of lengths, which took milliseconds on an H200 where the warm call
takes tens of microseconds (issue 14: a fresh-process decode step with a growing KV cache paid
~8 ms per call for a new key length, against 0.04 ms warm; causal prefill at a new length, 60 ms
cold against 0.06-0.27 ms warm; torch 2.11). Calibration and tuning time kernels at a fixed shape,
so they never see that cost. A bucket whose exact shapes keep changing (decode: the key length
grows by one per token; a server: a new prompt length per request) must weigh it; a bucket whose
shape repeats (a denoising loop, a fixed-length batch) must not.

The weighing, per new exact shape of a decided bucket (`expected_seconds`):
``warm seconds + cold seconds / expected calls at this shape``, where the expected calls are what
the bucket's earlier shapes got (decode: one call per layer per token), and the cold seconds count
only for a kernel that has not run this exact shape in this process yet (`SeenShapes`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

import torch

from attn_dispatch.dispatcher.decision import format_seconds
from attn_dispatch.kernels import Kernel, Problem
from attn_dispatch.kernels.registry import uses_fused_backend
from attn_dispatch.kernels.sdpa_probe import default_backend_choice
from attn_dispatch.models.cold_shape_store import kind_of, load_cold_costs

CUDNN_COLD_SHAPE_PRIOR_S = 8e-3
"""Seconds cuDNN attention spends on its first call at a new exact shape, where calibration did
not measure it (`cold_shape_costs` on the card replaces it): the smaller of the two H200 figures in
issue 14 (a decode step: 64 ms for 8 layers at a new key length, against 0.35 ms warm; prefill at a
new length: 60 ms), torch 2.11. Every other PyTorch backend and our own kernels launch the same
kernels at any shape and are taken as free of per-shape set-up unless measured otherwise."""

MATERIAL_SETUP_S = 1e-3
"""A per-shape set-up worth timing another kernel against on a bucket's first call
(`measured_candidates.measured_candidates`): cuDNN's measured 36-44 ms on the H200; flash's and the memory-efficient
backend's measured 2-13 us are the measurement's floor (calibration.cold_shape, torch 2.11). Counting
flash's 2 us as a set-up left it out of that check: the H200's batch-8 1k decode then swapped to
`convert[contiguous]+sdpa_flash`, 2.7-3.0x slower per token than PyTorch warm (against 1.33x with flash;
docs/RESULTS.md section 13)."""

MIN_SHAPES_OF_HISTORY = 1
"""Earlier exact shapes a bucket must have served before its calls per shape are estimated: one
finished shape tells how many calls a shape gets (a decode step calls every layer once)."""

HISTORY = 8
"""Most recent exact shapes of a bucket whose call counts estimate the next one's (the median)."""

MAX_SEEN_SHAPES = 1 << 16
"""Exact shapes remembered per kernel as already set up in this process (about 10 MB at most);
past it, new shapes are not recorded (they count as unseen: the weighing stays conservative)."""


def cold_kernel_family(kernel: Kernel, problem: Problem) -> str | None:
    """The per-shape set-up this kernel pays on `problem`, named by the backend that pays it
    (``"sdpa_cudnn"``), or None. ``sdpa_default`` pays it where PyTorch's own choice for such
    problems is cuDNN; ``convert[...]+k`` where its inner kernel does."""
    inner = getattr(kernel, "inner", None)
    if inner is not None:
        return cold_kernel_family(inner, problem)
    family = kernel.family
    if family == "sdpa_default" and problem.device_type == "cuda":
        family = default_backend_choice(problem)
    return family if family == "sdpa_cudnn" and problem.device_type == "cuda" else None


def cold_seconds(kernel: Kernel, problem: Problem, measured: Mapping[str, Mapping[str, float]]) -> float:
    """Seconds of per-shape set-up on the first call of `kernel` at a new exact shape: measured on
    this card for this kernel and kind of problem (`models.cold_shape_store`) when it was, else
    the prior of the backend that pays it (`cold_kernel_family`), else 0."""
    kind = kind_of(problem.q_len)
    by_kind = measured.get(kernel.name)
    if by_kind is not None and kind in by_kind:
        return by_kind[kind]
    family = cold_kernel_family(kernel, problem)
    if family is None:
        return 0.0
    return measured.get(family, {}).get(kind, CUDNN_COLD_SHAPE_PRIOR_S)


def costly_setups(options: Iterable, problem: Problem, measured: Mapping[str, Mapping[str, float]]) -> frozenset[str]:
    """Names of the `options` (`planning.Option`) whose per-shape set-up on `problem` is material
    (`MATERIAL_SETUP_S`): what a bucket whose shapes keep changing should time another kernel against."""
    return frozenset(o.kernel.name for o in options if cold_seconds(o.kernel, problem, measured) >= MATERIAL_SETUP_S)


def calls_per_shape(counts: Iterable[int]) -> float | None:
    """Median calls the bucket's earlier exact shapes got (None: too little history)."""
    history = [count for count in counts if count > 0]
    if len(history) < MIN_SHAPES_OF_HISTORY:
        return None
    return float(statistics.median(history))


def expected_seconds(warm_s: float | None, cold_s: float, expected_calls: float | None) -> float | None:
    """Seconds per call over an exact shape's life: warm time plus the set-up spread over the
    calls the shape is expected to get. None when the warm time is unknown and nothing is added."""
    extra = cold_s / expected_calls if cold_s and expected_calls else 0.0
    if warm_s is None:
        return extra or None
    return warm_s + extra


TIED_LOSS_SHARE = 0.05
"""Share of the decided kernel's warm time that a kernel run in its place is taken to lose per call
where the numbers alone say it loses nothing: the bucket's order put the decided kernel first all
the same, because the table judged the gap within its measurements' noise (a measured entry whose
times overlap across sessions; a prediction within the quality guard's margin, 5% in the bundled
H200 table, `models.guard.choose_default_margin`). Taken as no loss, such a swap never settled: a
shape called for good ran the kernel the table had ranked second. On the H200, flash times recorded
for one bucket moved between 22 and 45 us across sessions where PyTorch's default took ~30 us
(docs/RESULTS.md section 18), so "predicted no slower" is no evidence of it. The smallest non-zero
margin the guard chooses from is the smallest gap a table treats as real: it is the loss assumed.
Not measured in a loop on the card (the grid's buckets see one shape each: it never swaps)."""


def settle_after(cold_s: float, warm_first_s: float | None, warm_chosen_s: float | None) -> int:
    """Calls of one exact shape after which its plan moves to the kernel that sets up per shape
    (0: never). Until then the shape runs a kernel slower per call but free of set-up; once the
    calls have lost as much as the set-up costs, paying it is the better bet for a shape that
    keeps being called (the ski-rental rule: never more than twice the best cost in hindsight).
    A repeated decode loop (a server generating over the same key lengths again and again) then
    ends up on PyTorch's warm choice; a loop that meets every shape a few times never pays.

    The loss per call is taken as at least `TIED_LOSS_SHARE` of the decided kernel's time, whatever
    the numbers say: the bucket's order put the decided kernel first (a measured tie, the guard's
    margin, a region kept for PyTorch's default, the first-call check), so a gap under that share,
    or in the swapped kernel's favour, is not one the decision believed. The ski-rental bound holds
    against that assumed loss; where the true loss is smaller the shape settles sooner than it
    would pay to. 0 where no loss is known (a time missing, zero or unpriced)."""
    if not cold_s or warm_first_s is None or warm_chosen_s is None:
        return 0
    loss = max(warm_chosen_s - warm_first_s, TIED_LOSS_SHARE * warm_first_s)
    if not (loss > 0 and math.isfinite(loss)):  # a zero or infinite (unpriced) time: nothing to weigh
        return 0
    return max(1, math.ceil(round(cold_s / loss, 6)))  # 1e-3 / 1e-6 is 1000.0000000000001


class SeenShapes:
    """Per kernel, the exact shapes (plan cache keys) it has already run in this process: its
    per-shape set-up is paid there, so a kernel with a cold-shape cost is not charged it again."""

    def __init__(self) -> None:
        self._seen: dict[str, set] = {}

    def add(self, kernel_name: str, shape_key: tuple) -> None:
        seen = self._seen.setdefault(kernel_name, set())
        if len(seen) < MAX_SEEN_SHAPES:
            seen.add(shape_key)

    def has(self, kernel_name: str, shape_key: tuple) -> bool:
        return shape_key in self._seen.get(kernel_name, ())



class SpentCalls:
    """Calls already made on exact shapes whose plans were evicted before they settled
    (`settle_after`): the shape's next plan settles that many calls sooner, so a long-running
    server whose key lengths outnumber the plan cache (`buckets.MAX_PLANS`; a 32k-token context
    alone has 32k of them) still ends on the kernel that sets up, as a shape's calls add up.
    At most `MAX_SEEN_SHAPES` shapes: about 38 MB per device planner when full (a review's
    measurement, session 14); every swapped plan has a settle point since `TIED_LOSS_SHARE`."""

    def __init__(self) -> None:
        self._calls: dict[tuple, int] = {}

    def add(self, shape_key: tuple, calls: int) -> None:
        if calls > 0 and (shape_key in self._calls or len(self._calls) < MAX_SEEN_SHAPES):
            self._calls[shape_key] = self._calls.get(shape_key, 0) + calls

    def settle_at(self, shape_key: tuple, settle_at: int) -> int:
        """`settle_at` for a new plan of `shape_key`, less the calls spent there before (at least 1)."""
        spent = self._calls.pop(shape_key, 0)
        return max(1, settle_at - spent) if settle_at and spent else settle_at


def measured_costs(device: torch.device, home: str | None, field: str = "seconds") -> dict[str, dict[str, float]]:
    """The per-shape set-up costs (``field="floor_seconds"``: per-call floors) measured for this
    device's card (`models.cold_shape_store`); {} where none were, off GPUs (where no kernel is
    known to set up per shape) and on any error."""
    if device.type != "cuda":
        return {}
    try:
        from attn_dispatch.models.identity import DeviceIdentity

        return load_cold_costs(DeviceIdentity.detect(device), home=home, field=field)
    except Exception:  # noqa: BLE001 - a missing or damaged file never fails a call: the priors serve
        return {}


def floor_seconds(kernel: Kernel, floors: Mapping[str, Mapping[str, float]]) -> float | None:
    """`kernel`'s measured per-call floor: the smallest time per call measured for it, or for
    another variant of its family (the floor is the launch sequence's host time, which the variants
    share: ``small_q[splits=1]`` launches what ``small_q[splits=16]`` does), over every kind of probe
    (decode and prefill alike: the smallest is the floor, whichever probe measured it); None when
    none was measured, and for PyTorch's fused backends (one launch, a conversion's inner one
    included: `kernels.registry.uses_fused_backend`).

    Only the smallest is a floor: each kind's probe is one problem (`calibration.cold_shape`), and
    a kernel that is busy on it measures its time there, not its launch cost. On the H200 the
    prefill probe (1024 x 1024 causal, 32 heads) took flash 79 us against 27 us on the decode probe;
    taken per kind, that "floor" put PyTorch's default ahead of flash on Lq 2-64 shapes where flash
    ran in 25-40 us and the default in 50-150 us (1.5-3.8x slower; `bench/results/h200_session9`).
    The fused backends' times at every size are in the table's own measurements."""
    if uses_fused_backend(kernel):
        return None
    inner = getattr(kernel, "inner", None)
    if inner is not None:  # a conversion: its own floor, else its inner kernel's (which it only adds to)
        own = floors.get(kernel.name)
        return min(own.values()) if own else floor_seconds(inner, floors)
    prefix = kernel.family + "["
    measured = [seconds for name, by_kind in floors.items() if name == kernel.name or name == kernel.family
                or name.startswith(prefix) for seconds in by_kind.values()]
    return min(measured) if measured else None


def floor_order(options: tuple, problem: Problem, warm: Sequence[float | None],
                floors: Mapping[str, Mapping[str, float]]) -> tuple[tuple, str | None]:
    """`options` with the first moved behind the fastest of the others by ``max(warm seconds, the
    kernel's measured per-call floor)`` where the first's own floor lifts it above that one (None:
    unchanged). A kernel's floor (`floor_seconds`), the least time per call back to back measured
    for it on this card's small probes (`calibration.cold_shape`), bounds any problem from below: a
    table that predicts a many-launch kernel under it (a Python kernel on a 20 us decode call)
    extrapolated past what the card can do.

    Only a floor that lifts the first option reorders. The order is the table's, and more than its
    times decided it: a measured entry whose kernels overlap within their spread, or a prediction
    within the quality guard's margin of PyTorch's default, puts the default first although another
    kernel's time is lower (`models.table.ThresholdTable.rank`). Re-sorted by time wherever any
    floor was known, that order was lost: on the H200 grid 114 of 580 buckets (and 51 of 300
    off-grid shapes) left PyTorch's default for a backend with no floor at all; of the grid's 49
    that went to flash or the efficient backend, 17 ran >3% slower than the default in run 1 and 15
    in run 3 (session 14, `bench.diagnostics.bucket_order`)."""
    first_floor = floor_seconds(options[0].kernel, floors) if options else None
    if first_floor is None or warm[0] is None or first_floor <= warm[0]:
        return options, None
    effective = []
    for option, seconds in zip(options, warm, strict=True):
        floor = floor_seconds(option.kernel, floors)
        effective.append(None if seconds is None else max(seconds, floor or 0.0))
    known = [i for i, s in enumerate(effective) if s is not None]
    best = min(known, key=effective.__getitem__)
    if best == 0 or effective[best] >= effective[0]:
        return options, None
    first, chosen = options[0], options[best]
    note = (f"{first.kernel.name} takes at least {format_seconds(effective[0])} per call on this card "
            f"(its measured floor): {chosen.kernel.name} is predicted faster ({format_seconds(effective[best])})")
    return (chosen, *(o for o in options if o is not chosen)), note
