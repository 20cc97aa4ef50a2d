"""fit_and_build: what `attn-dispatch calibrate` runs at its end."""

from __future__ import annotations

import math

import pytest

from kernels import all_kernels
from models._cpu_probe import FALLBACK_CPU_SPEC
from models.fit import fit_and_build
from models.identity import DeviceIdentity
from models.measurement import Measurement
from models.table_io import dumps_table, loads_table
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

    from models.ranking import kernel_named

    points = synthetic_measurements(8, seed=4)
    bad = points[0]
    failed = Measurement(bad.problem, bad.kernel, status="inaccurate", reason="relative error 1e-1")
    table, _, _ = fit_and_build([*points[1:], failed], DeviceIdentity.cpu(), kernel_names=SYNTHETIC_KERNELS,
                                spec=FALLBACK_CPU_SPEC)
    kernels = [kernel_named(name) for name in SYNTHETIC_KERNELS]
    for ranker in (table, replace(table, models=())):
        assert bad.kernel not in {name for name, _ in ranker.rank(bad.problem, kernels)}
