"""Which kernels a bucket measures on its calls (`measuring`), and whether it measures at all.

A bucket measures where no measured table entry of this card decides it (`measuring_wanted`). Its
candidates (`measured_candidates`), in the ranking's order behind the baseline:

- the baseline: PyTorch's default where it is a contender (what the caller had without us), else
  the ranking's first choice (the portable set, gfx906's, where the default is the last resort);
- the ranking's first `RANKED_CANDIDATES` other options: simulated on the H200 grid's measurements
  (bench/first_call_check_simulation.py), timing the table's first two choices with PyTorch's
  default and flash picked 1.51x PyTorch's default (1.006x the fastest kernel), as well as timing
  up to seven contenders did;
- on a GPU, ``sdpa_flash`` wherever it runs (`GPU_ALSO_MEASURED`);
- on a CPU, the ranking's first option of each of our own kernel families not among those
  (`own_family_options`);
- where PyTorch's default sets up per exact shape (cuDNN), flash, else the ranking's first option
  free of set-up (`SETUP_FREE_MEASURED`), so that a bucket whose shapes keep changing swaps only to
  a kernel whose warm time was measured (`buckets.Bucket.may_replace_first`);
- except decode on a GPU (one query row) with PyTorch's backends: only the ranking's first choice
  when it is not the default (`decode_on_gpu`).

At most `MAX_CANDIDATES` in all. The measuring's budget (`measuring.BUDGET_CALLS`) bounds what the
slower ones cost, whatever their number.
"""

from __future__ import annotations

import torch

from attn_dispatch.dispatcher.call_timing import clock_for
from attn_dispatch.dispatcher.planning import Option
from attn_dispatch.dispatcher.ranking import FALLBACK_FIRST
from attn_dispatch.kernels import Problem
from attn_dispatch.kernels.registry import uses_fused_backend, working_family

RANKED_CANDIDATES = 2
"""The ranking's first choices measured besides the baseline: two plus PyTorch's default and flash
reached 1.508x PyTorch's default on the H200 grid simulation, three alone 1.471x, two alone 1.456x."""

GPU_ALSO_MEASURED = "sdpa_flash"
"""Measured on a GPU bucket wherever it can run: the fastest backend on 303 of the probe's 580 H200
shapes (shared/reference/h200-probe.md), and what the H200 table most often passed over where it
cost most (small-Q calls against long caches)."""

SETUP_FREE_MEASURED = 1
"""Options free of per-shape set-up also measured where PyTorch's default pays one and flash cannot
run the problem: the ranking's first such."""

MAX_CANDIDATES = 7
"""Candidates of one bucket at most, the baseline included: what burst tuning timed at most (six
contenders and PyTorch's default, 97% of held-out H200 problems within 2% of the fastest)."""

SAME_CARD_LEVELS = ("exact", "model")
"""Table lookup levels whose measured entries were measured on this card model: a family stand-in's
entries are another card's times, scaled, and decide nothing here."""


def is_default(option: Option) -> bool:
    """PyTorch's own choice as a contender (not the portable set's last resort)."""
    return option.kernel.name == FALLBACK_FIRST and not getattr(option.kernel, "last_resort", False)


def measuring_wanted(device: torch.device, *, entry_decides: bool, level: str) -> bool:
    """Whether a bucket measures its candidates on its calls: its device's calls can be timed without
    waiting (`call_timing.clock_for`) and no measured table entry of this card decides it
    (`entry_decides`: `ranking.DeviceRanking.entry_decides`, at a lookup `level` of this card)."""
    return clock_for(device) is not None and not (entry_decides and level in SAME_CARD_LEVELS)


def measured_candidates(options: tuple[Option, ...], device: torch.device, problem: Problem, *,
                        portable: bool = False, sets_up: frozenset[str] = frozenset()) -> tuple[Option, ...]:
    """The options a bucket measures (module docstring), the baseline first, then in the ranking's
    order; empty where there is nothing to choose between. `sets_up`: names of the options that pay
    a material per-shape set-up (`cold_shape.costly_setups`)."""
    default = next((option for option in options if is_default(option)), None)
    baseline = options[0] if portable or default is None else default
    others = [option for option in options if option is not baseline]
    if device.type == "cuda" and problem.q_len == 1 and not portable:
        picked = [options[0]] if options[0] is not baseline else []
    else:
        picked = others[:RANKED_CANDIDATES]
        if device.type == "cuda":
            picked += [option for option in others if option.kernel.name == GPU_ALSO_MEASURED]
        elif device.type == "cpu":
            picked += own_family_options(others, [baseline, *picked])
    if baseline.kernel.name in sets_up:
        free = [option for option in others if option.kernel.name not in sets_up]
        picked += [option for option in free if option.kernel.name == GPU_ALSO_MEASURED] or free[:SETUP_FREE_MEASURED]
    names = {option.kernel.name for option in picked}
    chosen = (baseline, *(option for option in others if option.kernel.name in names))[:MAX_CANDIDATES]
    return chosen if len(chosen) > 1 else ()


def own_family_options(options: list[Option], picked: list[Option]) -> list[Option]:
    """The first option of each of our own kernel families (`math`, `small_q`, `chunked`, conversions
    of them) that `picked` lacks, in the ranking's order. Measured on a CPU bucket: after quick
    calibrations the misses on held-out CPU shapes were fp32 decode calls against 3000-5000 keys
    where `math` or `small_q` was fastest and the table ranked PyTorch's backends first, with one of
    our families timed and another fastest (docs/RESULTS.md sections 8, 12 and 22). On the H200 grids
    timing the first of ours changed no pick (`bench/first_call_check_simulation.py`, policy
    shipped+family): GPUs keep their own rule."""
    families = {working_family(option.kernel) for option in picked}
    chosen = []
    for option in options:
        family = working_family(option.kernel)
        if not uses_fused_backend(option.kernel) and family not in families:
            families.add(family)
            chosen.append(option)
    return chosen
