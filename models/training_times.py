"""Measured forward+backward times for the training route (docs/CONFIG.md
``ATTN_DISPATCH_TRAINING_PROFILE``, else `default_profile_path`), written by
`calibration.training_profile` as JSON (``format_version`` 1, kind ``attn_dispatch.training_profile``,
``device``, ``entries``: problem, kernel, seconds, peak_bytes). An entry serves its class and length
bucket (`profile_key`) on a device of the same label. A bad profile is a warning, never a failure.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import torch

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.environment import TRAINING_PROFILE
from attn_dispatch.models.measured import OPTIONAL_FIELDS, bucket_of, class_key
from attn_dispatch.models.paths import home

PROFILE_FILE = "training_profile.json"
FORMAT_VERSION = 1
KIND = "attn_dispatch.training_profile"


def profile_key(problem: Problem) -> tuple:
    """What one measurement serves: the problem's finest class and its length buckets."""
    return (class_key(problem, fields=OPTIONAL_FIELDS), bucket_of(problem))


def default_profile_path(home_override: str | os.PathLike | None = None) -> Path:
    """``<home>/training_profile.json`` (`models.paths.home`)."""
    return home(home_override) / PROFILE_FILE


def device_label(device: torch.device) -> str:
    """``"cpu"``, or ``"cuda:<card name>"`` for a GPU (a profile serves cards of that name)."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


class TrainingTimes:
    """Forward+backward seconds by (device label, problem bucket, kernel name)."""

    def __init__(self, entries: dict[tuple[str, tuple], dict[str, float]] | None = None) -> None:
        self._entries = entries or {}

    @classmethod
    def from_env(cls) -> TrainingTimes:
        """The profile ``ATTN_DISPATCH_TRAINING_PROFILE`` names, else the home's, else none."""
        path = TRAINING_PROFILE.read()
        if path is not None:
            return cls.load(path)
        default = default_profile_path()
        return cls.load(default) if default.is_file() else cls()

    @classmethod
    def load(cls, path: str | os.PathLike) -> TrainingTimes:
        """Read a profile; a bad one warns (naming the file and the fix) and gives no times."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as error:
            warnings.warn(f"training profile {path} not used ({error}); re-run "
                          "`python -m attn_dispatch.calibration.training_profile`", stacklevel=2)
            return cls()

    @classmethod
    def from_dict(cls, data: object) -> TrainingTimes:
        """Validate a profile's JSON; ValueError names what is wrong."""
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise ValueError(f"not a training profile (expected kind {KIND!r})")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {data.get('format_version')!r}, this version reads {FORMAT_VERSION}")
        device, rows = data.get("device"), data.get("entries")
        if not isinstance(device, str) or not isinstance(rows, list):
            raise ValueError("a profile needs a 'device' string and an 'entries' list")
        entries: dict[tuple[str, tuple], dict[str, float]] = {}
        for row in rows:
            if not isinstance(row, dict) or not isinstance(row.get("kernel"), str):
                raise ValueError(f"entry {row!r} needs a 'kernel' name")
            seconds = row.get("seconds")
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
                raise ValueError(f"entry for {row['kernel']} needs positive finite 'seconds', got {seconds!r}")
            bucket = profile_key(Problem.from_dict(row.get("problem")))
            times = entries.setdefault((device, bucket), {})
            times[row["kernel"]] = min(float(seconds), times.get(row["kernel"], math.inf))
        return cls(entries)

    def lookup(self, problem: Problem, device: torch.device) -> dict[str, float]:
        """Kernel name -> measured seconds for `problem`'s bucket on `device` (empty: none)."""
        if not self._entries:
            return {}
        return dict(self._entries.get((device_label(device), profile_key(problem)), {}))
