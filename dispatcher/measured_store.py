"""Buckets measured on their own calls (`measuring`), kept across processes so a restarted server
does not measure every bucket again: ``<home>/tunings/<device key>/<kernel set>.jsonl``, one JSON
line per measured bucket (`attn-dispatch export` adds them to a shared table as measured entries).

The device key holds the card and its software stack (`models.identity.DeviceIdentity.key`), so a
driver or PyTorch update starts afresh; the kernel set's signature (its kernel names and accuracy
policy) keeps a tuning among one set of contenders from serving a dispatcher that has others.
Lines are plain JSON, appended whole; a line that does not parse or validate is skipped, and the
last line of a bucket wins. Nothing here ever raises into an attention call: a store that cannot
be read or written only costs the tuning again.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from attn_dispatch.dispatcher.device_planner import tuning_path
from attn_dispatch.dispatcher.measuring import ROUNDS
from attn_dispatch.dispatcher.selection import Tuned
from attn_dispatch.models.measured import MeasuredEntry, entry_from_tuning

BUCKET_FIELDS = 14
"""Length of a `selection.failure_bucket` key (a line whose bucket differs is from another version)."""


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
    """The tunings of one device and kernel set.

    Parameters
    ----------
    path: the JSON Lines file (created on the first `append`).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def at(cls, root: Path, device_key: str, signature: str) -> TuningStore:
        return cls(tuning_path(root, device_key, signature))

    def load(self) -> dict[tuple, Tuned]:
        """Every valid tuning in the file, by bucket (empty when there is no file or it is unreadable)."""
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
        """Add one tuning; False when the file could not be written (the tuning still serves this
        process)."""
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
        """Every tuning of the file as a measured table entry (`models.measured.entry_from_tuning`:
        the bucket is the entry key; contenders that failed are left out)."""
        found = (entry_from_tuning(bucket, tuned.seconds, rounds=ROUNDS) for bucket, tuned in self.load().items())
        return [entry for entry in found if entry is not None]


def tuning_entries(root: Path, device_key: str) -> list[MeasuredEntry]:
    """The remembered tunings of a device (every kernel set's file under ``root/device_key``) as
    measured table entries; empty when there are none or the folder cannot be read."""
    try:
        paths = sorted((Path(root) / device_key).glob("*.jsonl"))
    except OSError:
        return []
    return [entry for path in paths for entry in TuningStore(path).entries()]
