"""Threshold tables as rankers: the embedded model, the prior where it has none, readable thresholds."""

from __future__ import annotations

import math
import re
from dataclasses import replace

from attn_dispatch.kernels import Kernel, Problem, all_kernels, kernel_from_name
from attn_dispatch.models.measured import bucket_of, class_key, length_bucket
from attn_dispatch.models.priors import PriorRanker, Ranker
from tests.models.synthetic import SYNTHETIC_KERNELS

DECODE = Problem(2, 16, 4, 1, 3000, 64, 64, "float32", device_type="cuda")
PREFILL = Problem(1, 8, 8, 700, 700, 128, 128, "bfloat16", causal=True, device_type="cuda")


def test_buckets():
    assert [length_bucket(n) for n in (0, 1, 2, 3, 4, 5, 4096, 4097)] == [0, 0, 1, 2, 2, 3, 12, 13]
    assert bucket_of(DECODE) == (0, 12)
    key = class_key(DECODE)
    assert (key.dtype, key.causal, key.mask_kind, key.head_dim, key.work_log2) == ("float32", False, "none", 0, 0)
    fine = class_key(DECODE, fields=("head_dim", "gqa_ratio", "work"))
    assert (fine.head_dim, fine.gqa_ratio, fine.work_log2) == (64, 4, 6)


def test_table_ranks_every_supported_kernel_it_is_given(mi50_table):
    assert isinstance(mi50_table, Ranker) and mi50_table.usable_models
    kernels = all_kernels()
    for problem in (DECODE, PREFILL):
        ranking = mi50_table.rank(problem, kernels)
        supported = {k.name for k in kernels if not k.reasons(problem)}
        assert {name for name, _ in ranking} == supported
        assert [s for _, s in ranking] == sorted(s for _, s in ranking) and all(s > 0 for _, s in ranking)
    only = [kernel_from_name("math"), kernel_from_name("sdpa_flash")]  # flash: no CUDA here
    assert [name for name, _ in mi50_table.rank(DECODE, only)] == ["math"]
    assert mi50_table.rank(DECODE, []) == []


def test_a_table_without_a_usable_model_ranks_by_the_prior_less_its_barred_kernels(mi50_table):
    table = replace(mi50_table, models=())
    kernels = all_kernels()
    cell = table.find_class(DECODE).nearest_cell(bucket_of(DECODE))[1]
    barred = {name for name, _ in cell.excluded}
    expected = PriorRanker(table.spec).rank(DECODE, [k for k in kernels if k.name not in barred])
    assert table.rank(DECODE, kernels) == expected


def test_unknown_class_falls_back_to_the_prior(mi50_table):
    masked = Problem(1, 4, 4, 64, 256, 64, 64, "float16", mask_kind="float", mask_shape=(1, 1, 64, 256),
                     device_type="cuda")
    table = replace(mi50_table, models=())
    assert table.find_class(masked) is None
    assert table.rank(masked, all_kernels()) == PriorRanker(table.spec).rank(masked, all_kernels())


def test_incompatible_embedded_model_is_ignored(mi50_table):
    old = replace(mi50_table.models[0], feature_names=("something", "else"))
    table = replace(mi50_table, models=(old,))
    assert not table.usable_models
    assert table.rank(DECODE, all_kernels()) == replace(mi50_table, models=()).rank(DECODE, all_kernels())


def test_a_model_fitted_against_the_first_prior_is_not_evaluated(mi50_table):
    """Version 1 of the prior named its feature ``log_prior_s``: a table fitted against it keeps its
    measured entries and decision map, not residuals over numbers the prior no longer gives."""
    from attn_dispatch.models.features import FEATURE_NAMES, PRIOR_FEATURE

    names = tuple("log_prior_s" if name == PRIOR_FEATURE else name for name in FEATURE_NAMES)
    assert mi50_table.models[0].compatible
    old = replace(mi50_table.models[0], feature_names=names)
    assert not old.compatible
    from attn_dispatch.models.table_summary import threshold_lines

    assert "not used" not in threshold_lines(mi50_table)[0]
    assert "1 not used" in threshold_lines(replace(mi50_table, models=(old,)))[0]  # `show` says so


def test_thresholds_read_like_rules(mi50_table):
    pattern = re.compile(r"^\S+ (when (L[qk] [<>]=? \d+)( and L[qk] [<>]=? \d+)*|everywhere in this class)( \(\d+ of \d+ buckets\))?$")
    for table_class in mi50_table.classes.values():
        assert table_class.thresholds
        assert sum(t.cells_won for t in table_class.thresholds) == len(table_class.cells)
        for threshold in table_class.thresholds:
            assert pattern.match(threshold.text), threshold.text
            assert threshold.kernel in SYNTHETIC_KERNELS


def test_provenance_and_quality_recorded(mi50_table):
    p = mi50_table.provenance
    assert p.identity.model_key == "AMD Instinct MI50 32GB" and p.points_measured > 0
    assert {"torch", "scikit_learn", "numpy", "attn_dispatch"} <= set(p.software)
    q = mi50_table.quality
    assert 0 <= q["top1_accuracy"] <= 1 and q["n_points_fit"] > 0 and "table_mean_slowdown" in q
    assert "MI50" in repr(mi50_table)


class _Foreign(Kernel):
    """A kernel that is not attn-dispatch's own (e.g. a user's experiment)."""

    family = "my_experiment"

    def workspace_bytes(self, problem: Problem) -> int:
        return 0


def test_foreign_kernels_and_odd_problems_never_break_ranking(mi50_table):
    kernels = [*all_kernels(), _Foreign()]
    for table in (mi50_table, replace(mi50_table, models=()), PriorRanker(mi50_table.spec)):
        ranking = table.rank(DECODE, kernels)
        assert ranking[-1] == ("my_experiment", math.inf)
    odd = [
        Problem(1, 4, 4, 0, 128, 64, 64, "float32", device_type="cuda"),
        Problem(1, 4, 4, 16, 0, 64, 64, "float16", device_type="cuda"),
        Problem(3, 6, 2, 33, 77, 40, 24, "float64", strided=True, broadcast_inputs=True, device_type="cuda"),
        Problem(1, 1, 1, 1, 1 << 20, 256, 256, "bfloat16", mask_kind="bool", mask_shape=(1, 1, 1, 1 << 20),
                device_type="cuda"),
    ]
    for problem in odd:
        ranking = mi50_table.rank(problem, all_kernels())
        assert ranking and all(s > 0 for _, s in ranking), problem


def test_model_seconds_builds_features_once_per_card_spec(mi50_table, monkeypatch):
    """A merged table's models share a spec (equal by value, distinct objects after loading):
    one feature matrix serves them all, and the result is the median over the models."""
    import numpy as np
    import pytest

    from attn_dispatch.models import table as table_module
    from attn_dispatch.models.merge import merge_tables
    from attn_dispatch.models.table_io import dumps_table, loads_table
    from tests.models.conftest import OTHER_ROCM_STACK, fake_identity

    slower = mi50_table.scaled(1.5, spec=mi50_table.spec, note="a slower MI50")
    other = replace(slower, provenance=replace(slower.provenance, identity=fake_identity("mi50_32", **OTHER_ROCM_STACK)))
    merged = loads_table(dumps_table(merge_tables([mi50_table, other])).encode())
    assert len(merged.usable_models) == 2 and merged.models[0].spec is not merged.models[1].spec
    names = ["math", "small_q[splits=8]", "chunked[q=256,kv=2048]"]
    problems = [DECODE] * len(names)
    expected = np.median([m.predict_seconds(problems, names) for m in merged.usable_models], axis=0)
    calls = []
    real = table_module.feature_matrix
    monkeypatch.setattr(table_module, "feature_matrix", lambda *args: calls.append(1) or real(*args))
    assert merged.model_seconds(problems, names) == pytest.approx(expected)
    assert len(calls) == 1
    assert [n for n, _ in merged.rank(DECODE, [kernel_from_name(n) for n in names])] == \
        [n for _, n in sorted(zip(expected, names, strict=True))]
    with pytest.raises(ValueError, match="no usable"):
        replace(merged, models=()).model_seconds(problems, names)


def test_carried_seconds_follows_the_prior_and_guards_odd_ratios(mi50_table, monkeypatch):
    import pytest

    from attn_dispatch.models import table as table_module
    from attn_dispatch.models.priors import prior_seconds
    from attn_dispatch.models.table import carried_seconds

    kernel, longer = kernel_from_name("math"), replace(DECODE, kv_len=2 * DECODE.kv_len)
    spec = mi50_table.spec
    ratio = prior_seconds(longer, kernel, spec) / prior_seconds(DECODE, kernel, spec)
    assert carried_seconds(1e-3, kernel, DECODE, longer, spec) == pytest.approx(1e-3 * ratio)
    for odd in (0.0, math.inf, math.nan):  # a zero prior used to raise ZeroDivisionError
        monkeypatch.setattr(table_module, "prior_seconds", lambda *args, odd=odd: odd)
        assert carried_seconds(1e-3, kernel, DECODE, longer, spec) == 1e-3



def test_nearest_class_measures_work_in_the_tables_own_steps(mi50_table):
    from attn_dispatch.models.measured import ClassKey

    a, b = ClassKey("float32", False, "none", work_log2=4), ClassKey("float32", False, "none", work_log2=10)
    assert a.distance(b, work_step=2) == 3.0 and a.distance(b, work_step=3) == 2.0
    # DECODE (head dim 64, batch x heads 2^5) in a table with work buckets 6 powers wide: its
    # class key has work 6. Two head-dim octaves away (256, work 6) is distance 2; one work bucket
    # away (64, work 12) is distance 1 in the table's steps (3 in the default steps of 2).
    template = next(iter(mi50_table.classes.values()))
    wide, deep = ClassKey("float32", False, "none", 256, 0, 6), ClassKey("float32", False, "none", 64, 0, 12)
    table = replace(mi50_table, class_fields=("head_dim", "work"), work_step=6,
                    classes={key: replace(template, key=key) for key in (wide, deep)})
    assert class_key(DECODE, fields=table.class_fields, work_step=6).work_log2 == 6
    assert table.find_class(DECODE).key == deep


def test_a_model_fitted_before_new_kernel_families_still_serves():
    """The bundled H200 table's model was fitted before the Triton and GQA-fold families were added
    to the features: it still predicts the kernels it was fitted on (their rows are zero in the new
    columns), and a kernel of a family it never saw is priced by the prior carried onto the model's
    scale (`ThresholdTable.model_seconds`), not left unpriced."""
    from attn_dispatch.kernels.assumed_backends import assume_backends_available
    from attn_dispatch.models.features import FEATURE_NAMES
    from attn_dispatch.models.priors import kernel_named
    from attn_dispatch.models.table_io import load_table
    from bench.offline_card import H200_TORCH_2_11

    table = load_table("models/tables/nvidia-h200-140gb.json")
    (model,) = table.models
    assert set(FEATURE_NAMES) - set(model.feature_names) and model.compatible and table.usable_models
    assert model.knows("sdpa_flash") and model.knows("convert[fp32->bf16]+math") and not model.knows("sdpa_gqa_fold")
    problem = Problem(1, 32, 8, 16, 4096, 128, 128, "bfloat16", device_type="cuda")
    with assume_backends_available(H200_TORCH_2_11):
        ranked = table.rank_by_model(problem, [kernel_named(n) for n in ("sdpa_gqa_fold", "sdpa_flash", "math")], None)
    assert sorted(name for name, _ in ranked) == ["math", "sdpa_flash", "sdpa_gqa_fold"]
    assert all(math.isfinite(seconds) and seconds > 0 for _, seconds in ranked)
    narrowed = replace(model, feature_names=(*model.feature_names, "log2_something_new"))
    assert not narrowed.compatible  # any other new feature: the model is not evaluated
