"""Off-card table evaluation tools: what decided a pick (`bench.diagnostics.table_picks`) and the
shares of added shapes (`bench.data_learning_curve`)."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_probe import assume_backends_available
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.table_io import load_table
from bench.data_learning_curve import shape_share
from bench.diagnostics.table_picks import decided_by
from bench.offline_card import offline_card_for
from bench.table_cv import shape_group

BUNDLED_H200 = "models/tables/nvidia-h200-140gb.json"


def points(kv_lens, kernels=("sdpa_flash", "sdpa_default")) -> list[Measurement]:
    return [Measurement(Problem(1, 8, 8, 16, kv, 64, 64, "bfloat16", device_type="cuda"), kernel, median_s=1e-4)
            for kv in kv_lens for kernel in kernels]


def test_a_share_keeps_whole_shapes_and_is_drawn_the_same_each_time():
    added = points(range(100, 120))
    half = shape_share(added, 0.5, seed=3)
    shapes = {shape_group(m.problem) for m in half}
    assert len(shapes) == 10 and len(half) == 20  # both kernels of each kept shape
    assert half == shape_share(added, 0.5, seed=3)
    assert shape_share(added, 0.0, seed=3) == [] and len(shape_share(added, 1.0, seed=3)) == len(added)


@pytest.mark.skipif(torch.cuda.is_available(), reason="off the card only: a GPU answers for itself")
def test_a_pick_in_a_measured_bucket_is_put_down_to_its_entry():
    table = load_table(BUNDLED_H200)
    entry = next(iter(table.entries.values()))
    times = {t.kernel: t.median_s for t in entry.times}
    with assume_backends_available(offline_card_for(table.provenance.identity)):
        assert decided_by(table, entry.problem(), times).startswith("measured entry")
