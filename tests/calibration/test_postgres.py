"""Multi-host calibration on a real PostgreSQL server (`pgserver`, a self-contained server from a
wheel): two worker processes with separate homes and results stores, standing in for two hosts,
share one ``postgresql://`` storage. One of them is killed with SIGKILL mid-run and comes back
(`calibrate` on its host again). No point is measured twice, nothing measured is lost, and the
table fitted from the shared results equals the one a single worker fits from the same points."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections import Counter

import pytest

from attn_dispatch.calibration.claims import ClaimBoard, Owner
from attn_dispatch.calibration.plan import agree_on, agreed
from attn_dispatch.calibration.results import (
    ResultsStore,
    open_storage,
    problem_id,
    storage_measurements,
    unit_key,
)
from attn_dispatch.calibration.session import calibrate
from attn_dispatch.calibration.worker import worker_command
from attn_dispatch.models.identity import DeviceIdentity
from tests.calibration.helpers import small_config

PROBLEMS = 6  # x 3 tiny kernels: about 18 CPU points of milliseconds each
KILL_AFTER_POINTS = 3  # host A's timed points before it is killed (it would reach about 9)
TIMEOUT_S = 300.0  # generous: worker start-up alone takes seconds on a busy 2-core machine
POLL_S = 0.01
NAME_CHARS = 63  # PostgreSQL's longest identifier


@pytest.fixture(scope="module")
def postgres_server():
    """A PostgreSQL server of this test module's own (stopped at its end); a skip saying why when
    none can start here."""
    try:
        import pgserver
    except ImportError as missing:
        pytest.skip(f"no PostgreSQL server: pgserver is not installed ({missing}); the `test` extra installs it "
                    "(it has no wheel for Python 3.13 yet)")
    # Not under pytest's temporary directory: run as root, pgserver hands the data directory to an
    # unprivileged user, who cannot enter pytest's private (0700) root.
    data = tempfile.mkdtemp(prefix="attn-dispatch-postgres-")
    try:
        with warnings.catch_warnings():  # platformdirs warns that XDG_RUNTIME_DIR is unset (CI)
            warnings.simplefilter("ignore")
            server = pgserver.get_server(data, cleanup_mode="stop")
    except Exception as error:  # noqa: BLE001 - initdb, permissions, sockets: any reason is a reason to skip
        shutil.rmtree(data, ignore_errors=True)
        pytest.skip(f"the PostgreSQL server from pgserver could not start here: {error}")
    yield server
    server.cleanup()
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def database_url(postgres_server, request):
    """A fresh database for one test, as the ``postgresql://`` URL a user would pass to `--storage`."""
    name = request.node.name.replace("test_", "", 1)[:NAME_CHARS].lower()
    postgres_server.psql(f"CREATE DATABASE {name};")
    return postgres_server.get_uri(name)


def _host(tmp_path, name: str, storage: str):
    """A host's config (its own results store) and environment (its own cache home)."""
    root = tmp_path / name
    config = small_config(root, storage=storage, problems=PROBLEMS)
    return config, {**os.environ, "PYTHONPATH": os.getcwd(), "ATTN_DISPATCH_HOME": str(root / "home")}


def _timed(records: list[dict]) -> list[dict]:
    """Records of points that ran or were decided from sizes (unsupported pairs are never run:
    every host recomputes them from the kernels' declarations)."""
    return [r for r in records if r["status"] != "unsupported"]


def _table_without_dates(path) -> dict:
    table = json.loads(path.read_text())
    for moment in ("created", "calibration_wall_s"):
        table["provenance"].pop(moment)
    return table


@pytest.mark.filterwarnings("ignore:XDG_RUNTIME_DIR is not set")  # pgserver's platformdirs, on a CI machine
def test_two_hosts_share_postgres_and_survive_a_kill(tmp_path, monkeypatch, database_url):
    (config_a, env_a), (config_b, env_b) = _host(tmp_path, "host_a", database_url), _host(tmp_path, "host_b", database_url)
    calibration_id = config_a.calibration_id(DeviceIdentity.detect("cpu"))
    assert config_b.calibration_id(DeviceIdentity.detect("cpu")) == calibration_id
    deadline = time.time() + TIMEOUT_S
    host_a, host_b = (
        subprocess.Popen(worker_command(config, device="cpu", calibration_id=calibration_id, deadline=deadline, name=name),
                         stdout=subprocess.DEVNULL, env=env)
        for config, env, name in ((config_a, env_a, "host_a"), (config_b, env_b, "host_b"))
    )
    store_a, store_b = ResultsStore(config_a.results), ResultsStore(config_b.results)
    try:
        while len(_timed(store_a.read())) < KILL_AFTER_POINTS and host_a.poll() is None and time.time() < deadline:
            time.sleep(POLL_S)
        host_a.send_signal(signal.SIGKILL)
        assert host_a.wait() == -signal.SIGKILL, "host A finished before it could be killed mid-run"
        measured_before_kill = {r["unit"]: r for r in _timed(store_a.read())}
        assert host_b.wait(TIMEOUT_S) == 0
    finally:
        for process in (host_a, host_b):
            if process.poll() is None:
                process.kill()

    monkeypatch.setenv("ATTN_DISPATCH_HOME", env_a["ATTN_DISPATCH_HOME"])
    shared = calibrate(config_a, out=tmp_path / "shared_table.json", show_progress=False)  # host A comes back

    storage = open_storage(database_url, default_journal=tmp_path / "unused")
    in_storage = Counter(unit_key(m.problem, m.kernel) for m in storage_measurements(storage, calibration_id))
    local = _timed(store_a.read()) + _timed(store_b.read())
    assert max(in_storage.values()) == 1, "the shared storage holds a point twice"
    assert max(Counter(r["unit"] for r in local).values()) == 1, "two hosts measured the same point"
    assert set(in_storage) == {r["unit"] for r in local}, "a host's point did not reach the shared storage"
    assert {r["worker"] for r in local} == {"host_a", "host_b"}
    kept = {unit_key(m.problem, m.kernel): m for m in shared.measurements}
    assert all(kept[unit].median_s == record["median_s"] for unit, record in measured_before_kill.items() if record["status"] == "ok"), \
        "a point measured before the kill was lost or measured again"
    plan = agreed(storage, calibration_id, "sweep")
    board = ClaimBoard(storage, calibration_id, Owner.current("check"))
    assert len(plan) == PROBLEMS and all(board.state(problem_id(p)).done for p in plan)
    assert {m.problem for m in shared.measurements} == set(plan)

    # One worker alone, given the same points (one results store, a fresh journal) and the same
    # plan, times nothing new and fits the same table. The plan is carried over because a CPU's
    # spec sheet, from which the plan is sampled, is probed once per process (a GPU's is constant);
    # for the same reason both fits run in this process.
    single = small_config(tmp_path / "single", problems=PROBLEMS)
    every_point = {r["unit"]: r for r in store_a.read() + store_b.read()}
    ResultsStore(single.results).append(list(every_point.values()))
    agree_on(open_storage(single.storage, default_journal=tmp_path / "unused"), calibration_id, "sweep", plan)
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path / "single" / "home"))
    alone = calibrate(single, out=tmp_path / "single_table.json", show_progress=False)
    assert alone.timed_now == 0 and alone.resumed_points > 0
    assert _table_without_dates(tmp_path / "single_table.json") == _table_without_dates(tmp_path / "shared_table.json")


def test_a_plain_postgresql_url_uses_the_installed_driver(monkeypatch):
    from attn_dispatch.calibration import results as storage_module

    url = "postgresql://calib:secret@dbhost:5432/attn_dispatch"
    monkeypatch.setattr(storage_module, "_installed", lambda module: module == "psycopg")
    assert storage_module.with_installed_driver(url) == "postgresql+psycopg://calib:secret@dbhost:5432/attn_dispatch"
    monkeypatch.setattr(storage_module, "_installed", lambda module: True)  # psycopg2 there: SQLAlchemy's default
    assert storage_module.with_installed_driver(url) == url
    assert storage_module.with_installed_driver("sqlite:///x.db") == "sqlite:///x.db"


def test_an_unreachable_database_is_one_error_naming_it_without_the_password(tmp_path):
    url = f"postgresql://calib:secret@/attn_dispatch?host={tmp_path}"  # no server listens there
    with pytest.raises(ValueError, match="cannot open optuna storage postgresql://") as error:
        open_storage(url, default_journal=tmp_path / "unused")
    assert "secret" not in str(error.value)
