"""A table's pick checked against PyTorch's own choice before a bucket follows it.

A threshold table predicts; it does not measure the bucket in hand. On the H200 the bundled table
predicted `small_q[splits=1]` for a batch-8 decode over a sliced 8k cache at 0.35 ms per call,
where PyTorch's default took 0.07 ms (bench/decode_loop.py, 2026-12-01: 5.4x slower per token).
So where a table (without a measured entry for the bucket) puts another kernel before
``sdpa_default`` on a GPU, the bucket's first call times the two on the call's own inputs (the
tuner's interleaved rounds, `tuning.tune`) and PyTorch's choice stays unless the other is faster
beyond the noise (`tuning.MIN_WIN_MARGIN`). Once per bucket; off with ``ATTN_DISPATCH_VERIFY=0``.
Full tuning (``ATTN_DISPATCH_TUNE=1``) times every close contender instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from attn_dispatch.dispatcher.planning import Option
from attn_dispatch.dispatcher.ranking import FALLBACK_FIRST
from attn_dispatch.dispatcher.tuning import put_first, tune
from attn_dispatch.kernels import Problem

VERIFY_ENV = "ATTN_DISPATCH_VERIFY"
OFF_VALUES = ("0", "false", "no", "off")


def is_default(option: Option) -> bool:
    """PyTorch's own choice as a contender (not the portable set's last resort)."""
    return option.kernel.name == FALLBACK_FIRST and not getattr(option.kernel, "last_resort", False)


def verification_wanted(options: tuple[Option, ...], device: torch.device, measured_here: bool) -> bool:
    """A GPU bucket whose first option is not PyTorch's default, with the default among the
    options and no measured entry for the bucket (`measured_here`), while verification is on."""
    if os.environ.get(VERIFY_ENV, "").strip().lower() in OFF_VALUES:
        return False
    if device.type != "cuda" or measured_here or not options or is_default(options[0]):
        return False
    return any(is_default(option) for option in options[1:])


def verify_against_default(options: tuple[Option, ...], notes: tuple[str, ...], problem: Problem,
                           device: torch.device, inputs: tuple,
                           on_failure: Callable[[str, BaseException], None]):
    """Time the first option against ``sdpa_default`` on `inputs`; returns (options, notes,
    seconds per timed kernel name): the default first unless the other won beyond the noise."""
    default = next(option for option in options if is_default(option))
    tuned = tune((options[0], default), inputs, problem, device, on_failure=on_failure)
    if tuned is None:
        return options, notes, {}
    timed = tuned.timings()
    if tuned.kernel != options[0].kernel.name:
        options = put_first(options, tuned.kernel)
        note = f"the table's pick was checked against PyTorch's own choice on the first call and lost: {timed}"
    else:
        note = f"the table's pick was checked against PyTorch's own choice on the first call: {timed}"
    return options, (*notes, note), dict(tuned.seconds)
