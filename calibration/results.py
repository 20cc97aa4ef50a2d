"""The results store: every measurement appended as one JSON line, with its full conditions.

Each line is ``Measurement.to_dict()`` plus ``run`` (the calibration id), ``worker`` and ``unit``
(problem id + kernel name). Appends take an exclusive advisory lock (``fcntl.flock``) and end
with flush + fsync, so concurrent writers on one host never interleave and a crash loses at most
the point in flight. Readers skip a truncated last line (and any malformed line) instead of
failing. Results are JSON, never pickles.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.measurement import Measurement

# Hex digits of a problem's SHA-256 kept in its id: 64 bits, no collision in any realistic sweep.
PROBLEM_ID_HEX = 16
NEWLINE = b"\n"


def problem_id(problem: Problem) -> str:
    """A short stable id of `problem` (hash of its canonical JSON)."""
    text = json.dumps(problem.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:PROBLEM_ID_HEX]


def unit_key(problem: Problem, kernel: str) -> str:
    """The unit of work calibration never measures twice: one kernel on one problem."""
    return f"{problem_id(problem)}|{kernel}"


def _finite(value: object) -> object:
    """JSON has no inf or nan: non-finite floats in free-form fields become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def measurement_record(measurement: Measurement, *, run: str, worker: str) -> dict:
    """The JSON line stored for `measurement`."""
    record = measurement.to_dict()
    record["extra"] = _finite(record.get("extra") or {})
    return {**record, "run": run, "worker": worker, "unit": unit_key(measurement.problem, measurement.kernel)}


@contextmanager
def _locked(path: Path, mode: str, lock: int) -> Iterator:
    with open(path, mode) as handle:
        fcntl.flock(handle.fileno(), lock)
        try:
            yield handle
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _complete_lines(data: bytes) -> tuple[list[bytes], int]:
    """Complete lines of `data` and the number of bytes they span (a partial tail is left)."""
    end = data.rfind(NEWLINE) + 1
    return data[:end].splitlines(), end


def parse_lines(lines: Iterable[bytes]) -> tuple[list[dict], int]:
    """JSON objects among `lines`, and how many lines were malformed (skipped)."""
    records, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            bad += 1
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            bad += 1
    return records, bad


class ResultsStore:
    """An append-only JSON Lines file of measurement records, safe for concurrent writers.

    Parameters
    ----------
    path: the ``.jsonl`` file (created with its directory on first append).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.skipped_lines = 0
        self._offset = 0

    def append(self, records: Iterable[dict]) -> int:
        """Append `records` (one line each) under the lock, then fsync. Returns how many."""
        payload = b"".join(json.dumps(r, separators=(",", ":"), allow_nan=False).encode() + NEWLINE for r in records)
        if not payload:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self.path, "ab+", fcntl.LOCK_EX) as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() > 0:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != NEWLINE:  # a writer died mid-line: isolate its fragment
                    payload = NEWLINE + payload
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        return payload.count(NEWLINE)

    def append_measurements(self, measurements: Iterable[Measurement], *, run: str, worker: str) -> int:
        return self.append(measurement_record(m, run=run, worker=worker) for m in measurements)

    def read(self) -> list[dict]:
        """Every complete, well-formed record (``skipped_lines`` counts the others)."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        lines, _ = _complete_lines(data)
        records, self.skipped_lines = parse_lines(lines)
        return records

    def read_new(self) -> list[dict]:
        """Records appended since the last `read_new` call (for progress displays)."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        lines, used = _complete_lines(data)
        self._offset += used
        return parse_lines(lines)[0]

    def measurements(self, *, run: str | None = None) -> list[Measurement]:
        """Measurements of calibration `run` (all runs when None), one per unit (the first)."""
        seen: set[str] = set()
        out = []
        for record in self.read():
            if run is not None and record.get("run") != run:
                continue
            try:
                measurement = Measurement.from_dict(record)
            except ValueError:
                self.skipped_lines += 1
                continue
            key = unit_key(measurement.problem, measurement.kernel)
            if key not in seen:
                seen.add(key)
                out.append(measurement)
        return out

    def done_units(self, *, run: str) -> set[str]:
        """Units of `run` already measured (whatever their status)."""
        return {r["unit"] for r in self.read() if r.get("run") == run and isinstance(r.get("unit"), str)}
