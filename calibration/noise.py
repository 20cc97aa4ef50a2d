"""Is this machine quiet enough to time kernels? A reference point timed as short samples before
measuring and after gives the spread (IQR / median) and, on a CPU, this process's CPU share of the
cores torch uses (on a GPU, the launching thread's share: reported only); the load average is
reported beside them. Busy: the timer widens (`widened`); too busy: calibration stops
(`check_quiet`) unless ``--allow-busy``. `MachineWatch` probes around `bench` and `kernels`.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, replace
from time import perf_counter, process_time, thread_time

import torch

from attn_dispatch.calibration.inputs import make_inputs
from attn_dispatch.calibration.timer import TimerSettings, interquartile_range, time_repetitions
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.kernels.problem import Problem

# Iterations of `host_share`'s loop: long enough (tens of ms) to span a few scheduler time slices.
HOST_LOOP_ITERATIONS = 200_000
TINY_WALL_S = 1e-9  # wall time below this is treated as this when dividing


def cores_in_use() -> int:
    """The cores torch's intra-op threads can run on: its thread count, capped by the CPUs this
    process may use (its affinity mask where the platform has one)."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        available = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), available))


class ShareMeter:
    """``with ShareMeter(cores) as meter: ...`` then ``meter.share``: the process's CPU time
    during the block over its wall time x `cores` (1.0 = the cores were ours the whole time)."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.share = float("nan")

    def __enter__(self) -> ShareMeter:
        self._cpu, self._wall = process_time(), perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = max(perf_counter() - self._wall, TINY_WALL_S)
        self.share = (process_time() - self._cpu) / (wall * self.cores)


def host_share(iterations: int = HOST_LOOP_ITERATIONS) -> float:
    """The calling thread's share of one core over a host-only loop of `iterations` steps
    (1.0 = it ran the whole time): how freely this thread can issue GPU launches now."""
    cpu, wall = thread_time(), perf_counter()
    value = 0
    for _ in range(iterations):
        value = (value * 31 + 7) % 1000003
    return (thread_time() - cpu) / max(perf_counter() - wall, TINY_WALL_S)


def load_per_cpu() -> float | None:
    """The 1-minute load average over the CPU count (None where the platform has none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):  # Windows
        return None


# The reference point: the math kernel on a 256 x 256, 4-head, D=64 fp32 problem.
REFERENCE_LENGTH = 256
REFERENCE_HEADS = 4
REFERENCE_HEAD_DIM = 64
PROBE_SAMPLES = 15
PROBE = TimerSettings(warmup=2, min_reps=PROBE_SAMPLES, max_reps=PROBE_SAMPLES, target_relative_iqr=0.0,
                      budget_s=math.inf)
# Busy above this spread / under this CPU share; too busy to calibrate above / under these
# (docs/RESULTS.md#busy-machine-probe gives the probes they were set from).
BUSY_SPREAD = 0.30
STOP_SPREAD = 0.50
BUSY_CPU_SHARE = 0.85
STOP_CPU_SHARE = 0.6
# From this spread on, `spread_words` writes it as a multiple of the median (wording only).
SPREAD_AS_MULTIPLE = 1.0
# A busy machine's timer: at least this many samples per point, and this many times the budget.
WIDE_MIN_REPS = 7
WIDE_BUDGET_FACTOR = 2.0


@dataclass(frozen=True)
class Noise:
    """One probe: the reference point's median seconds and relative spread (IQR / median); the
    CPU share (None when not measured), `host_only` when it is the launching host thread's share
    on a GPU device; the load average per CPU (reported only)."""

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
    def starved_to_stop(self) -> bool:
        """Too busy on its CPU share (a CPU device's only)."""
        return self.cpu_share is not None and not self.host_only and self.cpu_share < STOP_CPU_SHARE

    @property
    def too_busy(self) -> bool:
        return self.spread > STOP_SPREAD or self.starved_to_stop

    @property
    def wide(self) -> bool:
        """Whether the spread reads best as a multiple of the median (`spread_words`)."""
        return _wide(self.spread)

    def describe(self, *, as_multiple: bool | None = None) -> str:
        """``verdict: the numbers it was decided on, with their thresholds`` (one line); the spread and its
        thresholds as a multiple of the median or in percent (`as_multiple`, default: `wide`)."""
        verdict = "too busy to calibrate" if self.too_busy else "busy" if self.busy else "quiet"
        as_multiple = self.wide if as_multiple is None else as_multiple  # thresholds in the same unit
        busy, stop = (f"{BUSY_SPREAD:.1f}x", f"{STOP_SPREAD:.1f}x") if as_multiple else (f"{BUSY_SPREAD:.0%}", f"{STOP_SPREAD:.0%}")
        parts = [f"reference point {self.median_s * 1e3:.2f} ms, spread {spread_words(self.spread, as_multiple)} "
                 f"(busy over {busy}, stop over {stop})"]
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


def _wide(spread: float) -> bool:
    return math.isfinite(spread) and spread >= SPREAD_AS_MULTIPLE


def spread_words(spread: float, as_multiple: bool | None = None) -> str:
    """A probe's spread (interquartile range / median) in words: ``0.68`` -> ``"68%"``; from
    `SPREAD_AS_MULTIPLE` on (or where `as_multiple`), ``8.32`` -> ``"8.3x the median time"``."""
    if not math.isfinite(spread):
        return "not measurable (a zero median time)"
    if not (_wide(spread) if as_multiple is None else as_multiple):
        return f"{spread:.0%}"
    return f"{spread:.1f}x the median time"


def probe_noise(device: torch.device | str, *, samples: list[float] | None = None,
                cpu_share: float | None = None) -> Noise:
    """Time the reference point (`PROBE_SAMPLES` samples) and return its spread and CPU share;
    `samples` (seconds) and `cpu_share` skip the timing (tests score a series they have)."""
    device = torch.device(device)
    host_only = device.type != "cpu"
    cores = 1 if host_only else cores_in_use()
    if samples is None:
        problem = Problem(1, REFERENCE_HEADS, REFERENCE_HEADS, REFERENCE_LENGTH, REFERENCE_LENGTH, REFERENCE_HEAD_DIM,
                          REFERENCE_HEAD_DIM, "float32", device_type=device.type)
        kernel = MathKernel()
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
    """The machine is too busy to calibrate: calibrating now would store noise."""


def threads_left_free(noise: Noise) -> int | None:
    """The torch threads to suggest after a refusal: the most, fewer than it used, that would each get at least
    `BUSY_CPU_SHARE` of a core if the CPU went round evenly between them and the other work (as many busy threads as
    this process's share says: ``cores / share - cores``); None where no such count exists (other work fills every
    core) or it is unknown."""
    cores = noise.cores or 1
    if noise.cpu_share is None or noise.host_only or cores <= 1 or noise.cpu_share <= 0:
        return None
    others = cores / min(noise.cpu_share, 1.0) - cores
    threads = min(cores - 1, math.floor(cores / BUSY_CPU_SHARE - others))
    return threads if threads >= 1 else None


def check_quiet(noise: Noise, *, allow_busy: bool) -> None:
    """Raise `MachineBusy` (a one-line message saying what to do: ``--threads N`` where fewer
    threads can help, ``--allow-busy``) when the machine is too busy."""
    if noise.too_busy and not allow_busy:
        threads = threads_left_free(noise)
        fewer = ("" if threads is None else
                 f"try --threads {threads} to measure on the {'core' if threads == 1 else f'{threads} cores'} other "
                 f"work leaves free (this process got {noise.cpu_share:.0%} of the {noise.cores} cores its threads "
                 "used: a thread off its core stalls the others), or ")
        raise MachineBusy(
            f"this machine is too busy to calibrate ({noise.describe().split(': ', 1)[-1]}): no kernel was timed and no "
            f"table was written, and PyTorch's default keeps serving. Next: {fewer}run it again when the machine is "
            "quieter (stop other jobs); --allow-busy always measures, with widened samples (the table it stores keeps "
            "PyTorch's default outside the buckets it measured, and the summary says the timings are noisy)"
        )


def widened(settings: TimerSettings) -> TimerSettings:
    """`settings` for a busy machine: more samples per point and a larger per-point budget."""
    return replace(settings, min_reps=max(settings.min_reps, WIDE_MIN_REPS),
                   max_reps=max(settings.max_reps, 2 * WIDE_MIN_REPS), budget_s=settings.budget_s * WIDE_BUDGET_FACTOR)


ALLOWED_CAUSE = "the machine was too busy to time kernels (measured anyway: --allow-busy)"
ALLOWED_REASON = "measured on a machine too busy to time kernels (calibrate --allow-busy)"


def change_words(start: Noise, end: Noise) -> str:
    """The numbers that made the probe after measuring "too busy" (or busy), before and after:
    ``"CPU share 96% before, 69% after"``, ``"spread 0.1x the median time before, 3.2x the median time after"``
    (both spreads in one unit), or both joined by "; "."""
    parts = []
    if end.spread > STOP_SPREAD or not end.starved_to_stop:
        wide = start.wide or end.wide
        parts.append(f"spread {spread_words(start.spread, wide)} before, {spread_words(end.spread, wide)} after")
    if end.starved and start.cpu_share is not None:
        parts.append(f"CPU share {start.cpu_share:.0%} before, {end.cpu_share:.0%} after")
    return "; ".join(parts)


def too_busy_cause(start: Noise | None, end: Noise | None) -> str | None:
    """Why the timings cannot be trusted (``"the machine ..."``: measured under ``--allow-busy``, or
    it became too busy while measuring), or None when neither probe said "too busy"."""
    return _too_busy(start, end, ALLOWED_CAUSE, "the machine ")


def too_busy_reason(start: Noise | None, end: Noise | None) -> str | None:
    """The reason a too-busy calibration's table guard stores, or None."""
    return _too_busy(start, end, ALLOWED_REASON, "measured on a machine that ")


def _too_busy(start: Noise | None, end: Noise | None, allowed: str, became: str) -> str | None:
    """`allowed` when the probe before measuring said "too busy"; `became` + how the machine became
    too busy (``"became too busy to time kernels while measuring (CPU share 96% before, 69% after)"``)
    when only the probe after did; else None."""
    if start is not None and start.too_busy:
        return allowed
    if end is None or not end.too_busy:
        return None
    if start is None:
        return became + "was too busy to time kernels after measuring"
    return became + f"became too busy to time kernels while measuring ({change_words(start, end)})"


@dataclass(frozen=True)
class MachineState:
    """The probes before and after a timed run (`after` None where the run did not finish)."""

    before: Noise
    after: Noise | None = None

    @property
    def busy(self) -> bool:
        return self.before.busy or (self.after is not None and self.after.busy)

    def words(self) -> str:
        """One line for a report's conditions: ``quiet before and after timing``, or when and why busy."""
        if not self.busy:
            return "quiet before and after timing" if self.after is not None else "quiet before timing"
        busy = [(when, probe) for when, probe in (("before", self.before), ("after", self.after))
                if probe is not None and probe.busy]
        when = " and ".join(w for w, _ in busy)
        numbers = busy[-1][1].describe().split(": ", 1)[-1]  # without calibrate's verdict words
        return f"busy {when} timing ({numbers})"

    def note(self) -> str | None:
        """The closing note of a busy run (None when quiet)."""
        if not self.busy:
            return None
        return (f"note: the machine was {self.words()}: these times carry its noise (a starved process's kernels "
                "run slower, unevenly); run it again when the machine is quieter")

    def to_dict(self) -> dict:
        return {"busy": self.busy, "before": self.before.describe(),
                "after": None if self.after is None else self.after.describe()}


class MachineWatch:
    """``with MachineWatch(device) as watch: <time things>``, then ``watch.state``: the probe is
    taken on entering and on leaving the block (not after an exception)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._before: Noise | None = None
        self._after: Noise | None = None

    def __enter__(self) -> MachineWatch:
        self._before = probe_noise(self.device)
        return self

    def __exit__(self, kind, *_exc) -> None:
        if kind is None:
            self._after = probe_noise(self.device)

    @property
    def state(self) -> MachineState:
        if self._before is None:
            raise RuntimeError("MachineWatch.state is read inside or after its `with` block, not before")
        return MachineState(self._before, self._after)
