"""fit_and_build: what `attn-dispatch calibrate` runs at its end."""

from __future__ import annotations

import math

import pytest

from attn_dispatch.kernels import all_kernels
from attn_dispatch.models.fit import fit_and_build
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.probe_store import FALLBACK_CPU_SPEC
from attn_dispatch.models.table_io import dumps_table, loads_table
from tests.models.synthetic import SYNTHETIC_KERNELS, synthetic_measurements


def test_fit_and_build_records_held_out_quality(cpu_fit):
    table, model, quality, points = cpu_fit
    assert quality is not None and quality.table is not None
    print("fit_and_build (synthetic CPU):", quality.summary())
    assert table.quality["n_points_fit"] == quality.n_points_fit > 0
    assert table.quality["top1_accuracy"] == quality.model.top1_accuracy
    assert table.provenance.points_measured == len(points)
    assert model.n_features_in_ > 0 and table.models
    assert loads_table(dumps_table(table).encode()).quality == table.quality
    problem = points[0].problem
    assert table.rank(problem, all_kernels())[0][1] > 0


def test_few_problems_build_without_quality():
    points = synthetic_measurements(3, seed=9)
    table, _, quality = fit_and_build(points, DeviceIdentity.cpu(), kernel_names=SYNTHETIC_KERNELS,
                                      spec=FALLBACK_CPU_SPEC)
    assert quality is None and table.quality == {}
    assert "no held-out quality" in table.provenance.notes[0]


def test_failed_points_are_kept_out_of_the_fit_and_excluded_in_their_bucket():
    points = synthetic_measurements(8, seed=4)
    bad = points[0]
    failed = Measurement(bad.problem, bad.kernel, status="inaccurate", reason="relative error 1e-1")
    table, _, _ = fit_and_build([*points[1:], failed], DeviceIdentity.cpu(), kernel_names=SYNTHETIC_KERNELS,
                                spec=FALLBACK_CPU_SPEC, calibration_wall_s=12.5)
    assert table.provenance.calibration_wall_s == 12.5
    cell = table.find_class(bad.problem).cells
    excluded = {name for c in cell.values() for name, _ in c.excluded}
    assert bad.kernel in excluded


def test_no_usable_point_is_a_clear_error():
    point = synthetic_measurements(1, seed=2)[0]
    with pytest.raises(ValueError, match="no usable measurements"):
        fit_and_build([Measurement(point.problem, point.kernel, median_s=math.inf, status="failed")],
                      DeviceIdentity.cpu(), kernel_names=SYNTHETIC_KERNELS, spec=FALLBACK_CPU_SPEC)


def test_a_kernel_measured_inaccurate_is_not_recommended_in_its_bucket():
    from dataclasses import replace

    from attn_dispatch.models.priors import kernel_named

    points = synthetic_measurements(8, seed=4)
    bad = points[0]
    failed = Measurement(bad.problem, bad.kernel, status="inaccurate", reason="relative error 1e-1")
    table, _, _ = fit_and_build([*points[1:], failed], DeviceIdentity.cpu(), kernel_names=SYNTHETIC_KERNELS,
                                spec=FALLBACK_CPU_SPEC)
    kernels = [kernel_named(name) for name in SYNTHETIC_KERNELS]
    for ranker in (table, replace(table, models=())):
        assert bad.kernel not in {name for name, _ in ranker.rank(bad.problem, kernels)}


# Every chunked and small_q setting: more kernels than a table cell may list (MAX_CANDIDATES).
TUNED_KERNELS = tuple(
    [f"chunked[q={q},kv={kv}]" for q in (64, 128, 256, 512, 1024, 2048, 4096)
     for kv in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)]
    + [f"small_q[splits={s}]" for s in (1, 2, 4, 8, 16, 32, 64, 128)] + ["math"]
)


def test_a_bucket_measuring_more_kernels_than_a_cell_lists_keeps_the_fastest(tmp_path):
    from dataclasses import replace

    from attn_dispatch.kernels import Problem
    from attn_dispatch.models._json_checks import MAX_CANDIDATES
    from attn_dispatch.models.merge import merge_tables
    from attn_dispatch.models.table_io import load_table, save_table

    assert len(TUNED_KERNELS) > MAX_CANDIDATES
    problems = [Problem(1, 2, 2, q, kv, 64, 64, "float32") for q, kv in ((64, 512), (1, 4096), (256, 256))]
    # distinct times: kernel i takes (i + 1) microseconds x the problem's size
    points = [Measurement(p, name, median_s=(i + 1) * 1e-6 * (1 + j), iqr_s=1e-8, reps=10)
              for j, p in enumerate(problems) for i, name in enumerate(TUNED_KERNELS)]
    table, _, _ = fit_and_build(points, DeviceIdentity.cpu(), kernel_names=TUNED_KERNELS, spec=FALLBACK_CPU_SPEC)
    cell = table.find_class(problems[0]).cells[(6, 9)]
    assert [name for name, _ in cell.measured] == list(TUNED_KERNELS[:MAX_CANDIDATES])
    assert len(load_table(save_table(table, tmp_path / "tuned.json")).classes) == 1
    # a merge pools cards that measured different kernels (here kernels 0-63 and 8-71): the fastest
    # MAX_CANDIDATES of the union
    their = tuple((name, (i + 1) * 1e-6) for i, name in enumerate(TUNED_KERNELS))[8:][:MAX_CANDIDATES]
    table_class = table.find_class(problems[0])
    other_class = replace(table_class, cells={**table_class.cells, (6, 9): replace(cell, measured=their)})
    merged = merge_tables([table, replace(table, classes={other_class.key: other_class})])
    pooled = merged.find_class(problems[0]).cells[(6, 9)]
    assert [name for name, _ in pooled.measured] == list(TUNED_KERNELS[:MAX_CANDIDATES])
    assert len(load_table(save_table(merged, tmp_path / "merged.json")).classes) == 1


def test_the_model_is_fitted_for_the_holdout_and_once_on_everything(monkeypatch):
    from attn_dispatch.models.cost_model import CostModel

    fits = []
    real_fit = CostModel.fit
    monkeypatch.setattr(CostModel, "fit", lambda self, X, y: fits.append(len(X)) or real_fit(self, X, y))
    points = synthetic_measurements(8, seed=6)
    _, _, quality = fit_and_build(points, DeviceIdentity.cpu(), kernel_names=SYNTHETIC_KERNELS, spec=FALLBACK_CPU_SPEC)
    assert quality is not None and quality.table is not None
    assert fits == [quality.n_points_fit, quality.n_points_fit + quality.n_points_test]


def test_points_measured_leaves_out_unsupported_pairs():
    points = synthetic_measurements(3, seed=9)
    never_run = [Measurement(p.problem, "sdpa_flash", status="unsupported", reason="needs CUDA") for p in points[:5]]
    infeasible = Measurement(points[0].problem, "sdpa_cudnn", status="infeasible", reason="over the memory budget")
    table, _, _ = fit_and_build([*points, *never_run, infeasible], DeviceIdentity.cpu(),
                                kernel_names=SYNTHETIC_KERNELS, spec=FALLBACK_CPU_SPEC)
    assert table.provenance.points_measured == len(points) + 1
