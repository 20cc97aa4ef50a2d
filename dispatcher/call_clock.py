"""Clocks that time one attention call without waiting for it (`clock_for`): the host's clock on a CPU; on CUDA /
ROCm, stream events around the call, read once complete: the larger of device and host time (a host-bound call costs
its host time), except for a call whose start event was still queued behind earlier work when the host's call
returned. That call costs its device time: the device never waited for its host, whose time there is hidden, or is
its wait for room in a full launch queue (other calls' device time)."""

from __future__ import annotations

import time

import torch

_now = time.perf_counter
MS_PER_S = 1e3


class Reading:
    """One call's time: ``seconds()`` once ``ready()`` (readable without waiting)."""

    __slots__ = ("_host_s", "_events", "_device_s")

    def __init__(self, host_s: float, events: tuple | None = None) -> None:
        self._host_s = host_s
        self._events = events
        self._device_s: float | None = None

    def ready(self) -> bool:
        return self._events is None or self._events[1].query()

    def seconds(self) -> float:
        if self._events is None:
            return self._host_s
        return max(self._host_s, self._elapsed_s())

    def device_excess(self) -> float | None:
        """Seconds the device's events spanned beyond the host's call (negative: the host took longer); None on a host
        clock."""
        if self._events is None:
            return None
        return self._elapsed_s() - self._host_s

    def _elapsed_s(self) -> float:
        if self._device_s is None:  # read once: each read is a driver call
            start, end = self._events
            self._device_s = start.elapsed_time(end) / MS_PER_S
        return self._device_s


class HostClock:
    """A CPU's clock: the host's, around the call."""

    def can_time(self) -> bool:
        return True

    def start(self) -> object:
        return _now()

    def stop(self, started: object) -> Reading:
        return Reading(_now() - started)


class CudaEventClock:
    """A CUDA / ROCm device's clock: events on its current stream, and the host's."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def can_time(self) -> bool:
        with torch.cuda.device(self.device):
            return not torch.cuda.is_current_stream_capturing()

    def start(self) -> object:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event, _now()

    def stop(self, started: object) -> Reading:
        begin, host_start = started
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        host_s = _now() - host_start
        if not begin.query():  # queued behind earlier work the whole call: its host time is hidden, or was a wait
            host_s = 0.0
        return Reading(host_s, (begin, end))


def clock_for(device: torch.device) -> HostClock | CudaEventClock | None:
    """The clock that times calls on `device`; None where calls cannot be timed without waiting."""
    if device.type == "cpu":
        return HostClock()
    if device.type == "cuda":
        return CudaEventClock(device)
    return None
