"""Claims through the shared optuna storage: one owner at a time, release and takeover, a dead
owner's claim taken over, another host's claim only after its lease, one published plan."""

from __future__ import annotations

import socket
import subprocess
import sys

from attn_dispatch.calibration.claims import ClaimBoard, Owner, publish_once
from attn_dispatch.calibration.results import open_storage


def _storage(tmp_path):
    return open_storage(None, default_journal=tmp_path / "j.journal")


def test_one_owner_release_and_finish(tmp_path):
    storage = _storage(tmp_path)
    me = ClaimBoard(storage, "cal", Owner.current("me"))
    peer = ClaimBoard(storage, "cal", Owner(socket.gethostname(), 1, "", "peer"))  # pid 1: alive
    assert me.try_claim("p") and me.try_claim("p")
    assert not peer.try_claim("p")
    me.release("p")
    assert peer.try_claim("p") and not me.try_claim("p")
    peer.finish("p")
    assert me.state("p").done and not me.try_claim("p")
    assert me.state("p").done and not me.state("q").done


def test_dead_owner_on_this_host_is_taken_over(tmp_path):
    storage = _storage(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ghost = ClaimBoard(storage, "cal", Owner(socket.gethostname(), int(dead.stdout), "", "ghost"))
    assert ghost.try_claim("p")
    me = ClaimBoard(storage, "cal", Owner.current("me"))
    assert me.try_claim("p")
    assert me.state("p").generation == 1 and me.state("p").owner == me.owner


def test_other_host_claim_waits_for_its_lease(tmp_path):
    storage = _storage(tmp_path)
    remote = ClaimBoard(storage, "cal", Owner("another-host", 42, "", "remote"))
    assert remote.try_claim("p")
    patient = ClaimBoard(storage, "cal", Owner.current("me"), lease_s=3600.0)
    assert not patient.try_claim("p")
    impatient = ClaimBoard(storage, "cal", Owner.current("me"), lease_s=0.0)
    assert impatient.try_claim("p")


def test_first_published_value_wins(tmp_path):
    storage = _storage(tmp_path)
    assert publish_once(storage, "plan", {"n": 1}) == {"n": 1}
    assert publish_once(storage, "plan", {"n": 2}) == {"n": 1}
    reopened = _storage(tmp_path)  # another process reads the same journal
    assert publish_once(reopened, "plan", {"n": 3}) == {"n": 1}


def test_claims_through_a_database_url(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'cal.db'}", default_journal=tmp_path / "unused.journal")
    me = ClaimBoard(storage, "cal", Owner.current("me"))
    remote = ClaimBoard(storage, "cal", Owner("another-host", 42, "", "remote"))
    assert me.try_claim("p") and not remote.try_claim("p")
    me.finish("p")
    assert remote.state("p").done
    assert publish_once(storage, "plan", {"n": 1}) == publish_once(storage, "plan", {"n": 2}) == {"n": 1}
