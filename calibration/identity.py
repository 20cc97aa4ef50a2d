"""Device identity and software fingerprint, re-exported from `models.identity` (the dispatcher
needs it at inference time and must not import calibration). Calibration stamps every
measurement with ``DeviceIdentity.key`` and builds its calibration id from it."""

from __future__ import annotations

import torch

from attn_dispatch.models.identity import DeviceIdentity

__all__ = ["DeviceIdentity", "detect"]


def detect(device: torch.device | str) -> DeviceIdentity:
    """The identity of `device` ("cpu", "cuda", "cuda:1") in this process."""
    return DeviceIdentity.detect(device)
