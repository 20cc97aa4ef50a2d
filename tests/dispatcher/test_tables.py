"""Tables at inference: a real table for this device serves the decision; a corrupt or foreign
table file gives a warning and the analytic prior, and the call succeeds."""

from __future__ import annotations

import json

import pytest
import torch

import attn_dispatch as dispatcher
from attn_dispatch.dispatcher import TableWarning
from attn_dispatch.models.fit import fit_and_build
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.sharing import local_table_path, store_table
from tests.dispatcher.helpers import assert_matches_reference, qkv
from tests.models.synthetic import SYNTHETIC_KERNELS, synthetic_measurements

SYNTHETIC_PROBLEMS = 12  # enough for a held-out split, about a second to fit


@pytest.fixture(scope="module")
def cpu_table():
    identity = DeviceIdentity.detect(torch.device("cpu"))
    points = [Measurement(m.problem, m.kernel, median_s=m.median_s, iqr_s=m.iqr_s, reps=m.reps)
              for m in synthetic_measurements(SYNTHETIC_PROBLEMS, seed=0)]
    table, _, _ = fit_and_build(points, identity, kernel_names=list(SYNTHETIC_KERNELS))
    return identity, table


def _home(monkeypatch, tmp_path):
    home = tmp_path / "home"
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(home))
    return home


@pytest.mark.parametrize(
    "content",
    ["{ not json", json.dumps({"format_version": 1, "hello": "world"}), json.dumps([1, 2, 3]), "\x00\x01binary"],
    ids=["corrupt", "foreign", "wrong_type", "binary"],
)
def test_bad_table_file_warns_and_prior_serves(monkeypatch, tmp_path, content):
    home = _home(monkeypatch, tmp_path)
    path = local_table_path(DeviceIdentity.detect(torch.device("cpu")), home=home)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    inputs = qkv()
    with pytest.warns(TableWarning, match="skipped table"):
        out = dispatcher.attention(**inputs)
    assert_matches_reference(out, inputs)
    decision = dispatcher.explain(**inputs)
    assert decision.source.level == "prior" and decision.source.path is None
    assert any("skipped table" in w for w in decision.source.warnings)


def test_table_for_this_device_serves_decisions(monkeypatch, tmp_path, cpu_table):
    identity, table = cpu_table
    home = _home(monkeypatch, tmp_path)
    path = store_table(table, home=home)
    inputs = qkv(heads=4, kv_heads=2, q_len=8, kv_len=8, dim=64)
    decision = dispatcher.explain(**inputs)
    assert decision.source.level == "exact" and decision.source.path == str(path)
    assert decision.source.identity == identity.key
    problem = decision.problem
    supported = [k for k in dispatcher.default_dispatcher().kernels if not k.reasons(problem)]
    table_first = next(name for name, _ in table.rank(problem, supported) if name in {c.name for c in decision.candidates})
    assert decision.kernel == table_first
    assert f"table: {path}" in str(decision)
    assert_matches_reference(dispatcher.attention(**inputs), inputs)


def test_reset_picks_up_a_new_table(monkeypatch, tmp_path, cpu_table):
    home = _home(monkeypatch, tmp_path)
    inputs = qkv(dim=64)
    assert dispatcher.explain(**inputs).source.level == "prior"
    store_table(cpu_table[1], home=home)
    assert dispatcher.explain(**inputs).source.level == "prior"  # decided once, cached
    dispatcher.reset()
    assert dispatcher.explain(**inputs).source.level == "exact"


def test_a_table_whose_model_lost_says_so_in_explain_and_its_default_serves(monkeypatch, tmp_path, cpu_table):
    from dataclasses import replace

    from attn_dispatch.models.quality import Guard

    identity, table = cpu_table
    home = _home(monkeypatch, tmp_path)
    store_table(replace(table, entries={}, guard=Guard("default", "held-out mean slowdown: table 30%, default 5%")), home=home)
    inputs = qkv(heads=4, kv_heads=2, q_len=8, kv_len=8, dim=64)
    decision = dispatcher.explain(**inputs)
    assert decision.kernel == "sdpa_default"
    assert "PyTorch's default serves" in decision.source.description and "PyTorch's default serves" in str(decision)
    assert_matches_reference(dispatcher.attention(**inputs), inputs)


def test_export_carries_the_remembered_tunings_as_measured_entries(monkeypatch, tmp_path, cpu_table):
    from attn_dispatch.dispatcher.cli import main
    from attn_dispatch.dispatcher.measured_store import TuningStore, tuning_entries
    from attn_dispatch.dispatcher.selection import Tuned
    from attn_dispatch.kernels import Problem
    from attn_dispatch.models.measured import entry_key
    from attn_dispatch.models.paths import tuning_path, tunings_dir
    from attn_dispatch.models.table_io import load_table, save_table

    identity, table = cpu_table
    home = _home(monkeypatch, tmp_path)
    bucket = entry_key(Problem(1, 4, 2, 8, 8, 64, 64, "float32"))
    store = TuningStore(tuning_path(tunings_dir(home), identity.key, "set"))
    assert store.append(bucket, Tuned("math", (("math", 1e-5), ("sdpa_default", 3e-5))))
    (entry,) = tuning_entries(tunings_dir(home), identity.key)
    assert entry.key == bucket and entry.winner == "math" and entry.source == "tuning"
    source = save_table(table, tmp_path / "mine.json")
    assert main(["export", str(tmp_path / "shared.json"), "--table", str(source)]) == 0
    assert load_table(tmp_path / "shared.json").entries[bucket].winner == "math"
    assert main(["export", str(tmp_path / "bare.json"), "--table", str(source), "--no-tunings"]) == 0
    assert bucket not in load_table(tmp_path / "bare.json").entries
