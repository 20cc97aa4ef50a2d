"""Timing one real attention call without waiting for the device: what `measuring` reads.

- On a CPU, PyTorch runs an operator before it returns: the host clock around the call is its time.
- On a CUDA / ROCm device the call only queues work. A pair of CUDA events recorded around it on the
  current stream times the work on the device, and the host clock the launch; the reading is ready
  once the end event has completed (`Reading.ready`, a query that never blocks), a later call
  collects it, and the call's time is the larger of the two (a call bound by its launches costs its
  host time, one bound by the device its device time). Nothing synchronises the device.
- While a CUDA graph is being captured nothing is timed (`can_time`): an event recorded there would
  be captured into the graph, and a captured call runs later, inside the graph.

Other device types (whose queues this module cannot read) are never timed (`clock_for` gives None).
"""

from __future__ import annotations

import time

import torch

_now = time.perf_counter
MS_PER_S = 1e3


class Reading:
    """One call's time: ``ready()`` once it can be read without waiting, then ``seconds()``."""

    __slots__ = ("_host_s", "_events")

    def __init__(self, host_s: float, events: tuple | None = None) -> None:
        self._host_s = host_s
        self._events = events

    def ready(self) -> bool:
        return self._events is None or self._events[1].query()

    def seconds(self) -> float:
        if self._events is None:
            return self._host_s
        start, end = self._events
        return max(self._host_s, start.elapsed_time(end) / MS_PER_S)


class HostClock:
    """A CPU's clock: the host's, around the call."""

    def can_time(self) -> bool:
        return True

    def start(self) -> object:
        return _now()

    def stop(self, started: object) -> Reading:
        return Reading(_now() - started)


class CudaEventClock:
    """A CUDA / ROCm device's clock: events on its current stream, and the host's (module docstring)."""

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
        return Reading(_now() - host_start, (begin, end))


def clock_for(device: torch.device) -> HostClock | CudaEventClock | None:
    """The clock that times calls on `device`; None where calls cannot be timed without waiting."""
    if device.type == "cpu":
        return HostClock()
    if device.type == "cuda":
        return CudaEventClock(device)
    return None
