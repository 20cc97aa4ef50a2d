"""Sharing tables: export / import, the lookup order with faked MI50 / MI60 / Radeon VII cards,
staleness warnings, corrupt files skipped, and merging with the spread between cards kept."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest

from attn_dispatch.kernels import Problem, all_kernels, kernel_from_name
from attn_dispatch.models import sharing
from attn_dispatch.models.identity import MI50_32GB, MI60, RADEON_VII
from attn_dispatch.models.merge import card_scale, merge_tables
from attn_dispatch.models.sharing import (
    TableWarning,
    export_table,
    import_table,
    local_table_path,
    lookup_table,
    store_table,
)
from attn_dispatch.models.table_io import load_table
from attn_dispatch.models.table_schema import TableError
from tests.models.conftest import OTHER_ROCM_STACK, fake_identity
from tests.models.test_table import DECODE


def _for(table, identity):
    """The same decisions, attributed to another card (what another owner would share)."""
    return replace(table, provenance=replace(table.provenance, identity=identity))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setattr(sharing, "BUNDLED_TABLES_DIR", tmp_path / "bundled")
    (tmp_path / "bundled").mkdir()
    return tmp_path / "home"


def test_export_import_stores_under_the_model(mi50_table, home, tmp_path):
    shared = export_table(mi50_table, tmp_path / "shared.json")
    stored = import_table(shared, home=home)
    assert stored == local_table_path(mi50_table.identity, home=home)
    assert stored.parent.name == "amd-instinct-mi50-32gb"
    assert load_table(stored).identity == mi50_table.identity
    (tmp_path / "evil.json").write_text(shared.read_text().replace("chunked[q=256,kv=2048]", "evil[x=1]"))
    with pytest.raises(TableError, match="not an attn-dispatch kernel"):
        import_table(tmp_path / "evil.json", home=home)


def test_lookup_order_exact_model_family_prior(mi50_table, home):
    mi50_32 = fake_identity("mi50_32")
    store_table(mi50_table, home=home)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TableWarning)  # an exact match warns about nothing
        exact = lookup_table(mi50_32, home=home)
    assert exact.level == "exact" and exact.table is not None and exact.warnings == ()

    with pytest.warns(TableWarning, match="stale"):
        model = lookup_table(fake_identity("mi50_32", **OTHER_ROCM_STACK), home=home)
    assert model.level == "model" and "attn-dispatch check" in model.warnings[0]

    for card, spec in (("mi60", MI60), ("radeon_vii", RADEON_VII), ("mi50_16", None)):
        with pytest.warns(TableWarning, match="same family"):
            family = lookup_table(fake_identity(card), home=home)
        assert family.level == "family" and family.table.spec is not MI50_32GB
        factor = card_scale(MI50_32GB, spec or family.table.spec)
        assert family.table.models[0].scale == pytest.approx(factor)
        original = dict(mi50_table.rank(DECODE, all_kernels()))
        for name, seconds in family.table.rank(DECODE, all_kernels()):
            assert seconds == pytest.approx(original[name] * factor)

    assert card_scale(MI50_32GB, MI60) < 1.0  # the MI60 is faster: its times are scaled down
    for card in ("h200",):
        prior = lookup_table(fake_identity(card), home=home)
        assert prior.level == "prior" and prior.table is None


def test_an_exact_card_beats_another_card_of_its_model(mi50_table, home):
    mi60, other = fake_identity("mi60"), fake_identity("mi60", **OTHER_ROCM_STACK)
    store_table(_for(mi50_table, other), home=home)
    store_table(_for(mi50_table, mi60), home=home)
    found = lookup_table(mi60, home=home)
    assert found.level == "exact" and found.table.identity == mi60


def test_user_tables_come_before_bundled_ones(mi50_table, home):
    mi60 = fake_identity("mi60")
    export_table(_for(mi50_table, mi60), sharing.BUNDLED_TABLES_DIR / "mi60.json")
    bundled = lookup_table(mi60, home=home)
    assert bundled.level == "exact" and bundled.path.parent == sharing.BUNDLED_TABLES_DIR
    store_table(_for(mi50_table, mi60), home=home)
    assert lookup_table(mi60, home=home).path.parent != sharing.BUNDLED_TABLES_DIR


def test_corrupt_files_are_skipped_with_a_warning(mi50_table, home):
    store_table(mi50_table, home=home)
    folder = local_table_path(mi50_table.identity, home=home).parent
    (folder / "a-truncated.json").write_text(json.dumps(mi50_table.to_dict())[:500])
    (folder / "b-pickle.json").write_bytes(b"\x80\x04\x95 not a table")
    with pytest.warns(TableWarning, match="skipped table"):
        found = lookup_table(mi50_table.identity, home=home)
    assert found.level == "exact" and len(found.warnings) == 2
    quiet = lookup_table(mi50_table.identity, home=home, warn=False)
    assert len(quiet.warnings) == 2


def test_merge_keeps_the_spread_between_cards(mi50_table, tmp_path):
    slower = mi50_table.scaled(1.5, spec=MI50_32GB, note="a slower MI50")
    other = _for(slower, fake_identity("mi50_32", **OTHER_ROCM_STACK))
    merged = merge_tables([mi50_table, other])
    assert merged.provenance.merged_from == (other.identity,)
    assert merged.provenance.points_measured == 2 * mi50_table.provenance.points_measured
    assert len(merged.models) == 2
    key = next(iter(mi50_table.classes))
    bucket, cell = next(iter(mi50_table.classes[key].cells.items()))
    pooled = merged.classes[key].cells[bucket]
    name, seconds = cell.ranking[0]
    low, high = pooled.spread[name]
    assert low == pytest.approx(seconds, rel=1e-3) and high == pytest.approx(1.5 * seconds, rel=1e-3)
    assert dict(pooled.ranking)[name] == pytest.approx(1.25 * seconds, rel=1e-3)  # median of two
    for a, b in zip(merged.rank(DECODE, all_kernels()), mi50_table.rank(DECODE, all_kernels()), strict=True):
        assert a[0] == b[0] and a[1] == pytest.approx(1.25 * b[1])
    assert len(load_table(export_table(merged, tmp_path / "merged.json")).models) == 2


def test_merge_family_tables_scales_each_card(mi50_table):
    mi60_table = _for(replace(mi50_table, spec=MI60), fake_identity("mi60"))
    merged = merge_tables([mi50_table, mi60_table])
    assert merged.models[1].scale == pytest.approx(card_scale(MI60, MI50_32GB))
    assert {i.model_key for i in merged.provenance.identities} == {"AMD Instinct MI50 32GB", "AMD Instinct MI60 32GB"}


def test_merge_refuses_other_families(mi50_table):
    with pytest.raises(TableError, match="one card model or one family"):
        merge_tables([mi50_table, _for(mi50_table, fake_identity("h200"))])
    with pytest.raises(TableError, match="different classes"):
        merge_tables([mi50_table, replace(mi50_table, work_step=3)])



def test_merge_over_the_size_cap_says_merge_fewer_tables(mi50_table, monkeypatch):
    from attn_dispatch.models.table_io import table_bytes

    pair = [mi50_table, _for(mi50_table, fake_identity("mi50_32", **OTHER_ROCM_STACK))]
    size = table_bytes(merge_tables(pair))
    assert size > table_bytes(mi50_table)
    monkeypatch.setattr("attn_dispatch.models.merge.MAX_TABLE_BYTES", size - 1)
    with pytest.raises(TableError, match="merge fewer tables"):
        merge_tables(pair)


def test_merged_quality_keeps_the_worst_card_per_metric(mi50_table):
    other = _for(mi50_table, fake_identity("mi50_32", **OTHER_ROCM_STACK))
    other = replace(other, quality={**mi50_table.quality, "top1_accuracy": 0.1, "prior_spearman": -0.5,
                                    "worst_slowdown": 9.0, "seed": 7, "holdout_fraction": 0.5})
    merged = merge_tables([mi50_table, other]).quality
    assert (merged["top1_accuracy"], merged["prior_spearman"], merged["worst_slowdown"]) == (0.1, -0.5, 9.0)
    assert merged["n_points_fit"] == 2 * mi50_table.quality["n_points_fit"]
    assert (merged["seed"], merged["holdout_fraction"]) == (mi50_table.quality["seed"], mi50_table.quality["holdout_fraction"])


def test_the_bundled_h200_table_serves_h200_owners_without_calibrating(tmp_path):
    """`models/tables/nvidia-h200-140gb.json` (the H200 calibration of 2026-11-30) loads, is found
    for an H200 on another software stack (level "model", with a staleness note), and ranks."""
    bundled = sharing.BUNDLED_TABLES_DIR / "nvidia-h200-140gb.json"
    table = load_table(bundled)
    assert table.identity.name == "NVIDIA H200" and table.provenance.points_measured > 1000
    other_stack = replace(table.identity, torch_version="2.99.0+cu999", driver="999.0")
    found = lookup_table(other_stack, home=tmp_path, warn=False)
    assert found.level == "model" and found.path == bundled
    assert any("calibrated on" in note for note in found.warnings)
    decode = Problem(1, 32, 8, 4, 131072, 128, 128, "float16", device_type="cuda")
    ranked = table.rank(decode, [kernel_from_name(name) for name in ("math", "small_q[splits=8]", "chunked[q=512,kv=4096]")])
    assert [name for name, _ in ranked][0].startswith("small_q")  # measured fastest there (docs/RESULTS.md)
