"""The bundled H200 table's embedded cost model, fitted before the Triton families and
`sdpa_gqa_fold` were registered, is used: `show` reports it in use, and `explain --table` ranks by
it (its predictions, not the decision map's carried times), the new families by the prior beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attn_dispatch.kernels import Problem
from attn_dispatch.models.table_io import load_table

BUNDLED_H200 = Path(__file__).resolve().parents[2] / "models" / "tables" / "nvidia-h200-140gb.json"
SHAPE = ("--lq", "300", "--lk", "5000", "--batch", "2", "--heads", "28", "--kv-heads", "4", "--head-dim", "96",
         "--dtype", "bfloat16", "--device", "cpu")


def test_show_reports_the_bundled_model_in_use(cli):
    code, out, _ = cli("show", BUNDLED_H200)
    assert code == 0
    (line,) = [line for line in out.splitlines() if line.startswith("winning kernels:")]
    assert line.endswith("1 embedded cost model(s)")


def test_explain_ranks_by_the_bundled_model(cli):
    code, out, _ = cli("explain", *SHAPE, "--table", BUNDLED_H200, "--json")
    assert code == 0
    decision = json.loads(out)
    predicted = {c["name"]: c["predicted_s"] for c in decision["candidates"]}
    problem = Problem(2, 28, 4, 300, 5000, 96, 96, "bfloat16", device_type="cpu")
    table = load_table(BUNDLED_H200)
    names = ["sdpa_default", "sdpa_flash", "small_q[splits=8]", "sdpa_gqa_fold"]
    assert [predicted[name] for name in names] == pytest.approx(list(table.model_seconds([problem] * 4, names)))
