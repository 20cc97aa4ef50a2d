"""A GPU's backend probes across processes (`models.probe_store`): the ones an earlier process on
the same card and software stack passed are taken as passed when this process first plans for the
device, and new passes are written after a decision that made them. Never fails a call: any error
reading or writing leaves the probes to run as they would without it."""

from __future__ import annotations

import torch

from attn_dispatch.kernels.sdpa_probe import passed_probes, seed_passed_probes


class ProbeCache:
    """The kept probes of one device (`for_device`), and what this process has written since."""

    def __init__(self, identity, cudnn_version: str, home: str | None, kept: set) -> None:
        self.identity = identity
        self.cudnn_version = cudnn_version
        self.home = home
        self.kept = kept

    @classmethod
    def for_device(cls, device: torch.device, home: str | None) -> ProbeCache | None:
        """Seed this process's probe results from the device's file; None off GPUs (a CPU's probes
        cost milliseconds) and on any error."""
        if device.type != "cuda":
            return None
        try:
            from attn_dispatch.models.identity import DeviceIdentity
            from attn_dispatch.models.probe_store import load_passed

            identity = DeviceIdentity.detect(device)
            cudnn_version = str(torch.backends.cudnn.version() or "")
            kept = load_passed(identity, cudnn_version, home)
        except Exception:  # noqa: BLE001 - no kept probes: they run as before
            return None
        seed_passed_probes(kept)
        return cls(identity, cudnn_version, home, kept)

    def save_new(self) -> None:
        """Write the passes this process has that the file lacks (nothing when there are none)."""
        passed = passed_probes("cuda") | self.kept
        if passed == self.kept:
            return
        try:
            from attn_dispatch.models.probe_store import save_passed

            save_passed(self.identity, self.cudnn_version, passed, self.home)
        except Exception:  # noqa: BLE001 - an unwritable home costs the next process its probes, nothing else
            return
        self.kept = passed
