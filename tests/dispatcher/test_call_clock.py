"""A device reading (`dispatcher.call_clock.Reading`): a call costs the larger of its host and device time, except one
whose start event still waited behind earlier work when the host's call returned, which costs its device time,
whatever the host waited for. Events are stood in for: no GPU needed."""

from __future__ import annotations

import pytest

from attn_dispatch.dispatcher.call_clock import Reading

MS = 1e-3


class _Event:
    """A completed event at `at_ms` on the device's timeline."""

    def __init__(self, at_ms: float) -> None:
        self.at_ms = at_ms

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Event) -> float:
        return end.at_ms - self.at_ms


def _reading(host_ms: float, device_ms: float) -> Reading:
    return Reading(host_ms * MS, (_Event(0.0), _Event(device_ms)))


@pytest.mark.parametrize(("host_ms", "device_ms", "seconds", "excess"), [
    (0.05, 0.3, 0.3, 0.25),  # device-bound: the kernel outlasts its launch
    (0.05, 0.02, 0.05, -0.03),  # host-bound: the device waits for the host
])
def test_a_call_costs_the_larger_of_host_and_device_time(host_ms, device_ms, seconds, excess):
    reading = _reading(host_ms, device_ms)
    assert reading.ready()
    assert reading.seconds() == pytest.approx(seconds * MS)
    assert reading.device_excess() == pytest.approx(excess * MS)


def test_a_host_clock_reading_is_the_host_s_time():
    reading = Reading(0.2 * MS)
    assert reading.ready() and reading.seconds() == pytest.approx(0.2 * MS) and reading.device_excess() is None


class _RecordedEvent(_Event):
    """An event that takes the fake device's time when recorded; `pending`: recorded events have not run yet."""

    device_ms = 0.0
    pending = False

    def __init__(self, enable_timing: bool = False) -> None:
        super().__init__(0.0)

    def record(self, stream=None) -> None:
        self.at_ms = _RecordedEvent.device_ms

    def query(self) -> bool:
        return not _RecordedEvent.pending


@pytest.mark.parametrize("behind_earlier_work", [False, True])
def test_the_cuda_clock_times_a_call_whose_start_event_waited_behind_earlier_work_by_its_device_time(
        monkeypatch, behind_earlier_work):
    """The host's call took 2 ms, the call's own device work 0.5 ms. Where the start event had not run when the host
    returned (earlier work ahead in the queue), the host's 2 ms were its wait, as in a full launch queue (other calls'
    device time), not this call's cost: all of the call is device time."""
    import torch

    from attn_dispatch.dispatcher import call_clock

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "Event", _RecordedEvent)
    monkeypatch.setattr(_RecordedEvent, "device_ms", 0.0)
    monkeypatch.setattr(_RecordedEvent, "pending", behind_earlier_work)
    host = iter([0.0, 2.0 * MS])
    monkeypatch.setattr(call_clock, "_now", lambda: next(host))
    clock = call_clock.CudaEventClock(torch.device("cuda", 0))
    started = clock.start()
    _RecordedEvent.device_ms = 0.5
    reading = clock.stop(started)
    monkeypatch.setattr(_RecordedEvent, "pending", False)  # the events have run by the time they are read
    assert reading.seconds() == pytest.approx((0.5 if behind_earlier_work else 2.0) * MS)
    assert reading.device_excess() == pytest.approx((0.5 if behind_earlier_work else -1.5) * MS)
