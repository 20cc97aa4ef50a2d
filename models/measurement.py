"""One timed (problem, kernel) point: what calibration measures and the cost model learns from.

Stored as one JSON object per line (see `calibration.results`); never pickled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from attn_dispatch.kernels.problem import Problem

STATUSES = ("ok", "unsupported", "infeasible", "inaccurate", "failed")
"""ok: timed and within tolerance; unsupported: the kernel's reasons refused the problem;
infeasible: out of memory (or over the memory budget); inaccurate: ran but failed the numerics
gate; failed: raised something else."""


@dataclass(frozen=True)
class Measurement:
    """A timed point (seconds); `median_s` is inf unless `status` is "ok" or "inaccurate".
    `peak_bytes`: extra peak memory of one call; `rel_error`: L2 error against float64 (None where
    not measured); `reason`: why a point is not "ok"; `device_key`: `DeviceIdentity.key`."""

    problem: Problem
    kernel: str
    median_s: float = math.inf
    iqr_s: float = 0.0
    reps: int = 0
    peak_bytes: int | None = None
    rel_error: float | None = None
    status: str = "ok"
    reason: str = ""
    device_key: str = ""
    timestamp: float = 0.0
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Measurement.status must be one of {STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok" and math.isfinite(self.median_s)

    def to_dict(self) -> dict:
        return {
            "problem": self.problem.to_dict(),
            "kernel": self.kernel,
            "median_s": self.median_s if math.isfinite(self.median_s) else None,
            "iqr_s": self.iqr_s,
            "reps": self.reps,
            "peak_bytes": self.peak_bytes,
            "rel_error": self.rel_error if self.rel_error is None or math.isfinite(self.rel_error) else None,
            "status": self.status,
            "reason": self.reason,
            "device_key": self.device_key,
            "timestamp": self.timestamp,
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Measurement:
        """Inverse of `to_dict`; raises ValueError on malformed records."""
        if not isinstance(data, dict):
            raise ValueError(f"a measurement must be a JSON object, got {type(data).__name__}")
        try:
            median = data.get("median_s")
            rel_error = data.get("rel_error")
            return cls(
                problem=Problem.from_dict(data["problem"]),
                kernel=str(data["kernel"]),
                median_s=math.inf if median is None else float(median),
                iqr_s=float(data.get("iqr_s", 0.0)),
                reps=int(data.get("reps", 0)),
                peak_bytes=None if data.get("peak_bytes") is None else int(data["peak_bytes"]),
                rel_error=None if rel_error is None else float(rel_error),
                status=str(data.get("status", "ok")),
                reason=str(data.get("reason", "")),
                device_key=str(data.get("device_key", "")),
                timestamp=float(data.get("timestamp", 0.0)),
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"malformed measurement record: {error}") from None
