"""A table fitted before a kernel family was registered still serves: its embedded model prices the
families it was fitted with exactly as it did then (its stored feature names say which), and a
family it never saw is priced by the analytic prior beside it (`ThresholdTable.model_seconds`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attn_dispatch.kernels import AccuracyPolicy, Problem
from attn_dispatch.kernels import _triton_support as support
from attn_dispatch.models.features import FEATURE_NAMES
from attn_dispatch.models.priors import kernel_named, prior_seconds
from attn_dispatch.models.table_io import load_table
from attn_dispatch.models.table_summary import threshold_lines

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="off the card only: a GPU answers its own backend probes")

BUNDLED_H200 = Path(__file__).resolve().parents[2] / "models" / "tables" / "nvidia-h200-140gb.json"
NEW_FAMILIES = ("triton_flash", "triton_decode", "sdpa_gqa_fold")


def cuda_problem(**overrides) -> Problem:
    fields = dict(batch=1, q_heads=32, kv_heads=8, q_len=1, kv_len=8192, head_dim=128, value_dim=128,
                  dtype="bfloat16", causal=False, device_type="cuda")
    return Problem(**{**fields, **overrides})


PROBLEMS = {
    "decode_b1_8k": cuda_problem(),
    "decode_b8_32k_fp16": cuda_problem(batch=8, kv_len=32768, dtype="float16"),
    "prefill_4k_causal": cuda_problem(q_len=4096, kv_len=4096, causal=True, dtype="float16"),
    "video_8k_d64": cuda_problem(q_heads=24, kv_heads=24, q_len=8190, kv_len=8190, head_dim=64, value_dim=64),
    "fill_bool": cuda_problem(q_len=512, kv_len=16384, mask_kind="bool", mask_shape=(1, 1, 512, 16384)),
    "fp32_gqa": cuda_problem(batch=2, q_len=300, kv_len=2000, dtype="float32"),
}
# The bundled table's model at commit 4c94021, before triton_flash, triton_decode and sdpa_gqa_fold
# were registered (`ThresholdTable.model_seconds` there, on a CPU machine; 6 significant digits).
BEFORE_NEW_FAMILIES = {
    "decode_b1_8k": {"sdpa_default": 2.78676e-05, "sdpa_flash": 3.45046e-05, "sdpa_cudnn": 0.000166545,
                     "sdpa_efficient": 0.000272525, "small_q[splits=16]": 0.000231182,
                     "chunked[q=512,kv=4096]": 0.000835912, "math": 0.000462489,
                     "convert[bf16->fp16]+sdpa_flash": 0.000144853},
    "decode_b8_32k_fp16": {"sdpa_default": 0.000318379, "sdpa_flash": 0.000300738, "sdpa_cudnn": 0.000668336,
                           "sdpa_efficient": 0.00100632, "small_q[splits=16]": 0.000423939,
                           "chunked[q=512,kv=4096]": 0.0022264, "math": 0.0005426},
    "prefill_4k_causal": {"sdpa_default": 0.000294942, "sdpa_flash": 0.000591953, "sdpa_cudnn": 0.000346759,
                          "sdpa_efficient": 0.00106761, "small_q[splits=16]": 0.00639982,
                          "chunked[q=512,kv=4096]": 0.00657677, "math": 0.00815136},
    "video_8k_d64": {"sdpa_default": 0.000870535, "sdpa_flash": 0.00152478, "sdpa_cudnn": 0.000836625,
                     "sdpa_efficient": 0.00347037, "small_q[splits=16]": 0.0127009,
                     "chunked[q=512,kv=4096]": 0.0181646, "math": 0.0185335,
                     "convert[bf16->fp16]+sdpa_flash": 0.00163374},
    "fill_bool": {"sdpa_default": 0.000444131, "sdpa_flash": 0.000687987, "sdpa_cudnn": 0.000586311,
                  "sdpa_efficient": 0.00130977, "small_q[splits=16]": 0.0039166,
                  "chunked[q=512,kv=4096]": 0.00451286, "math": 0.00455183,
                  "convert[bf16->fp16]+sdpa_flash": 0.000858955},
    "fp32_gqa": {"sdpa_default": 0.00104765, "sdpa_flash": 0.000689471, "sdpa_cudnn": 0.000583379,
                 "sdpa_efficient": 0.000958974, "small_q[splits=16]": 0.000770769,
                 "chunked[q=512,kv=4096]": 0.000656807, "math": 0.000948172,
                 "convert[fp32->bf16]+sdpa_flash": 0.000167817},
}
RECORDED_DIGITS = 1e-5  # relative: the numbers above keep 6 significant digits


@pytest.fixture(scope="module")
def h200_table():
    return load_table(BUNDLED_H200)


def test_the_bundled_model_predates_the_new_families_and_is_used(h200_table):
    (model,) = h200_table.models
    assert not {f"family={family}" for family in NEW_FAMILIES} & set(model.feature_names)
    assert tuple(model.feature_names) != FEATURE_NAMES and model.compatible
    assert h200_table.usable_models == h200_table.models
    assert "not used" not in threshold_lines(h200_table)[0]


@pytest.mark.parametrize("label", sorted(BEFORE_NEW_FAMILIES))
def test_the_bundled_model_predicts_what_it_predicted_before_the_new_families(h200_table, label):
    names = list(BEFORE_NEW_FAMILIES[label])
    seconds = h200_table.model_seconds([PROBLEMS[label]] * len(names), names)
    assert seconds == pytest.approx([BEFORE_NEW_FAMILIES[label][name] for name in names], rel=RECORDED_DIGITS)


def test_a_family_the_model_never_saw_is_priced_by_the_prior_on_the_models_scale(h200_table):
    problem = cuda_problem(batch=4, kv_len=16384)
    (model,) = h200_table.models
    new = ["triton_flash[bm=128,bn=64,w=8,s=3]", "triton_decode[splits=16,bn=64,w=4,s=2]", "sdpa_gqa_fold"]
    assert not any(model.knows(name) for name in new)
    assert model.knows("convert[bf16->fp16]+sdpa_flash") and model.knows("sdpa_default")
    default = kernel_named("sdpa_default")
    scale = h200_table.model_seconds([problem], ["sdpa_default"])[0] / prior_seconds(problem, default, h200_table.spec)
    expected = [prior_seconds(problem, kernel_named(name), h200_table.spec) * scale for name in new]
    mixed = ["sdpa_default", *new, "small_q[splits=16]"]
    seconds = h200_table.model_seconds([problem] * len(mixed), mixed)
    assert seconds[1:4] == pytest.approx(expected)
    known_alone = h200_table.model_seconds([problem] * 2, ["sdpa_default", "small_q[splits=16]"])
    assert np.array_equal(seconds[[0, 4]], known_alone)  # the known ones are the model's, untouched


def test_the_triton_kernels_rank_beside_the_models_kernels_where_triton_runs(h200_table, monkeypatch):
    """With Triton able to run (a faked sm_90 and Triton 3.6), the table's model ranks the Triton
    kernels among its own by their prior on its scale, instead of its decision map ranking all."""
    monkeypatch.setattr(support, "gpu_architecture", lambda device_index=None: ("sm_90", (9, 0)))
    monkeypatch.setattr(support, "shared_memory_limit", lambda device_index=None: 227 * 1024)
    monkeypatch.setattr(support, "triton_version", lambda: (3, 6))
    monkeypatch.setattr(support.torch.version, "hip", None)
    import attn_dispatch.kernels.triton_decode as decode_module
    import attn_dispatch.kernels.triton_flash as flash_module

    monkeypatch.setattr(flash_module, "shared_memory_limit", lambda device_index=None: 227 * 1024)
    monkeypatch.setattr(decode_module, "shared_memory_limit", lambda device_index=None: 227 * 1024)
    from attn_dispatch.kernels import all_kernels

    problem = cuda_problem(batch=4, kv_len=16384)
    kernels = all_kernels(policy=AccuracyPolicy())
    ranked = dict(h200_table.rank_by_model(problem, kernels, None))
    assert "triton_decode[splits=16,bn=64,w=4,s=2]" in ranked and "sdpa_default" in ranked
    names = list(ranked)
    assert np.allclose([ranked[n] for n in names], h200_table.model_seconds([problem] * len(names), names))


def test_a_kernel_priced_only_by_the_prior_never_ranks_ahead_of_pytorchs_default(h200_table, monkeypatch):
    """The prior, unchecked on the card, prices `triton_flash[bm=64,bn=32,...]` under PyTorch's default at D256
    (measured there 2.5x slower on the H200): it ranks just behind the default, its seconds unchanged, and the
    kernels the model knows keep their order."""
    monkeypatch.setattr(support, "gpu_architecture", lambda device_index=None: ("sm_90", (9, 0)))
    monkeypatch.setattr(support, "shared_memory_limit", lambda device_index=None: 227 * 1024)
    monkeypatch.setattr(support, "triton_version", lambda: (3, 6))
    monkeypatch.setattr(support.torch.version, "hip", None)
    import attn_dispatch.kernels.triton_flash as flash_module

    monkeypatch.setattr(flash_module, "shared_memory_limit", lambda device_index=None: 227 * 1024)
    from attn_dispatch.kernels import all_kernels

    problem = cuda_problem(batch=2, q_heads=32, kv_heads=32, q_len=372, kv_len=28489, head_dim=256, value_dim=256)
    kernels = all_kernels(policy=AccuracyPolicy())
    ranked = h200_table.rank_by_model(problem, kernels, None)
    names = [name for name, _ in ranked]
    (model,) = h200_table.models
    default_at = names.index("sdpa_default")
    prior_priced = [name for name in names if name.startswith("triton_flash")]
    assert prior_priced and all(names.index(name) > default_at for name in prior_priced)
    seconds = dict(ranked)
    assert min(seconds[name] for name in prior_priced) < seconds["sdpa_default"]  # the prior alone would put it first
    known = [name for name in names if model.knows(name)]
    assert [seconds[name] for name in known] == sorted(seconds[name] for name in known)
