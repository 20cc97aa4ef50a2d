"""Buckets measured on their own calls (`measuring`), kept across processes: ``<home>/tunings/<device key>/<kernel
set>.jsonl``, one JSON line per bucket, the last line of a bucket winning. The device key includes the software stack
and the kernel set's signature its contenders, so changes start afresh. Invalid lines are skipped; nothing here
raises into an attention call."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from attn_dispatch.dispatcher.measuring import ROUNDS
from attn_dispatch.dispatcher.selection import Tuned
from attn_dispatch.models.measured import MeasuredEntry, entry_from_tuning

BUCKET_FIELDS = 14
"""Length of a `selection.failure_bucket` key (another length: another version's line)."""


def _to_json(value):
    return [_to_json(v) for v in value] if isinstance(value, tuple) else value


def _to_key(value):
    return tuple(_to_key(v) for v in value) if isinstance(value, list) else value


def _valid_bucket(bucket) -> bool:
    def plain(value) -> bool:
        if isinstance(value, tuple):
            return all(plain(v) for v in value)
        return isinstance(value, (bool, int, str))

    return isinstance(bucket, tuple) and len(bucket) == BUCKET_FIELDS and plain(bucket)


class TuningStore:
    """The tunings of one device and kernel set, in the JSON Lines file `path` (created on the first `append`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> dict[tuple, Tuned]:
        """Every valid tuning in the file, by bucket (empty when absent or unreadable)."""
        tunings: dict[tuple, Tuned] = {}
        try:
            with open(self.path, encoding="utf-8") as handle:
                lines = handle.readlines()
        except OSError:
            return tunings
        for line in lines:
            try:
                entry = json.loads(line)
                bucket = _to_key(entry["bucket"])
                seconds = tuple((str(name), math.inf if s is None else float(s)) for name, s in entry["seconds"])
                kernel = entry["kernel"]
            except (ValueError, KeyError, TypeError):
                continue
            if _valid_bucket(bucket) and isinstance(kernel, str) and any(name == kernel for name, _ in seconds):
                tunings[bucket] = Tuned(kernel, seconds)
        return tunings

    def append(self, bucket: tuple, tuned: Tuned) -> bool:
        """Add one tuning; False when the file could not be written."""
        entry = {"bucket": _to_json(bucket), "kernel": tuned.kernel,
                 "seconds": [[name, s if math.isfinite(s) else None] for name, s in tuned.seconds]}
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())  # one small write with O_APPEND: whole lines, even from several processes
            finally:
                os.close(fd)
        except OSError:
            return False
        return True

    def entries(self) -> list[MeasuredEntry]:
        """Every tuning as a measured table entry (`models.measured.entry_from_tuning`)."""
        found = (entry_from_tuning(bucket, tuned.seconds, rounds=ROUNDS) for bucket, tuned in self.load().items())
        return [entry for entry in found if entry is not None]


def tuning_entries(root: Path, device_key: str) -> list[MeasuredEntry]:
    """A device's remembered tunings (all kernel sets under ``root/device_key``) as measured entries."""
    try:
        paths = sorted((Path(root) / device_key).glob("*.jsonl"))
    except OSError:
        return []
    return [entry for path in paths for entry in TuningStore(path).entries()]
