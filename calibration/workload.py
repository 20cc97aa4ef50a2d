"""Read a recorded workload (written by `dispatcher.recording`): the problems a real run decided,
one per bucket, which ``calibrate --workload`` measures first, as recorded. A line is
``{"format": 1, "bucket": [...], "problem": {...}}`` (the format number is repeated here: the
dispatcher never imports calibration).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from attn_dispatch.kernels.problem import Problem

WORKLOAD_FORMAT = 1


def read_workload(path: str | os.PathLike) -> list[Problem]:
    """The recorded problems, one per bucket, in recording order. Raises FileNotFoundError (no
    such file) or ValueError (naming a line that is not a workload line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--workload {path}: no such file; record one with ATTN_DISPATCH_RECORD={path}")
    problems, seen = [], set()
    with open(path, encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                entry = json.loads(text)
                if not isinstance(entry, dict) or entry.get("format") != WORKLOAD_FORMAT or "bucket" not in entry:
                    raise ValueError(f"not a format-{WORKLOAD_FORMAT} workload line")
                problem = Problem.from_dict(entry.get("problem"))
            except ValueError as error:
                raise ValueError(f"--workload {path}, line {number}: {error}; delete the line or record the workload again") from None
            key = json.dumps(entry["bucket"])
            if key not in seen:
                seen.add(key)
                problems.append(problem)
    return problems


def for_device(problems: list[Problem], device_type: str) -> list[Problem]:
    """The problems as this device measures them: its device type, inputs that do not broadcast
    (the same kernel work); duplicates dropped, order kept."""
    return list(dict.fromkeys(replace(p, device_type=device_type, broadcast_inputs=False) for p in problems))
