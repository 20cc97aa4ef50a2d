"""How much of the CPU this process gets: the absolute busy signal of `calibration.noise`.

The reference probe's spread misses a machine where every sample is uniformly slow: a process
that gets a small, steady share of the cores (other processes keep them all busy) times
everything slowly and steadily. Its own CPU time over the wall time says so without knowing how
fast the machine should be:

- CPU devices (`ShareMeter`): the process's CPU time (`time.process_time`, all its threads)
  during the probe over wall time x the cores torch's threads can use (`cores_in_use`). On a
  quiet machine torch's threads run for the whole probe and the share is ~1.
- GPU devices (`host_share`): the probe's time is the GPU's, and the host thread's CPU time while
  it waits for the GPU depends on how it waits (spinning or blocked), not on other processes, so
  the probe's own share says nothing about the kernel. What a busy host does slow is the thread
  that issues the launches: its share of one core (`time.thread_time`) over a short host-only
  loop is measured instead.
- The load average per CPU (`load_per_cpu`) is a second opinion, reported only: this process's
  own threads count in it, and where torch uses fewer cores than the machine has, other
  processes' load need not touch ours.
"""

from __future__ import annotations

import os
from time import perf_counter, process_time, thread_time

import torch

# Iterations of the host-only loop of `host_share`: ~20 ms of CPython arithmetic on this
# project's 2-core dev VM, long enough to span a few scheduler time slices (1-4 ms each).
HOST_LOOP_ITERATIONS = 200_000
# Wall time below this is treated as this when dividing (a clock that did not move).
TINY_WALL_S = 1e-9


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
