"""Feature rows of (problem, kernel) pairs."""

from __future__ import annotations

import numpy as np
import pytest

from attn_dispatch.kernels import Problem, all_kernels
from attn_dispatch.models.features import FEATURE_NAMES, PRIOR_COLUMN, feature_matrix
from attn_dispatch.models.probe_store import FALLBACK_CPU_SPEC


def test_shape_names_and_finiteness():
    problems = [Problem(1, 8, 2, 1, 4096, 128, 128, "bfloat16"), Problem(2, 4, 4, 512, 512, 64, 64, "float32", causal=True)]
    names = [k.name for k in all_kernels()]
    rows = [(p, n) for p in problems for n in names]
    X = feature_matrix([p for p, _ in rows], [n for _, n in rows], FALLBACK_CPU_SPEC)
    assert X.shape == (len(rows), len(FEATURE_NAMES)) and np.isfinite(X).all()
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES) and FEATURE_NAMES[PRIOR_COLUMN] == "log_prior_s_v2"
    family = X[:, [i for i, f in enumerate(FEATURE_NAMES) if f.startswith("family=")]]
    assert (family.sum(axis=1) == 1).all()  # exactly one (inner) family per row


def test_chunk_parameters_are_clipped_to_the_problem():
    problem = Problem(1, 4, 4, 100, 300, 64, 64, "float32")
    X = feature_matrix([problem] * 2, ["chunked[q=512,kv=4096]", "math"], FALLBACK_CPU_SPEC)
    q, kv = FEATURE_NAMES.index("log2_q_chunk"), FEATURE_NAMES.index("log2_kv_chunk")
    assert X[0, q] == X[1, q] == pytest.approx(np.log2(100)) and X[0, kv] == pytest.approx(np.log2(300))


def test_mismatched_lengths_and_foreign_names_are_errors():
    problem = Problem(1, 4, 4, 16, 64, 64, 64)
    with pytest.raises(ValueError, match="one kernel name per problem"):
        feature_matrix([problem], ["math", "math"], FALLBACK_CPU_SPEC)
    with pytest.raises(ValueError, match="unknown kernel"):
        feature_matrix([problem], ["evil_kernel"], FALLBACK_CPU_SPEC)


def test_triton_parameters_are_features():
    """The Triton kernels' block rows, splits, warps and stages are what the cost model sees of them."""
    prefill = Problem(1, 8, 2, 1000, 1000, 64, 64, "float16", causal=True, device_type="cuda")
    names = ["triton_flash[bm=128,bn=64,w=8,s=3]", "triton_flash[bm=64,bn=32,w=4,s=2]"]
    X = feature_matrix([prefill] * 2, names, FALLBACK_CPU_SPEC)
    column = {name: FEATURE_NAMES.index(name) for name in
              ("log2_q_chunk", "log2_kv_chunk", "log2_warps", "log2_stages", "log2_blocks_visited", "visited_fraction")}
    assert list(X[0, [column["log2_q_chunk"], column["log2_kv_chunk"], column["log2_warps"]]]) == [7, 6, 3]
    assert X[0, column["log2_stages"]] == pytest.approx(np.log2(3)) and X[1, column["log2_warps"]] == 2
    assert 0.5 < X[0, column["visited_fraction"]] < 0.6 and X[1, column["log2_blocks_visited"]] > X[0, column["log2_blocks_visited"]]
    decode = Problem(1, 32, 8, 1, 4096, 128, 128, "bfloat16", device_type="cuda")
    X = feature_matrix([decode] * 2, ["triton_decode[splits=16,bn=64,w=4,s=2]", "small_q[splits=16]"], FALLBACK_CPU_SPEC)
    splits = FEATURE_NAMES.index("log2_splits")
    assert X[0, splits] == 4 and X[0, column["log2_q_chunk"]] == 4  # 16 splits; 4 packed rows in a 16-row block
    assert X[1, column["log2_warps"]] == X[1, column["log2_stages"]] == 0  # not a Triton kernel
