"""A device's backend probes across processes (`models.probe_store`): the ones an earlier process on
the same card (or CPU) and software stack passed are taken as passed when this process first plans
for the device, and new passes are written after a decision that made them. On a CPU the two
probes of a first call (flash and math against the float64 reference) cost a fresh process 20-60 ms
of first-use set-up on the 2-core CPU (torch 2.13), more than PyTorch's own first SDPA call. Never
fails a call: any error reading or writing leaves the probes to run as they would without it."""

from __future__ import annotations

import torch

from attn_dispatch.kernels.sdpa_probe import passed_probes, seed_passed_probes


class ProbeCache:
    """The kept probes of one device (`for_device`), and what this process has written since."""

    def __init__(self, identity, cudnn_version: str, home: str | None, kept: set, index: int | None = None) -> None:
        self.identity = identity
        self.device_type = identity.device_type
        self.index = index  # the device's CUDA index (None: the current device, or a CPU)
        self.cudnn_version = cudnn_version
        self.home = home
        self.kept = kept

    @classmethod
    def for_device(cls, device: torch.device, home: str | None) -> ProbeCache | None:
        """Seed this process's probe results from the device's file; None on devices other than CPUs
        and GPUs, on any error, and for a GPU other than the current one: probes run on the current
        device and their results are kept per device type (`sdpa_probe`), so another card's file
        would vouch for this one, and this one's passes be written as another card's."""
        if device.type not in ("cpu", "cuda"):
            return None
        try:
            from attn_dispatch.models.identity import DeviceIdentity
            from attn_dispatch.models.probe_store import load_passed

            if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
                return None
            identity = DeviceIdentity.detect(device)
            cudnn_version = str(torch.backends.cudnn.version() or "") if device.type == "cuda" else ""
            kept = {key for key in load_passed(identity, cudnn_version, home) if key[1] == device.type}
        except Exception:  # noqa: BLE001 - no kept probes: they run as before
            return None
        seed_passed_probes(kept)
        return cls(identity, cudnn_version, home, kept, device.index)

    def save_new(self) -> None:
        """Write the passes this process has that the file lacks (nothing when there are none, or
        when the current device is no longer this one: the passes were not made on it)."""
        passed = passed_probes(self.device_type) | self.kept
        if passed == self.kept:
            return
        try:
            from attn_dispatch.models.probe_store import save_passed

            if self.device_type == "cuda" and self.index is not None and self.index != torch.cuda.current_device():
                return

            save_passed(self.identity, self.cudnn_version, passed, self.home)
        except Exception:  # noqa: BLE001 - an unwritable home costs the next process its probes, nothing else
            return
        self.kept = passed
