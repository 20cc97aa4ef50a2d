"""Was the machine quiet while `attn-dispatch bench` or `attn-dispatch kernels` timed? The reference
probe of `calibration.noise` (a few dozen milliseconds on a quiet CPU), taken before the timing
and again after it: the machine was busy when either probe says busy (a spread over
`noise.BUSY_SPREAD`, or a CPU share under `noise.BUSY_CPU_SHARE`), and then the times carry its
noise. Calibration reads the same probes to widen or refuse its measuring (`noise.check_quiet`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_dispatch.calibration.noise import Noise, probe_noise


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
