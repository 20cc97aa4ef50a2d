"""What one calibration is: its options (JSON, handed to every worker), its id, and its files.
The id hashes all that can invalidate a timing or change the sample (device and stack, version,
kernels, policy, budget, timer, profile, seed): workers with one id share claims and results.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from attn_dispatch.calibration.timer import DEFAULT, QUICK, TimerSettings
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.paths import journals_dir, package_version

CONFIG_HASH_HEX = 12  # hex digits of the option hash in a calibration id
PACKAGE = "attn-dispatch"
# Default wall-time budgets for measuring (--quick, full).
QUICK_BUDGET_S = 100.0
FULL_BUDGET_S = 480.0
# Optuna trials per tuned (problem, family) study, the sweep's defaults included.
QUICK_TUNE_TRIALS = 5
FULL_TUNE_TRIALS = 10


def workload_digest(path: str | None) -> str | None:
    """Hash of a workload file's bytes (a changed workload is a different calibration)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()[:CONFIG_HASH_HEX]
    except OSError as error:
        raise ValueError(f"--workload {path}: cannot read it ({error.strerror}); record one with ATTN_DISPATCH_RECORD={path}") from None


@dataclass(frozen=True)
class CalibrationConfig:
    """Options of one calibration (CLI flags, minus the output and display options)."""

    devices: tuple[str, ...] = ("cpu",)  # torch devices, one worker each
    quick: bool = False  # the small profile and the QUICK timer settings
    budget_s: float | None = None  # wall time for measuring; workers stop claiming work after it
    storage: str | None = None  # optuna storage URL or journal path (None: a journal in the cache)
    results: str | None = None  # the JSON Lines results file (None: next to the default journal)
    kernels: str = "all"  # "all", "portable" or comma-separated kernel names
    memory_budget: int | None = None  # bytes a point may use (None: the card's memory; CPU: half the RAM)
    allow_lossy: tuple[str, ...] = ()  # lossy conversions the accuracy policy accepts
    problems: int | None = None  # overrides the profile's sweep size
    tune_trials: int | None = None  # optuna trials per tuned study (None: by profile)
    seed: int = 0  # the sample's and the samplers' seed
    threads: int | None = None  # torch threads while timing (None: torch's default)
    workload: str | None = None  # a recorded workload, measured first, as recorded
    allow_busy: bool = False  # calibrate on a too-busy machine (widened timer); not part of the id

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("CalibrationConfig.devices must name at least one device")
        if self.budget_s is not None and not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            raise ValueError(f"the budget must be a positive number of seconds, got {self.budget_s}")
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise ValueError(f"the memory budget must be positive, got {self.memory_budget} bytes")
        if self.problems is not None and self.problems < 1:
            raise ValueError(f"--problems must be at least 1, got {self.problems}")

    @property
    def timer(self) -> TimerSettings:
        return QUICK if self.quick else DEFAULT

    @property
    def effective_budget_s(self) -> float:
        if self.budget_s is not None:
            return self.budget_s
        return QUICK_BUDGET_S if self.quick else FULL_BUDGET_S

    @property
    def effective_tune_trials(self) -> int:
        if self.tune_trials is not None:
            return self.tune_trials
        return QUICK_TUNE_TRIALS if self.quick else FULL_TUNE_TRIALS

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CalibrationConfig:
        known = {f.name for f in fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
        return cls(**values)

    def calibration_id(self, identity: DeviceIdentity) -> str:
        """``attn-dispatch|<device key>|<option hash>`` (see module docstring)."""
        options = {
            "version": package_version(), "kernels": self.kernels, "memory_budget": self.memory_budget,
            "allow_lossy": sorted(self.allow_lossy), "quick": self.quick, "timer": self.timer.to_dict(),
            "problems": self.problems, "seed": self.seed, "tune_trials": self.effective_tune_trials,
            "threads": self.threads,
        }
        if self.workload is not None:  # only then, so ids of calibrations without one stay as they were
            options["workload"] = workload_digest(self.workload)
        digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:CONFIG_HASH_HEX]
        return f"{PACKAGE}|{identity.key}|{digest}"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def file_stem(calibration_id: str) -> str:
    """A calibration id as a file name stem (``|`` and other unsafe characters -> ``_``)."""
    return _UNSAFE.sub("_", calibration_id).strip("_")


def default_storage(calibration_id: str) -> Path:
    """The optuna journal of a calibration."""
    return journals_dir() / f"{file_stem(calibration_id)}.journal"


def default_results(calibration_id: str) -> Path:
    """The JSON Lines results file of a calibration."""
    return journals_dir() / f"{file_stem(calibration_id)}.jsonl"

