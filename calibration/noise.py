"""Is this machine quiet enough to time kernels? A fixed reference point, timed as a series of
short samples before measuring starts and again when it ends, says how noisy timings are now.

The spread is the interquartile range of the samples over their median (each sample is one call,
or a batch of back-to-back calls lasting ~2 ms where one call is shorter, as in `calibration.timer`). Over `BUSY_SPREAD` the machine is
called busy: the calibration widens its timer (`widened`: more samples per point) and says so;
over `STOP_SPREAD` it stops before measuring, with a message, unless the user allows a busy
machine (``calibrate --allow-busy``): timings that noisy rank kernels at random.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

import torch

from attn_dispatch.calibration.inputs import make_inputs
from attn_dispatch.calibration.timer import TimerSettings, interquartile_range, time_repetitions
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.kernels.problem import Problem

# The reference point: the math kernel on a 256 x 256, 4-head, D=64 fp32 problem (67 MFLOP: ~7 ms
# on a 2-core CPU at ~10 GFLOP/s, models/_cpu_probe.py, so a probe takes ~0.1 s on a quiet one;
# microseconds on a GPU, batched to ~2 ms samples there).
REFERENCE_LENGTH = 256
REFERENCE_HEADS = 4
REFERENCE_HEAD_DIM = 64
# Samples in one probe: with 15, one stray sample (a context switch) moves neither quartile.
PROBE_SAMPLES = 15
PROBE = TimerSettings(warmup=2, min_reps=PROBE_SAMPLES, max_reps=PROBE_SAMPLES, target_relative_iqr=0.0,
                      budget_s=math.inf)
# Busy above this spread: `calibration.timer.QUICK` stops a point at a 10% relative IQR and DEFAULT
# at 5%; a reference point whose IQR is twice QUICK's target cannot reach it in QUICK's 3-10
# samples, so its medians carry noise comparable to the 10-30% gaps between close kernels.
BUSY_SPREAD = 0.20
# Stop above this spread: samples of one call varying by half their median (measured on this
# project's shared 2-core VM with ~6 other processes running: see docs/RESULTS.md, "quick mode on a
# busy machine") leave most of a quick sweep's kernel orderings to chance.
STOP_SPREAD = 0.50
# A busy machine's timer: at least this many samples per point, and this many times the budget.
WIDE_MIN_REPS = 7
WIDE_BUDGET_FACTOR = 2.0


@dataclass(frozen=True)
class Noise:
    """One probe: the reference point's median seconds and relative spread (IQR / median)."""

    median_s: float
    spread: float

    @property
    def busy(self) -> bool:
        return self.spread > BUSY_SPREAD

    @property
    def too_busy(self) -> bool:
        return self.spread > STOP_SPREAD

    def describe(self) -> str:
        verdict = "too busy to calibrate" if self.too_busy else "busy" if self.busy else "quiet"
        return (f"{verdict}: reference point {self.median_s * 1e3:.2f} ms, spread {self.spread:.0%} "
                f"(busy over {BUSY_SPREAD:.0%}, stop over {STOP_SPREAD:.0%})")


def reference_problem(device_type: str) -> Problem:
    return Problem(
        batch=1, q_heads=REFERENCE_HEADS, kv_heads=REFERENCE_HEADS, q_len=REFERENCE_LENGTH,
        kv_len=REFERENCE_LENGTH, head_dim=REFERENCE_HEAD_DIM, value_dim=REFERENCE_HEAD_DIM, dtype="float32",
        device_type=device_type,
    )


def probe_noise(device: torch.device | str, *, samples: list[float] | None = None) -> Noise:
    """Time the reference point (`PROBE_SAMPLES` samples) and return its spread.

    `samples` (seconds) skips the timing: tests and benches score a series they have.
    """
    if samples is None:
        device = torch.device(device)
        problem, kernel = reference_problem(device.type), MathKernel()
        inputs = make_inputs(problem, device)
        collected: list[float] = []

        def keep(series: list[float]) -> bool:
            collected[:] = series
            return False

        with torch.inference_mode():
            time_repetitions(
                lambda i: kernel.run(inputs.query, inputs.key, inputs.value, None, None, False, problem),
                device, PROBE, should_stop=keep,
            )
        samples = collected
    median = statistics.median(samples)
    return Noise(median, interquartile_range(samples) / median if median > 0 else math.inf)


class MachineBusy(ValueError):
    """The reference point's spread is over `STOP_SPREAD`: calibrating now would store noise."""


def check_quiet(noise: Noise, *, allow_busy: bool) -> None:
    """Raise `MachineBusy` (a one-line message saying what to do) when the machine is too busy."""
    if noise.too_busy and not allow_busy:
        raise MachineBusy(
            f"this machine is too busy to calibrate ({noise.describe().split(': ', 1)[-1]}): nothing was measured and no "
            "table was written. Run it again when the machine is quieter (stop other jobs), or pass "
            "--allow-busy to measure anyway with widened samples (the summary will say the timings are noisy)"
        )


def widened(settings: TimerSettings) -> TimerSettings:
    """`settings` for a busy machine: more samples per point and a larger per-point budget."""
    return replace(
        settings, min_reps=max(settings.min_reps, WIDE_MIN_REPS), max_reps=max(settings.max_reps, 2 * WIDE_MIN_REPS),
        budget_s=settings.budget_s * WIDE_BUDGET_FACTOR,
    )
