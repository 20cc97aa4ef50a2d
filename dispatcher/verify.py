"""A table's picks checked by the stopwatch on a bucket's first call, before the bucket follows them.

A threshold table predicts; it does not measure the bucket in hand. On the H200 the bundled table
predicted `small_q[splits=1]` for a batch-8 decode over a sliced 8k cache at 0.35 ms per call,
where PyTorch's default took 0.07 ms (bench/decode_loop.py, 2026-12-01: 5.4x slower per token);
on the 580-shape LLM grid it kept PyTorch's default where flash was 2.5-3.3x faster (small-Q
calls against 32k-128k keys; bench/llm_grid.py, docs/RESULTS.md section 12). So where a table
measured on this card (not the prior) decides a bucket that no measured entry decides (none, or one
whose winner is PyTorch's default only by a tie: a faster kernel's spread overlaps it, as for flash
at 2k keys on the H200, timed at 22-24 us in three sessions and 39-45 us in two against the
default's ~30 us: docs/RESULTS.md section 18; a tie with the backend the default runs anyway still
decides: `ranking.entry_decides_bucket`), its first call
times a few options on the call's own inputs (the tuner's interleaved rounds, `tuning.tune`) and
the bucket takes the fastest; PyTorch's choice stays unless another is faster beyond the noise
(`tuning.MIN_WIN_MARGIN`). Which options (`checked_options`):

- the table's first `CHECKED_CHOICES`, PyTorch's default, and on a GPU ``sdpa_flash``: simulated
  on the grid's measurements (bench/first_call_check_simulation.py), this picks 1.51x PyTorch's
  default (1.006x the fastest kernel), against 1.39x for the table's first choice checked alone,
  and as well as tuning's up to seven contenders; on the 2-core CPU, after three quick
  calibrations each, the held-out shapes ran at 0.89-1.01x PyTorch's default (geomean) with the
  check, against 1.06-1.15x without it (bench/quick_mode_cpu.py, 2026-12-01);
- on a CPU, also the table's first option of each of our own kernel families not among those
  (`own_family_options`): after three quick calibrations each, alternating, the held-out CPU shapes
  ran at 1.09-1.11x the fastest kernel with the first of our kernels timed where the table's
  first two were PyTorch's, against 1.17-1.18x without (bench/quick_mode_cpu.py, 2026-12-02,
  docs/RESULTS.md section 8); one per family since session 16: the shape that stayed worst
  (B3 8/1 heads, one query row, 3000 keys, fp32) had one of our families timed while another was
  fastest; with every family timed it ran at 1.17-1.21x the fastest against 1.22-1.89x, three
  alternating runs each on a loaded VM whose bench noise is of that size (section 22);
- except decode on a GPU (one query row) with PyTorch's backends, where only a table pick other
  than the default is checked against it: there PyTorch's default was within 2% of the fastest
  kernel on the grid, these calls are host-bound (a stopwatch on one decode call is least
  reliable there), and the one transformers run that timed wider there (tuning) chose a kernel
  that ran at 0.6x PyTorch;
- the table's first two alone in the portable set (a card without fused backends: gfx906), where
  PyTorch's default is the last resort, not a contender;
- and where PyTorch's default sets up per exact shape (cuDNN on the H200: ~36 ms per new length),
  flash, else the table's first option free of set-up (`SETUP_FREE_CHECKED`), so that a bucket
  whose shapes keep changing swaps to a kernel whose warm time was measured, not predicted
  (`buckets.Bucket.order_for_new_shape`). On the H200 a batch-8 decode over 32k keys had swapped,
  on the table's prediction, to our `math` kernel: 1.4 ms a call where PyTorch's warm default
  takes 0.25 ms, 5.6x slower per token once its shapes settled on the default (bench/decode_loop.py,
  2026-12-01, docs/RESULTS.md section 13). Only one such option is timed, to bound the first
  call: with the table's first set-up-free option timed besides flash, the grid's first calls took
  a median 30 ms (p90 102 ms; run 5, a 294-shape sample) against 21 ms (p90 55 ms) in run 1 (all
  shapes, without it); the two runs differ in their shapes too, so this is indicative only.

Once per bucket, on the CPU and CUDA/ROCm devices (the stopwatch, `calibration.timer.time_batch`,
synchronises only those), with options predicted under `MAX_CHECKED_SECONDS` per call. Not where
the table's quality guard did not keep its model (its verdict is the prior's or PyTorch's default:
those serve unchecked), nor for a bucket first decided on the training route or while a CUDA graph
was captured (no inputs to time: its later inference calls keep that decision). Off with
``ATTN_DISPATCH_VERIFY=0``. Full tuning (``ATTN_DISPATCH_TUNE=1``) times every close contender
instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_dispatch.dispatcher.planning import Option
from attn_dispatch.dispatcher.ranking import FALLBACK_FIRST
from attn_dispatch.dispatcher.tuning import put_first, tune
from attn_dispatch.kernels import Problem
from attn_dispatch.kernels.registry import uses_fused_backend, working_family
from attn_dispatch.models.environment import VERIFY

CHECKED_CHOICES = 2
"""The table's first choices a bucket's first call times (with PyTorch's default): two reached
1.456x PyTorch's default on the H200 grid simulation, three 1.471x, two plus flash 1.508x."""

GPU_ALSO_CHECKED = "sdpa_flash"
"""Timed on a GPU bucket's first call wherever it can run: the fastest backend on 303 of the
probe's 580 H200 shapes (shared/reference/h200-probe.md), and what the table most often passed
over where it cost most (small-Q calls against long caches)."""

SETUP_FREE_CHECKED = 1
"""Options free of per-shape set-up also timed where PyTorch's default pays one and flash cannot run
the problem: the table's first such; a new shape of the bucket swaps only to a kernel timed here."""

MAX_CHECKED_SECONDS = 0.02
"""Options predicted slower than this per call are not timed (and no check runs where PyTorch's default
is one): each timed option costs two sizing calls and up to `tuning.TUNE_ROUNDS` samples of at least
one call (rounds stop after `tuning.TUNE_BUDGET_S`), so up to 4 options (6 on a CPU, one per family
of ours) x 7 calls of 20 ms, about 0.6-0.8 s, once per bucket; calls of ~1 ms cost a check ~0.1 s
(the CPU's quick-mode held-out buckets: first calls of 80-114 ms with the check against 5-15 ms
without, a new user's run, 2026-12-01). Slower calls (a long video attention on a CPU takes seconds)
are left to the table, or to tuning where the user asks for it."""

TIMED_DEVICE_TYPES = ("cpu", "cuda")
"""Where the stopwatch's times are the kernels' own (`calibration.timer.time_batch` synchronises
CUDA/ROCm; other accelerators queue work and would be timed at launch)."""


def is_default(option: Option) -> bool:
    """PyTorch's own choice as a contender (not the portable set's last resort)."""
    return option.kernel.name == FALLBACK_FIRST and not getattr(option.kernel, "last_resort", False)


def checked_options(options: tuple[Option, ...], device: torch.device, problem: Problem, *,
                    portable: bool = False, sets_up: frozenset[str] = frozenset()) -> tuple[Option, ...]:
    """The options a bucket's first call times (module docstring), in the table's order, PyTorch's
    default among them (`portable`: the portable set, whose default is its last resort: the first
    two alone); empty where there is nothing to check. `sets_up`: names of the options that pay a
    material per-shape set-up (`cold_shape.costly_setups`)."""
    if portable:
        checked = tuple(option for option in options[:CHECKED_CHOICES] if _fast_enough(option))
        return checked if len(checked) > 1 else ()
    default = next((option for option in options if is_default(option)), None)
    if default is None or not _fast_enough(default):
        return ()
    if device.type == "cuda" and problem.q_len == 1:  # decode on a GPU: the table's pick against the default
        picked = [options[0]] if not is_default(options[0]) else []
    else:
        picked = list(options[:CHECKED_CHOICES])
        if device.type == "cuda":
            picked += [option for option in options if option.kernel.name == GPU_ALSO_CHECKED]
        elif device.type == "cpu":
            picked += own_family_options(options, picked)
    if default.kernel.name in sets_up:  # what a new shape may swap to must have been timed (`Bucket.may_replace_first`)
        free = [option for option in options if option.kernel.name not in sets_up and _fast_enough(option)]
        picked += [option for option in free if option.kernel.name == GPU_ALSO_CHECKED] or free[:SETUP_FREE_CHECKED]
    names = {option.kernel.name for option in picked} | {default.kernel.name}
    checked = tuple(option for option in options if option.kernel.name in names and _fast_enough(option))
    return checked if len(checked) > 1 else ()


def own_family_options(options: tuple[Option, ...], picked: list[Option]) -> list[Option]:
    """The table's first option of each of our own kernel families (`math`, `small_q`, `chunked`,
    conversions of them) that `picked` lacks, in the table's order, among the options fast enough
    to time (`_fast_enough`: a family whose first option is too slow is represented by its next).
    Timed on a CPU bucket's first call: after quick calibrations the misses on held-out CPU shapes
    were fp32 decode calls against 3000-5000 keys where `math` or `small_q` was fastest and the
    table ranked PyTorch's backends first, with one of our families timed and another fastest
    (docs/RESULTS.md sections 8, 12 and 22). On the H200 grids timing the first of ours changed no
    pick (`bench/first_call_check_simulation.py`, policy shipped+family): GPUs keep their own rule."""
    families = {working_family(option.kernel) for option in picked if _fast_enough(option)}
    chosen = []
    for option in options:
        family = working_family(option.kernel)
        if not uses_fused_backend(option.kernel) and family not in families and _fast_enough(option):
            families.add(family)
            chosen.append(option)
    return chosen


def _fast_enough(option: Option) -> bool:
    return option.predicted_s is None or option.predicted_s <= MAX_CHECKED_SECONDS


def verification_wanted(options: tuple[Option, ...], device: torch.device, problem: Problem, *,
                        entry_decides: bool, table_measured: bool, portable: bool = False,
                        sets_up: frozenset[str] = frozenset()) -> bool:
    """Whether a bucket's first call checks the table (module docstring): verification on, a
    device the stopwatch times, the ranking is a table measured on this card whose guard kept its
    model (`table_measured`; the prior keeps PyTorch's default first), no measured entry decides the
    bucket (`entry_decides`: `DeviceRanking.entry_decides`), and there is something to check."""
    if not VERIFY.read():
        return False
    if device.type not in TIMED_DEVICE_TYPES or entry_decides or not table_measured or not options:
        return False
    return bool(checked_options(options, device, problem, portable=portable, sets_up=sets_up))


def verify_against_default(options: tuple[Option, ...], notes: tuple[str, ...], problem: Problem,
                           device: torch.device, inputs: tuple,
                           on_failure: Callable[[str, BaseException], None], *, portable: bool = False,
                           sets_up: frozenset[str] = frozenset()):
    """Time `checked_options` on `inputs`; returns (options, notes, seconds per timed kernel name):
    the measured fastest first, PyTorch's default unless another won beyond the noise."""
    checked = checked_options(options, device, problem, portable=portable, sets_up=sets_up)
    tuned = tune(checked, inputs, problem, device, on_failure=on_failure, exactly=True)
    if tuned is None:
        return options, notes, {}
    first = options[0].kernel.name
    options = put_first(options, tuned.kernel)
    outcome = "the table's first choice stays" if tuned.kernel == first else f"{tuned.kernel} replaces the table's {first}"
    timed = "the table's first choices" if portable else "the table's first choices and PyTorch's own"
    note = f"checked on the first call ({timed}): {tuned.timings()}; {outcome}"
    return options, (*notes, note), dict(tuned.seconds)
