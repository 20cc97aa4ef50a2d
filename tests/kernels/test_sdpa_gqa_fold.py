"""`sdpa_gqa_fold`: PyTorch's SDPA on GQA query heads folded into rows gives SDPA's answer where
the fold is exact (and says why not elsewhere), folds masks of every broadcast shape, and traces
whole under `torch.compile`."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

from attn_dispatch.kernels import Problem, SdpaGqaFoldKernel, reference_attention, relative_errors
from attn_dispatch.kernels.accuracy import TOLERANCES
from attn_dispatch.kernels.sdpa_backends import BareCall, pytorch_sdpa
from attn_dispatch.kernels.sdpa_gqa_fold import fold_mask, fold_mask_bytes, folded_problem
from tests.kernels.contract import TEST_DEVICE

FOLD = SdpaGqaFoldKernel()


def _inputs(batch=2, q_heads=8, kv_heads=2, q_len=1, kv_len=37, dim=32, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    make = lambda heads, length: torch.randn(batch, heads, length, dim, generator=generator).to(dtype).to(TEST_DEVICE)  # noqa: E731
    return make(q_heads, q_len), make(kv_heads, kv_len), make(kv_heads, kv_len)


def _assert_matches(out, expected, dtype="float32"):
    rel_l2, rel_max = relative_errors(out, expected)
    assert TOLERANCES[dtype].accepts(rel_l2, rel_max), (rel_l2, rel_max)


@pytest.mark.parametrize("mask_shape", [(1, 1, 1, 37), (2, 8, 1, 37), (2, 1, 1, 37), (1, 8, 1, 1)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_decode_with_any_mask_matches_sdpa(mask_shape, kind):
    query, key, value = _inputs()
    generator = torch.Generator().manual_seed(5)
    mask = (torch.rand(mask_shape, generator=generator) < 0.7 if kind == "bool"
            else torch.randn(mask_shape, generator=generator)).to(TEST_DEVICE)
    out = FOLD(query, key, value, attn_mask=mask, enable_gqa=True)
    _assert_matches(out, reference_attention(query, key, value, attn_mask=mask, enable_gqa=True))


@pytest.mark.parametrize("mask_shape", [(2, 8, 5, 37), (1, 1, 5, 37), (2, 8, 1, 37), (1, 8, 5, 1)])
def test_several_query_rows_fold_masks_that_vary_over_heads_or_rows(mask_shape):
    query, key, value = _inputs(q_len=5)
    mask = (torch.rand(mask_shape, generator=torch.Generator().manual_seed(6)) < 0.7).to(TEST_DEVICE)
    mask[..., 0] = True  # no fully masked row: PyTorch's CPU path is then compared on live rows only
    out = FOLD(query, key, value, attn_mask=mask, enable_gqa=True)
    _assert_matches(out, reference_attention(query, key, value, attn_mask=mask, enable_gqa=True))


def test_folded_masks_line_up_with_the_folded_rows():
    """Row g * L + i of K/V head h is query head h * G + g at position i: its mask row is that head's."""
    problem = Problem(1, 6, 2, 4, 10, 16, 16, "float32", mask_kind="bool", mask_shape=(1, 6, 4, 10))
    mask = torch.rand(1, 6, 4, 10) < 0.5
    folded = fold_mask(mask, problem)
    assert folded.shape == (1, 2, 12, 10) and folded.data_ptr() == mask.data_ptr()  # a view
    assert torch.equal(folded[0, 1, 2 * 4 + 3], mask[0, 1 * 3 + 2, 3])
    rows_only = torch.rand(1, 1, 4, 10) < 0.5
    folded_rows = fold_mask(rows_only, replace_mask(problem, (1, 1, 4, 10)))
    assert folded_rows.shape == (1, 1, 12, 10) and torch.equal(folded_rows[0, 0, 2 * 4 + 1], rows_only[0, 0, 1])
    assert fold_mask_bytes(replace_mask(problem, (1, 1, 4, 10))) == 12 * 10  # the copy, one byte per bool
    assert fold_mask_bytes(replace_mask(problem, (1, 1, 1, 10))) == 0


def replace_mask(problem: Problem, shape: tuple[int, ...]) -> Problem:
    from dataclasses import replace

    return replace(problem, mask_shape=shape)


def test_folded_problem_is_plain_multi_head_attention():
    problem = Problem(2, 32, 8, 3, 100, 64, 64, "float16", mask_kind="float", mask_shape=(2, 32, 3, 100))
    folded = folded_problem(problem)
    assert (folded.q_heads, folded.kv_heads, folded.q_len, folded.gqa_ratio) == (8, 8, 12, 1)
    assert folded.mask_shape == (2, 8, 12, 100)


def test_causal_decode_against_a_cache_folds():
    query, key, value = _inputs(q_len=1)
    out = FOLD(query, key, value, attn_mask=causal_lower_right(1, 37), enable_gqa=True)
    _assert_matches(out, reference_attention(query, key, value, enable_gqa=True))


@pytest.mark.parametrize("problem", [
    Problem(1, 8, 8, 1, 20, 64, 64, "float32"),  # no GQA
    Problem(1, 8, 2, 4, 20, 64, 64, "float32", causal=True),  # causal rows see different keys
    Problem(1, 8, 2, 1, 20, 64, 64, "float32", causal=True),  # top-left: one row sees key 0 only
], ids=["no_gqa", "causal_prefill", "causal_top_left_decode"])
def test_refuses_where_folding_is_not_exact(problem):
    reasons = FOLD.reasons(problem)
    assert reasons and all(len(reason) > 20 for reason in reasons)


def test_the_warm_runner_is_the_folded_call_itself():
    query, key, value = _inputs(q_len=2)
    problem = Problem.from_tensors(query, key, value, enable_gqa=True)
    runner = FOLD.runner(problem)
    assert runner != FOLD.run and FOLD.sdpa_call(problem) is None
    out = runner(query, key, value, None, None, True, problem)
    _assert_matches(out, reference_attention(query, key, value, enable_gqa=True))
    # exactly PyTorch's own call on the folded rows: the same kernel on the same tensors
    assert torch.equal(out, pytorch_sdpa(query.reshape(2, 2, 8, 32), key, value).reshape(2, 8, 2, 32))
    unbatched = Problem.from_tensors(query[0], key[0], value[0], enable_gqa=True)  # 3-D inputs: through `run`
    three_d = FOLD.runner(unbatched)(query[0], key[0], value[0], None, None, True, unbatched)
    _assert_matches(three_d, reference_attention(query[0], key[0], value[0], enable_gqa=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_on_a_cpu_the_runner_and_the_fast_path_call_pytorchs_fused_cpu_kernel(dtype):
    """Where PyTorch's SDPA takes the folded call to its fused CPU kernel, the runner calls that
    operator (and names it for the C++ fast path): the same output, bit for bit, as SDPA's call."""
    query, key, value = _inputs(q_len=3, dtype=dtype, dim=40)
    query, key, value = query.cpu(), key.cpu(), value.cpu()
    problem = Problem.from_tensors(query, key, value, enable_gqa=True)
    assert FOLD.bare_call(problem) == BareCall("flash_cpu", (2, 2, 12, 40), (2, 8, 3, 40))
    out = FOLD.runner(problem)(query, key, value, None, 0.3, True, problem)
    assert out.dtype == dtype and out.shape == (2, 8, 3, 40)
    assert torch.equal(out, pytorch_sdpa(query.reshape(2, 2, 12, 40), key, value, scale=0.3).reshape(2, 8, 3, 40))


def test_where_pytorch_would_not_take_its_fused_cpu_kernel_the_runner_calls_sdpa():
    """A value head dim of its own (PyTorch's math backend), a mask, no GQA: no bare operator."""
    query, key, _ = _inputs(q_len=2)
    value = torch.randn(2, 2, 37, 48, generator=torch.Generator().manual_seed(4)).to(TEST_DEVICE)
    problem = Problem.from_tensors(query, key, value, enable_gqa=True)
    assert FOLD.bare_call(problem) is None
    out = FOLD.runner(problem)(query, key, value, None, None, True, problem)
    _assert_matches(out, reference_attention(query, key, value, enable_gqa=True))
    masked = Problem.from_tensors(*_inputs(), torch.ones(1, 1, 1, 37, dtype=torch.bool, device=TEST_DEVICE),
                                   enable_gqa=True)
    assert FOLD.bare_call(masked) is None and FOLD.runner(masked) == FOLD.run
    assert FOLD.bare_call(Problem(1, 8, 8, 1, 20, 64, 64, "float32")) is None
    assert FOLD.bare_call(Problem(1, 8, 2, 1, 20, 64, 64, "float16", device_type="cuda")) is None


def test_the_runner_takes_a_last_dimension_that_is_not_dense_through_run():
    query, key, value = _inputs(q_len=2, dim=64)
    query, key, value = query[..., ::2], key[..., ::2], value[..., ::2]  # head dim 32, stride 2
    problem = Problem.from_tensors(query, key, value, enable_gqa=True)
    out = FOLD.runner(problem)(query, key, value, None, None, True, problem)
    _assert_matches(out, reference_attention(query, key, value, enable_gqa=True))


def test_the_fast_path_serves_the_fold_in_cpp_with_the_runner_s_exact_result(tmp_path, monkeypatch):
    """The dispatcher's C++ fast path makes the fold's operator call itself (where this process can
    load the library the dispatcher tests build: `tests/dispatcher/conftest.py`)."""
    from attn_dispatch.dispatcher import Dispatcher, fast_path
    from tests.dispatcher.conftest import FAST_PATH_TEST_HOME

    if TEST_DEVICE != "cpu" or not fast_path.fast_path_enabled() or fast_path.load(FAST_PATH_TEST_HOME) is None:
        pytest.skip("the fast path is not built (the dispatcher tests build it) or the tests run on a GPU")
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path))
    ours = Dispatcher(kernels=["sdpa_gqa_fold"])
    fast = ours.fast_attention
    query, key, value = _inputs(q_len=1, kv_len=45)
    for _ in range(2):  # the first call makes the plan, the second makes it hot (its C++ entry)
        fast(query, key, value, scale=0.3, enable_gqa=True)
    hits = ours._fast.hits
    out = fast(query, key, value, scale=0.3, enable_gqa=True)
    assert ours._fast.hits == hits + 1, "not served in C++"
    problem = Problem.from_tensors(query, key, value, enable_gqa=True)
    assert torch.equal(out, FOLD.runner(problem)(query, key, value, None, 0.3, True, problem))
    assert ours.stats() == {"sdpa_gqa_fold": 3}


def test_strided_query_and_cache_slice():
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(2, 3, 8, 32, generator=generator).transpose(1, 2).to(TEST_DEVICE)  # [B, L, H, D] seen as [B, H, L, D]
    cache = torch.randn(2, 2, 90, 32, generator=generator).to(TEST_DEVICE)
    key, value = cache[:, :, :60], cache.flip(2)[:, :, :60]
    out = FOLD(query, key, value, enable_gqa=True)
    _assert_matches(out, reference_attention(query, key, value, enable_gqa=True))


@pytest.mark.usefixtures("fresh_dynamo")
def test_compiles_whole_through_the_dispatcher(monkeypatch):
    from attn_dispatch.dispatcher import Dispatcher
    from tests.dispatcher.helpers import FixedRanker, use_ranking

    use_ranking(monkeypatch, FixedRanker(["sdpa_gqa_fold"]))
    ours = Dispatcher(kernels=["sdpa_gqa_fold"])
    query, key, value = _inputs()
    compiled = torch.compile(lambda q, k, v: ours.attention(q, k, v, enable_gqa=True), backend="aot_eager",
                             fullgraph=True)
    _assert_matches(compiled(query, key, value), reference_attention(query, key, value, enable_gqa=True))
    assert ours.stats() == {"sdpa_gqa_fold (traced)": 1}


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
