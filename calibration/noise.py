"""Is this machine quiet enough to time kernels? A fixed reference point, timed as a series of
short samples before measuring starts and again when it ends, says how noisy timings are now.

Two signals, either can call the machine busy:
- the spread: the interquartile range of the samples over their median (each sample is one call,
  or a batch of back-to-back calls lasting ~2 ms where one call is shorter, as in
  `calibration.timer`). It catches jitter, not a machine where every sample is slow alike;
- the CPU share (`calibration.cpu_share`): this process's CPU time during the probe over wall
  time x the cores torch uses. It catches the steady case (other processes keep every core
  busy: a calibration can run 100x slow and look quiet by its spread) without knowing how
  fast the machine should be. On a GPU it is the launching host thread's share of one core,
  which can widen the timer but never stops a calibration alone (the kernels' times are the GPU's).
The load average per CPU is reported beside them, never decisive.

Busy (spread over `BUSY_SPREAD`, or a share under `BUSY_CPU_SHARE`): the calibration widens its
timer (`widened`: more samples per point) and says so. Too busy (spread over `STOP_SPREAD`, or a
CPU device's share under `STOP_CPU_SHARE`): it stops before measuring, with a message, unless the
user allows a busy machine (``calibrate --allow-busy``): such timings rank kernels at random.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

import torch

from attn_dispatch.calibration.cpu_share import ShareMeter, cores_in_use, host_share, load_per_cpu
from attn_dispatch.calibration.inputs import make_inputs
from attn_dispatch.calibration.timer import TimerSettings, interquartile_range, time_repetitions
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.kernels.problem import Problem

# The reference point: the math kernel on a 256 x 256, 4-head, D=64 fp32 problem (67 MFLOP: 0.6 ms
# with 2 threads and 1.1 ms with 1 on this project's quiet 2-core VM, batched to ~2 ms samples, so
# a probe takes ~30 ms there; microseconds on a GPU, batched to ~2 ms samples too).
REFERENCE_LENGTH = 256
REFERENCE_HEADS = 4
REFERENCE_HEAD_DIM = 64
# Samples in one probe: with 15, one stray sample (a context switch) moves neither quartile.
PROBE_SAMPLES = 15
PROBE = TimerSettings(warmup=2, min_reps=PROBE_SAMPLES, max_reps=PROBE_SAMPLES, target_relative_iqr=0.0,
                      budget_s=math.inf)
# Busy above this spread: `calibration.timer.QUICK` stops a point at a 10% relative IQR; a reference
# point whose IQR is three times that cannot reach it in QUICK's few samples, so its medians carry
# noise comparable to the gaps between close kernels. Quiet probes on a 2-core CPU spread up to 25%
# (docs/RESULTS.md#busy-machine-probe), so 30% keeps a quiet machine from being called busy; a
# steadily starved one is the CPU share's to catch.
BUSY_SPREAD = 0.30
# Stop above this spread: samples of one call varying by half their median leave most of a quick
# sweep's kernel orderings to chance (docs/RESULTS.md#busy-machine-probe).
STOP_SPREAD = 0.50
# CPU share thresholds (docs/RESULTS.md#busy-machine-probe: quiet probes 0.92-1.04, one of two cores
# taken by another process 0.48-0.52). An OpenMP team whose thread is off its core stalls at every
# barrier, so a lost share stretches times far more than in proportion, unevenly across kernels.
# Busy under this share: below every quiet probe, with margin for a stray context switch.
BUSY_CPU_SHARE = 0.85
# Stop under this share: above a machine with one of its two cores taken, below every quiet probe.
STOP_CPU_SHARE = 0.6
# From this spread on, `spread_words` writes it as a multiple of the median ("8.3x the median
# time") instead of a percentage ("spread 832%" reads as a bug): past 100% the samples' middle half
# spans more than the median itself. Wording only: the verdicts above read the number.
SPREAD_AS_MULTIPLE = 1.0
# A busy machine's timer: at least this many samples per point, and this many times the budget.
WIDE_MIN_REPS = 7
WIDE_BUDGET_FACTOR = 2.0


@dataclass(frozen=True)
class Noise:
    """One probe: the reference point's median seconds and relative spread (IQR / median); the
    CPU share (`calibration.cpu_share`; None when not measured), `host_only` when it is the
    launching host thread's share on a GPU device; the load average per CPU (reported only)."""

    median_s: float
    spread: float
    cpu_share: float | None = None
    host_only: bool = False
    load_per_cpu: float | None = None
    cores: int | None = None  # the cores the CPU share is of (torch's threads, or 1 host thread)

    @property
    def starved(self) -> bool:
        """Other processes take a busy machine's share of the cores from this one."""
        return self.cpu_share is not None and self.cpu_share < BUSY_CPU_SHARE

    @property
    def busy(self) -> bool:
        return self.spread > BUSY_SPREAD or self.starved

    @property
    def too_busy(self) -> bool:
        starved = self.cpu_share is not None and not self.host_only and self.cpu_share < STOP_CPU_SHARE
        return self.spread > STOP_SPREAD or starved

    def describe(self) -> str:
        """``verdict: the numbers it was decided on, with their thresholds`` (one line)."""
        verdict = "too busy to calibrate" if self.too_busy else "busy" if self.busy else "quiet"
        parts = [f"reference point {self.median_s * 1e3:.2f} ms, spread {spread_words(self.spread)} "
                 f"(busy over {BUSY_SPREAD:.0%}, stop over {STOP_SPREAD:.0%})"]
        if self.cpu_share is None:
            parts.append("CPU share not measured")
        elif self.host_only:
            parts.append(f"host thread's CPU share {self.cpu_share:.0%} (busy under {BUSY_CPU_SHARE:.0%}; "
                         "never stops alone: the kernels' times are the GPU's)")
        else:
            cores = "?" if not self.cores else f"{self.cores} core" + ("s" if self.cores != 1 else "")
            parts.append(f"CPU share {self.cpu_share:.0%} of {cores} "
                         f"(busy under {BUSY_CPU_SHARE:.0%}, stop under {STOP_CPU_SHARE:.0%})")
        if self.load_per_cpu is not None:
            parts.append(f"load average {self.load_per_cpu:.2f} per CPU (reported only)")
        return f"{verdict}: " + ", ".join(parts)


def spread_words(spread: float) -> str:
    """A probe's spread (interquartile range / median) in words: ``0.68`` -> ``"68%"``; from
    `SPREAD_AS_MULTIPLE` on, ``8.32`` -> ``"8.3x the median time"``."""
    if not math.isfinite(spread):
        return "not measurable (a zero median time)"
    if spread < SPREAD_AS_MULTIPLE:
        return f"{spread:.0%}"
    return f"{spread:.1f}x the median time"


def reference_problem(device_type: str) -> Problem:
    return Problem(
        batch=1, q_heads=REFERENCE_HEADS, kv_heads=REFERENCE_HEADS, q_len=REFERENCE_LENGTH,
        kv_len=REFERENCE_LENGTH, head_dim=REFERENCE_HEAD_DIM, value_dim=REFERENCE_HEAD_DIM, dtype="float32",
        device_type=device_type,
    )


def probe_noise(device: torch.device | str, *, samples: list[float] | None = None,
                cpu_share: float | None = None) -> Noise:
    """Time the reference point (`PROBE_SAMPLES` samples) and return its spread and CPU share.

    `samples` (seconds) and `cpu_share` skip the timing: tests and benches score a series they have.
    """
    device = torch.device(device)
    host_only = device.type != "cpu"
    cores = 1 if host_only else cores_in_use()
    if samples is None:
        problem, kernel = reference_problem(device.type), MathKernel()
        inputs = make_inputs(problem, device)
        collected: list[float] = []

        def keep(series: list[float]) -> bool:
            collected[:] = series
            return False

        def run(i: int):
            return kernel.run(inputs.query, inputs.key, inputs.value, None, None, False, problem)

        with torch.inference_mode():
            run(0)  # a process's first call waits on lazily loaded code and thread start-up, not on the CPU
            with ShareMeter(cores) as meter:
                time_repetitions(run, device, PROBE, should_stop=keep)
        samples = collected
        cpu_share = host_share() if host_only else meter.share
    median = statistics.median(samples)
    spread = interquartile_range(samples) / median if median > 0 else math.inf
    return Noise(median, spread, cpu_share=cpu_share, host_only=host_only,
                 load_per_cpu=load_per_cpu(), cores=cores)


class MachineBusy(ValueError):
    """The reference point's spread is over `STOP_SPREAD`, or its CPU share under `STOP_CPU_SHARE`:
    calibrating now would store noise."""


def threads_left_free(noise: Noise) -> int | None:
    """The torch threads to suggest after a refusal: the cores this process's CPU share amounts to
    (its share of the cores it used, in whole cores), at least 1 and fewer than it used; None where
    it used one core already (fewer cannot help) or the share is unknown or the host thread's."""
    cores = noise.cores or 1
    if noise.cpu_share is None or noise.host_only or cores <= 1:
        return None
    return max(1, min(cores - 1, round(noise.cpu_share * cores)))


def check_quiet(noise: Noise, *, allow_busy: bool) -> None:
    """Raise `MachineBusy` (a one-line message saying what to do) when the machine is too busy:
    the concrete ``--threads N`` that measures on the cores other work leaves free where fewer
    threads can help, and ``--allow-busy``, which always measures."""
    if noise.too_busy and not allow_busy:
        threads = threads_left_free(noise)
        fewer = ("" if threads is None else
                 f"try --threads {threads} to measure on the {'core' if threads == 1 else f'{threads} cores'} other "
                 f"work leaves free (this process got {noise.cpu_share:.0%} of the {noise.cores} cores its threads "
                 "used: a thread off its core stalls the others), or ")
        raise MachineBusy(
            f"this machine is too busy to calibrate ({noise.describe().split(': ', 1)[-1]}): nothing was measured and no "
            f"table was written, and PyTorch's default keeps serving. Next: {fewer}run it again when the machine is "
            "quieter (stop other jobs); --allow-busy always measures, with widened samples (the table it stores keeps "
            "PyTorch's default outside the buckets it measured, and the summary says the timings are noisy)"
        )


def widened(settings: TimerSettings) -> TimerSettings:
    """`settings` for a busy machine: more samples per point and a larger per-point budget."""
    return replace(
        settings, min_reps=max(settings.min_reps, WIDE_MIN_REPS), max_reps=max(settings.max_reps, 2 * WIDE_MIN_REPS),
        budget_s=settings.budget_s * WIDE_BUDGET_FACTOR,
    )
