"""The quality guard on deliberately noisy measurements: the committed CPU calibration with every
time multiplied by a random factor. A table fitted on it must never pick a kernel slower than
PyTorch's default on its own held-out problems, and its verdict must follow what measured best."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from attn_dispatch.kernels import Problem
from attn_dispatch.models.dataset import training_set
from attn_dispatch.models.fit import fit_and_build
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measured import DEFAULT_KERNEL
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.priors import PriorRanker, kernel_named
from attn_dispatch.models.probe_store import FALLBACK_CPU_SPEC
from attn_dispatch.models.quality import ChoiceQuality, Guard, decide_verdict, split_by_problem

DATA = Path(__file__).resolve().parent / "data" / "cpu_measurements.jsonl.gz"
# Each time multiplied by exp(N(0, 0.7)): a factor of 2 either way is common, as on a machine
# whose other processes come and go between samples.
NOISE_SIGMA = 0.7
NOISE_SEED = 11


def _noisy_points() -> list[Measurement]:
    rng = np.random.default_rng(NOISE_SEED)
    points = [Measurement.from_dict(json.loads(line)) for line in gzip.open(DATA, "rt", encoding="utf-8") if line.strip()]
    return [replace(m, median_s=m.median_s * float(np.exp(rng.normal(0.0, NOISE_SIGMA)))) if m.ok else m for m in points]


@pytest.fixture(scope="module")
def noisy_fit():
    points = _noisy_points()
    names = sorted({m.kernel for m in points if m.ok})
    table, _, quality = fit_and_build(points, DeviceIdentity.cpu(), kernel_names=names, spec=FALLBACK_CPU_SPEC)
    data = training_set(points, FALLBACK_CPU_SPEC)
    _, test = split_by_problem(data, holdout_fraction=quality.holdout_fraction, seed=quality.seed)
    return table, quality, data, test


def _measured(data, rows) -> dict[str, float]:
    return {data.kernels[i]: float(np.exp(data.y[i])) for i in rows}


def test_the_stored_noisy_table_never_picks_slower_than_the_default_on_its_held_out_problems(noisy_fit):
    table, _, data, test = noisy_fit
    checked = 0
    for group in np.unique(data.groups[test]):
        rows = np.flatnonzero(data.groups == group)
        times = _measured(data, rows)
        problem = data.problems[rows[0]]
        picked = table.rank(problem, [kernel_named(name) for name in times])[0][0]
        entry = table.measured_entry(problem)
        assert entry is not None, "every measured problem is an exact entry of the stored table"
        spread = {t.kernel: t for t in entry.times}
        # slower than the default only within the measurements' spread (they cannot order the two)
        assert spread[picked].low_s <= spread[DEFAULT_KERNEL].high_s
        checked += 1
    assert checked == len(np.unique(data.groups[test])) > 10


def test_the_guard_alone_is_no_worse_than_the_default_on_held_out_problems(noisy_fit):
    """Without the held-out problems' own entries (the guarded training-split table): the guard
    lands at PyTorch's default or better on average."""
    _, quality, _, _ = noisy_fit
    assert quality.guarded.n_problems >= quality.default.n_problems > 10
    assert quality.guarded.mean_slowdown <= quality.default.mean_slowdown + 1e-9
    assert "outside measured buckets: " in quality.summary()


def test_the_verdict_is_stored_in_the_table_and_survives_a_round_trip(noisy_fit, tmp_path):
    from attn_dispatch.models.table_io import load_table, save_table

    table, quality, _, _ = noisy_fit
    assert table.guard is not None and table.guard.verdict in ("table", "default", "prior")
    assert table.guard.reason in quality.verdict
    again = load_table(save_table(table, tmp_path / "noisy.json"))
    assert again.guard == table.guard and again.entries == table.entries


def _quality(mean: float) -> ChoiceQuality:
    return ChoiceQuality(0.5, 0.5, mean, mean * 3, 0.5, 20, mean)


def test_the_verdict_goes_to_whichever_measured_best():
    assert decide_verdict(_quality(0.05), _quality(0.2), _quality(0.1)).verdict == "table"
    assert decide_verdict(_quality(0.3), _quality(0.2), _quality(0.1)).verdict == "default"
    assert decide_verdict(_quality(0.3), _quality(0.1), _quality(0.2)).verdict == "prior"
    assert decide_verdict(_quality(0.1), _quality(0.1), _quality(0.1)).verdict == "table"  # a tie keeps the table
    assert decide_verdict(_quality(0.3), _quality(0.1), _quality(0.1)).verdict == "default"  # ... default over prior
    assert decide_verdict(_quality(0.3), _quality(0.1), None).verdict == "prior"  # no default timed


PROBLEM = Problem(1, 4, 4, 512, 512, 64, 64, "float32")
KERNELS = ("math", "chunked[q=64,kv=512]", "small_q[splits=8]", DEFAULT_KERNEL)


def test_verdicts_rank_by_the_reference_outside_measured_buckets(cpu_fit):
    table = replace(cpu_fit[0], entries={})
    kernels = [kernel_named(n) for n in KERNELS]
    as_prior = replace(table, guard=Guard("prior", "test"))
    assert as_prior.rank(PROBLEM, kernels) == PriorRanker(table.spec).rank(PROBLEM, kernels)
    as_default = replace(table, guard=Guard("default", "test"))
    assert as_default.rank(PROBLEM, kernels)[0][0] == DEFAULT_KERNEL
    assert sorted(as_default.rank(PROBLEM, kernels)) == sorted(as_prior.rank(PROBLEM, kernels))


def test_a_table_written_with_the_retired_guard_fields_still_loads(cpu_fit, tmp_path):
    """Tables written before the guard margin and region default were removed (the bundled H200
    table among them) hold their fields: read and ignored."""
    from attn_dispatch.models.table_io import load_table, save_table

    table = cpu_fit[0]
    data = json.loads(save_table(table, tmp_path / "t.json").read_text())
    data["guard"]["default_margin"] = 0.2
    cell = data["classes"][0]["cells"][0]
    cell["keep_default"], cell["default_yields_at"] = True, 2.0
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = load_table(tmp_path / "old.json")
    assert old.guard == table.guard
    assert old.rank(PROBLEM, [kernel_named(n) for n in KERNELS]) == table.rank(PROBLEM, [kernel_named(n) for n in KERNELS])
