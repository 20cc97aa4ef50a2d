"""Claiming units of work through the shared optuna storage, so no two workers ever measure the
same problem: a claim is a trial appended in one operation (the first of a generation wins). A
claim whose owner is dead, released or silent past the lease is taken over by the next
generation. `publish_once` agrees on one value (the plan) by the same first-append rule.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from optuna.storages import BaseStorage

from attn_dispatch.calibration.results import (
    add_record_trial,
    ensure_study,
    find_study,
    record_trials,
    study_ids,
    study_name,
)

# A claim whose owner has written nothing for this long is presumed dead (another host's crash);
# a live worker's longest silence is one point.
CLAIM_LEASE_S = 600.0
HEARTBEAT_S = 30.0  # how often a busy owner renews its claim


def _process_start(pid: int) -> str:
    """A token that differs between two processes that had the same pid (Linux: start time)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[19]  # field 22, starttime in clock ticks
    except (OSError, IndexError):
        return ""


@dataclass(frozen=True)
class Owner:
    """Who holds a claim: host, process (with its start token) and a readable worker name."""

    host: str
    pid: int
    started: str
    worker: str

    @classmethod
    def current(cls, worker: str) -> Owner:
        return cls(socket.gethostname(), os.getpid(), _process_start(os.getpid()), worker)

    def alive(self) -> bool | None:
        """True/False for a process of this host; None for another host's (cannot tell)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return not self.started or _process_start(self.pid) == self.started

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Owner:
        return cls(str(data.get("host", "")), int(data.get("pid", -1)), str(data.get("started", "")), str(data.get("worker", "")))


@dataclass(frozen=True)
class ClaimState:
    generation: int  # -1: never claimed
    owner: Owner | None
    done: bool
    released: bool
    last_seen: float


def claim_state(records: list[dict]) -> ClaimState:
    """The state of one unit from its claim records (in trial-number order)."""
    winners: dict[int, dict] = {}
    for record in records:
        if record.get("kind") == "claim":
            winners.setdefault(int(record["generation"]), record)
    done = any(r.get("kind") == "done" for r in records)
    if not winners:
        return ClaimState(-1, None, done, False, 0.0)
    generation = max(winners)
    owner = Owner.from_dict(winners[generation]["owner"])
    ours = [
        r for r in records
        if int(r.get("generation", -1)) == generation and Owner.from_dict(r.get("owner", {})) == owner
    ]
    released = any(r.get("kind") == "release" for r in ours)
    return ClaimState(generation, owner, done, released, max(float(r.get("time", 0.0)) for r in ours))


class ClaimBoard:
    """Claims of one calibration's units in the storage all its workers share, made by `owner`;
    another host's claim is taken over after `lease_s` of silence."""

    def __init__(self, storage: BaseStorage, calibration_id: str, owner: Owner, *, lease_s: float = CLAIM_LEASE_S) -> None:
        self.storage = storage
        self.calibration_id = calibration_id
        self.owner = owner
        self.lease_s = lease_s
        self._held: dict[str, tuple[int, int, float]] = {}  # key -> (study id, generation, last beat)
        self._ids = study_ids(storage)

    def _records(self, study_id: int) -> list[dict]:
        return [t.user_attrs for t in record_trials(self.storage, study_id)]

    def _write(self, study_id: int, kind: str, generation: int) -> None:
        attrs = {"kind": kind, "generation": generation, "owner": self.owner.to_dict(), "time": time.time()}
        add_record_trial(self.storage, study_id, attrs)

    def stale(self, state: ClaimState) -> bool:
        if state.owner is None or state.released:
            return True
        alive = state.owner.alive()
        if alive is not None:
            return not alive
        return time.time() - state.last_seen > self.lease_s

    def state(self, key: str) -> ClaimState:
        """Read-only: reading never creates a claim study."""
        study_id = find_study(self.storage, study_name(self.calibration_id, "claim", key))
        if study_id is None:
            return claim_state([])
        return claim_state(self._records(study_id))

    def try_claim(self, key: str) -> bool:
        """Claim `key` if nobody live holds it and it is not done. True when this worker owns it."""
        study_id = self._ids(study_name(self.calibration_id, "claim", key))
        state = claim_state(self._records(study_id))
        if state.done:
            return False
        if state.owner == self.owner and not state.released:
            self._held[key] = (study_id, state.generation, time.time())
            return True
        if state.generation >= 0 and not self.stale(state):
            return False
        generation = state.generation + 1
        self._write(study_id, "claim", generation)
        after = claim_state(self._records(study_id))
        if after.generation == generation and after.owner == self.owner:
            self._held[key] = (study_id, generation, time.time())
            return True
        return False

    def heartbeat(self, key: str) -> None:
        """Renew this worker's claim on `key` (at most once per `HEARTBEAT_S`)."""
        study_id, generation, last = self._held[key]
        if time.time() - last >= HEARTBEAT_S:
            self._write(study_id, "beat", generation)
            self._held[key] = (study_id, generation, time.time())

    def finish(self, key: str) -> None:
        """Mark `key` done: nobody claims it again."""
        study_id, generation, _ = self._held.pop(key)
        self._write(study_id, "done", generation)

    def release(self, key: str) -> None:
        """Give `key` back unfinished (its finished points stay; a later claimer does the rest)."""
        study_id, generation, _ = self._held.pop(key)
        self._write(study_id, "release", generation)


def publish_once(storage: BaseStorage, name: str, value: dict) -> dict:
    """Agree on one value across workers: the first value appended to study `name` wins and is
    returned to everyone (later proposals are ignored)."""
    study_id = ensure_study(storage, name)
    if not record_trials(storage, study_id):
        add_record_trial(storage, study_id, {"value": value})
    return min(record_trials(storage, study_id), key=lambda t: t.number).user_attrs["value"]


def published(storage: BaseStorage, name: str) -> dict | None:
    """The value agreed in study `name`, or None when nothing was published yet."""
    study_id = find_study(storage, name)
    if study_id is None:
        return None
    trials = record_trials(storage, study_id)
    return min(trials, key=lambda t: t.number).user_attrs["value"] if trials else None
