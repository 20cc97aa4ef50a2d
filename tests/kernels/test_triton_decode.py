"""`triton_decode`: the split-KV Triton kernel against the float64 reference (a seeded fuzz over
every axis of SDPA semantics, on the CPU under Triton's interpreter), its layout arithmetic, its
reasons, and on a GPU (``ATTN_DISPATCH_TEST_DEVICE=cuda``) bf16, long caches, `torch.compile`
and CUDA-graph capture."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

from attn_dispatch.kernels import (
    Problem,
    TritonDecodeKernel,
    kernel_from_name,
    reference_attention,
    relative_errors,
)
from attn_dispatch.kernels._triton_decode_layout import DecodeLayout, visible_key_count
from attn_dispatch.kernels._triton_support import INTERPRETER_BF16_REASON
from attn_dispatch.kernels.accuracy import TOLERANCES
from attn_dispatch.kernels.registry import interpreted, serving
from attn_dispatch.kernels.triton_decode import MAX_PACKED_ROWS, MIN_DOT_SIZE
from tests.kernels.contract import TEST_DEVICE

ON_GPU = torch.device(TEST_DEVICE).type == "cuda"
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs ATTN_DISPATCH_TEST_DEVICE=cuda")
FUZZ_CASES = 160
HEAD_DIMS = (16, 24, 40, 64, 72, 80, 96, 112, 128)
DTYPES = ("float32", "float16", "bfloat16") if ON_GPU else ("float32", "float16")
KERNEL_CHOICES = [(splits, bn) for splits in (1, 2, 3, 5, 8, 16) for bn in (16, 32, 64)]


def _causal_bottom_right(q_len: int, kv_len: int, device) -> torch.Tensor:
    """Query i sees keys 0 .. i + S - L (bool, True = attend)."""
    rows = torch.arange(q_len, device=device)[:, None]
    return torch.arange(kv_len, device=device)[None, :] <= rows + (kv_len - q_len)


def _to_test_device(item):
    """Tensors moved to the test device; anything else (None, a `CausalBias`, numbers) as it is."""
    if isinstance(item, torch.Tensor) and not hasattr(item, "seq_len_q"):
        return item.to(TEST_DEVICE)
    return item


def fuzz_case(index: int) -> dict:
    """One seeded SDPA call for the fuzz: its inputs, the float64 reference's inputs (bottom-right
    causality spelled as a bool mask), the kernel and a description."""
    rng = random.Random(index)
    generator = torch.Generator().manual_seed(index)
    dtype = getattr(torch, rng.choice(DTYPES))
    batch, kv_heads, group = rng.choice([1, 2]), rng.choice([1, 2]), rng.choice([1, 2, 3, 4, 8])
    q_len, kv_len = rng.choice([1, 1, 1, 2, 3, 5, 8, 16]), rng.randint(1, 150)
    head_dim = rng.choice(HEAD_DIMS)
    value_dim = rng.choice([head_dim, head_dim, 16, 48, 80])
    causal = rng.choice(["none", "none", "top_left", "bottom_right"])
    mask_kind = "none" if causal == "bottom_right" else rng.choice(["none", "bool", "float"])
    layout = rng.choice(["contiguous", "transposed", "cache_slice"])
    scale = rng.choice([None, None, 0.05, 0.3])
    splits, bn = rng.choice(KERNEL_CHOICES)
    q_heads = kv_heads * group

    def tensor(heads: int, length: int, dim: int, room: int = 0) -> torch.Tensor:
        if layout == "transposed":  # [B, L, H, D] seen as [B, H, L, D], as transformers passes them
            return torch.randn(batch, length, heads, dim, generator=generator).to(dtype).transpose(1, 2)
        full = torch.randn(batch, heads, length + room, dim, generator=generator).to(dtype)
        return full[:, :, :length]  # a slice of a longer KV cache: strided in batch and heads

    room = rng.randint(1, 40) if layout == "cache_slice" else 0
    query = tensor(q_heads, q_len, head_dim)
    key, value = tensor(kv_heads, kv_len, head_dim, room), tensor(kv_heads, kv_len, value_dim, room)
    mask = None
    if mask_kind != "none":
        spans = [rng.random() < 0.5 for _ in range(4)]  # which of (B, H, L, S) the mask spans
        shape = [size if span else 1 for size, span in zip((batch, q_heads, q_len, kv_len), spans, strict=True)]
        if mask_kind == "bool":
            mask = torch.rand(shape, generator=generator) < 0.7
            if rng.random() < 0.3 and shape[2] > 1:
                mask[:, :, 0] = False  # fully masked rows give zeros
        else:
            mask = torch.randn(shape, generator=generator).to(rng.choice([dtype, torch.float32]))
            if rng.random() < 0.3 and shape[2] > 1:
                mask[:, :, 0] = float("-inf")
    gqa = group > 1
    call = {"attn_mask": mask, "is_causal": causal == "top_left", "scale": scale, "enable_gqa": gqa}
    reference = dict(call)
    if causal == "bottom_right":  # query rows past the keys (L > S) see none: dead rows
        call["attn_mask"] = causal_lower_right(q_len, kv_len)
        reference["attn_mask"] = _causal_bottom_right(q_len, kv_len, "cpu")
    description = (f"#{index} {dtype} B{batch} {q_heads}/{kv_heads} L{q_len} S{kv_len} E{head_dim} Ev{value_dim} "
                   f"causal={causal} mask={mask_kind} {layout} scale={scale} splits={splits} bn={bn}")
    return {
        "tensors": [_to_test_device(t) for t in (query, key, value)],
        "call": {name: _to_test_device(item) for name, item in call.items()},
        "reference": {name: _to_test_device(item) for name, item in reference.items()},
        "kernel": TritonDecodeKernel(splits=splits, bn=bn, w=4, s=1),
        "description": description,
    }


@pytest.mark.parametrize("index", range(FUZZ_CASES))
def test_fuzz_matches_float64_reference(index):
    case = fuzz_case(index)
    query, key, value = case["tensors"]
    kernel = case["kernel"]
    problem = Problem.from_tensors(query, key, value, case["call"]["attn_mask"], case["call"]["is_causal"],
                                   case["call"]["enable_gqa"])
    assert not kernel.reasons(problem), f"{case['description']}: {kernel.reasons(problem)}"
    out = kernel(query, key, value, **case["call"])
    expected = reference_attention(query, key, value, **case["reference"])
    assert out.shape == expected.shape and out.dtype == query.dtype
    rel_l2, rel_max = relative_errors(out, expected)
    tolerance = TOLERANCES[problem.dtype]
    assert tolerance.accepts(rel_l2, rel_max), f"{case['description']}: relative L2 {rel_l2:.2e}, max {rel_max:.2e}"
    dead = expected.abs().amax(dim=-1) == 0  # rows with every key blocked (values are never all zero)
    assert torch.count_nonzero(out[dead]) == 0, f"{case['description']}: fully masked rows are not zero"


def test_fuzz_covers_every_axis():
    assert FUZZ_CASES >= 150  # issue 32's floor per family
    descriptions = [fuzz_case(index)["description"] for index in range(FUZZ_CASES)]
    for needle in ("causal=top_left", "causal=bottom_right", "mask=bool", "mask=float", "transposed", "cache_slice",
                   "float16", "float32", " 8/1 ", "Ev16", "E24", "E80", "E112", "scale=0.05", "splits=3"):
        assert any(needle in text for text in descriptions), needle
    assert any("L16" in text and "causal=bottom_right" in text for text in descriptions)


def _run_launch_directly(query, key, value, mask, causal_offset, splits, block_n):
    from attn_dispatch.kernels._triton_decode_launch import run_decode

    return run_decode(query, key, value, mask, query.shape[-1] ** -0.5, True, causal_offset, splits, block_n, 4, 1)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_mask_with_bottom_right_causality_and_dead_rows(dtype, mask_kind):
    """Causality shifted by S - L < 0 (more query rows than keys: the first rows see nothing)
    together with a per-head mask, through the launch itself (no public call combines the two)."""
    generator = torch.Generator().manual_seed(7)
    torch_dtype = getattr(torch, dtype)
    query = torch.randn(1, 4, 12, 32, generator=generator).to(torch_dtype).to(TEST_DEVICE)
    key, value = (torch.randn(1, 2, 9, 32, generator=generator).to(torch_dtype).to(TEST_DEVICE) for _ in range(2))
    if mask_kind == "bool":
        mask = torch.rand(1, 4, 12, 9, generator=generator) < 0.8
    else:
        mask = torch.randn(1, 4, 12, 9, generator=generator).to(torch_dtype)
    mask = mask.to(TEST_DEVICE)
    offset = 9 - 12
    allowed = _causal_bottom_right(12, 9, TEST_DEVICE)
    combined = mask & allowed if mask_kind == "bool" else mask.masked_fill(~allowed, float("-inf"))
    out = _run_launch_directly(query, key, value, mask, offset, splits=2, block_n=16)
    expected = reference_attention(query, key, value, attn_mask=combined, enable_gqa=True)
    rel_l2, rel_max = relative_errors(out, expected)
    assert TOLERANCES[dtype].accepts(rel_l2, rel_max), (rel_l2, rel_max)
    assert torch.count_nonzero(out[:, :, :3]) == 0  # rows 0..2 see no key


def test_many_splits_merge_exactly_in_fp32():
    """150 splits, each a partial softmax: the merge stays within fp32's tolerance."""
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(1, 8, 1, 64, generator=generator).to(TEST_DEVICE)
    key, value = (torch.randn(1, 2, 2390, 64, generator=generator).to(TEST_DEVICE) for _ in range(2))
    kernel = TritonDecodeKernel(splits=150, bn=16, w=4, s=1)
    assert kernel.layout(Problem.from_tensors(query, key, value, enable_gqa=True)).splits == 150  # 16 keys each
    out = kernel(query, key, value, enable_gqa=True)
    rel_l2, rel_max = relative_errors(out, reference_attention(query, key, value, enable_gqa=True))
    assert TOLERANCES["float32"].accepts(rel_l2, rel_max), (rel_l2, rel_max)


@pytest.mark.parametrize("warps", [1, 8])
def test_each_row_block_merges_its_own_splits(warps):
    """128 packed rows (two row blocks), 5 splits, each program's warps: every row merged."""
    generator = torch.Generator().manual_seed(5)
    query = torch.randn(1, 16, 8, 64, generator=generator).to(TEST_DEVICE)
    key, value = (torch.randn(1, 1, 300, 64, generator=generator).to(TEST_DEVICE) for _ in range(2))
    kernel = TritonDecodeKernel(splits=5, bn=16, w=warps, s=1)
    layout = kernel.layout(Problem.from_tensors(query, key, value, enable_gqa=True))
    assert (layout.row_blocks, layout.splits) == (2, 5)
    out = kernel(query, key, value, enable_gqa=True)
    rel_l2, rel_max = relative_errors(out, reference_attention(query, key, value, enable_gqa=True))
    assert TOLERANCES["float32"].accepts(rel_l2, rel_max), (rel_l2, rel_max)


def test_large_finite_penalties_stay_finite_in_fp32():
    """A float mask of fp32's lowest value on every key of a row (transformers' padding masks):
    the row attends uniformly, as the float64 reference does, never zeros or NaN."""
    query = torch.randn(1, 2, 3, 16).to(TEST_DEVICE)
    key, value = torch.randn(1, 2, 40, 16).to(TEST_DEVICE), torch.randn(1, 2, 40, 16).to(TEST_DEVICE)
    mask = torch.zeros(1, 1, 3, 40)
    mask[..., 1, :] = torch.finfo(torch.float32).min
    mask = mask.to(TEST_DEVICE)
    out = TritonDecodeKernel(splits=3, bn=16)(query, key, value, attn_mask=mask)
    expected = reference_attention(query, key, value, attn_mask=mask)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------- layout
@pytest.mark.parametrize("kv_len", [1, 15, 64, 65, 1000, 4097])
@pytest.mark.parametrize("splits", [1, 3, 16, 100])
@pytest.mark.parametrize("block_n", [16, 64])
def test_layout_covers_every_key_once(kv_len, splits, block_n):
    layout = DecodeLayout.of(Problem(1, 8, 2, 1, kv_len, 64, 64, "float16"), splits, block_n)
    assert layout.keys_per_split % block_n == 0 and 1 <= layout.splits <= splits
    assert (layout.splits - 1) * layout.keys_per_split < kv_len <= layout.splits * layout.keys_per_split
    assert layout.rows == 4 and layout.block_m == MIN_DOT_SIZE and layout.row_blocks == 1


def test_layout_reads_only_keys_some_row_sees():
    top_left = Problem(1, 2, 2, 5, 100, 64, 64, "float16", causal=True)
    bottom_right = Problem(1, 2, 2, 5, 100, 64, 64, "float16", causal=True, causal_alignment="bottom_right")
    assert visible_key_count(top_left) == 5 and visible_key_count(bottom_right) == 100
    assert visible_key_count(Problem(1, 2, 2, 120, 100, 64, 64, "float16", causal=True)) == 100


def test_packed_rows_take_several_row_blocks_up_to_the_limit():
    layout = DecodeLayout.of(Problem(1, 16, 2, 16, 50, 80, 48, "float32"), 4, 16)
    assert (layout.rows, layout.block_m, layout.row_blocks, layout.block_d, layout.block_dv) == (128, 64, 2, 128, 64)
    too_many = Problem(1, 32, 1, MAX_PACKED_ROWS // 32 + 1, 50, 64, 64, "float32")
    assert any("packs GQA group x query rows" in reason for reason in TritonDecodeKernel().reasons(too_many))


def test_workspace_counts_the_partials_of_every_split():
    problem = Problem(2, 32, 8, 1, 32768, 128, 128, "bfloat16")
    one, many = TritonDecodeKernel(splits=1), TritonDecodeKernel(splits=16)
    assert one.workspace_bytes(problem) == problem.out_bytes
    partials = 2 * 8 * 16 * 4 * (128 + 2) * 4  # B x Hkv x splits x rows x (Ev + max + sum) x fp32
    assert many.workspace_bytes(problem) == problem.out_bytes + partials


# ---------------------------------------------------------------------- names, reasons, sets
def test_name_round_trips_and_bad_parameters_name_themselves():
    kernel = kernel_from_name("triton_decode[splits=32,bn=128,w=8,s=3]")
    assert (kernel.splits, kernel.block_n, kernel.warps, kernel.stages) == (32, 128, 8, 3)
    assert TritonDecodeKernel().name == "triton_decode[splits=16,bn=64,w=4,s=2]"
    with pytest.raises(ValueError, match="bn"):
        TritonDecodeKernel(bn=48)
    with pytest.raises(ValueError, match="splits"):
        TritonDecodeKernel(splits=0)
    with pytest.raises(ValueError, match="w"):
        TritonDecodeKernel(w=3)


def test_reasons_name_what_the_kernel_cannot_take(monkeypatch):
    kernel = TritonDecodeKernel()
    assert any("head dims up to 256" in r for r in kernel.reasons(Problem(1, 2, 2, 1, 9, 320, 320, "float32")))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernel.reasons(Problem(1, 2, 2, 1, 9, 64, 64, "bfloat16")) == [INTERPRETER_BF16_REASON]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "TRITON_INTERPRET" in kernel.reasons(Problem(1, 2, 2, 1, 9, 64, 64, "float32"))[0]


def test_a_config_the_card_cannot_hold_is_a_reason(monkeypatch):
    monkeypatch.setattr("attn_dispatch.kernels.triton_decode.triton_reasons", lambda device_type, dtype: [])
    monkeypatch.setattr("attn_dispatch.kernels.triton_decode.shared_memory_limit", lambda: 64 * 1024)  # gfx906's LDS
    problem = Problem(1, 32, 8, 1, 4096, 128, 128, "float16", device_type="cuda")
    assert TritonDecodeKernel(bn=32, s=2).reasons(problem) == []
    [reason] = TritonDecodeKernel(bn=128, s=3).reasons(problem)
    assert "shared memory" in reason and "64 KiB" in reason


def test_interpreted_kernels_serve_no_call_and_time_nothing():
    from attn_dispatch.calibration.candidates import kernel_set as calibration_set
    from attn_dispatch.dispatcher.core import kernel_set
    from attn_dispatch.kernels import AccuracyPolicy

    if ON_GPU:
        pytest.skip("the interpreter is off on a GPU run")
    kernel = TritonDecodeKernel()
    assert interpreted(kernel) and serving([kernel]) == []
    for named in ("all", "portable"):
        assert not any(name.startswith("triton_decode") for name in kernel_set(named, AccuracyPolicy()))
        assert not any(k.family == "triton_decode" for k in calibration_set(named, policy=AccuracyPolicy()))
    assert kernel.name in kernel_set([kernel.name], AccuracyPolicy())  # named explicitly: tests run it


def _fresh_interpreted(code: str) -> str:
    """What `code` prints in a fresh Python process under Triton's interpreter."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}).stdout


def test_importing_the_kernels_does_not_import_triton():
    code = "import sys, attn_dispatch.kernels as k; k.TritonDecodeKernel(); print('triton' in sys.modules)"
    assert _fresh_interpreted(code).strip() == "False"


def test_an_eager_call_registers_no_operator():
    """Eager inference calls of both Triton families launch directly: the operators (whose registration
    imports Inductor, about a second) are left for traced calls."""
    code = ("import sys, torch, attn_dispatch.kernels as k\n"
            "q, kv = torch.randn(1, 4, 2, 16), torch.randn(1, 2, 40, 16)\n"
            "k.TritonDecodeKernel(splits=4, bn=16)(q, kv, kv, enable_gqa=True)\n"
            "k.TritonFlashKernel()(q, kv, kv, enable_gqa=True)\n"
            "print(sorted({'attn_dispatch.kernels._triton_decode_operator', 'torch._inductor',"
            " 'attn_dispatch.kernels._triton_flash_operators'} & set(sys.modules)))")
    assert _fresh_interpreted(code).strip() == "[]"


def test_a_traced_call_registers_and_records_the_operators():
    """After eager calls (no operator registered), tracing (`make_fx`, as AOTAutograd and export trace)
    imports the operators on the spot: the graph holds them and replays the eager outputs exactly."""
    code = ("import torch\n"
            "from torch.fx.experimental.proxy_tensor import make_fx\n"
            "import attn_dispatch.kernels as k\n"
            "q, kv = torch.randn(1, 4, 2, 16), torch.randn(1, 2, 40, 16)\n"
            "for kernel in (k.TritonDecodeKernel(splits=4, bn=16), k.TritonFlashKernel()):\n"
            "    attend = lambda q, kv: kernel(q, kv, kv, enable_gqa=True)\n"
            "    eager = attend(q, kv)\n"
            "    graph = make_fx(attend, tracing_mode='real')(q, kv)\n"
            "    ops = [str(n.target) for n in graph.graph.nodes if 'attn_dispatch' in str(n.target)]\n"
            "    print(ops, torch.equal(graph(q, kv), eager))")
    assert _fresh_interpreted(code).split("\n")[:2] == ["['attn_dispatch.triton_decode.default'] True",
                                                          "['attn_dispatch.triton_flash_forward.default'] True"]


def test_the_dispatcher_runs_it_when_named():
    from attn_dispatch.dispatcher import Dispatcher

    generator = torch.Generator().manual_seed(1)
    query = torch.randn(2, 8, 1, 64, generator=generator).to(TEST_DEVICE)
    key, value = (torch.randn(2, 2, 70, 64, generator=generator).to(TEST_DEVICE) for _ in range(2))
    ours = Dispatcher(kernels=["triton_decode[splits=16,bn=64,w=4,s=2]"])
    out = ours.attention(query, key, value, enable_gqa=True)
    rel_l2, rel_max = relative_errors(out, reference_attention(query, key, value, enable_gqa=True))
    assert TOLERANCES["float32"].accepts(rel_l2, rel_max)
    assert ours.stats() == {"triton_decode[splits=16,bn=64,w=4,s=2]": 1}


# ---------------------------------------------------------------------- GPU
def _decode_inputs(batch, kv_len, dtype, q_heads=32, kv_heads=8, dim=128, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda heads, length: torch.randn(batch, heads, length, dim, device="cuda", dtype=dtype,  # noqa: E731
                                             generator=generator)
    return make(q_heads, 1), make(kv_heads, kv_len), make(kv_heads, kv_len)


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel_name", ["triton_decode[splits=16,bn=64,w=4,s=2]", "triton_decode[splits=64,bn=32,w=4,s=2]"])
def test_gpu_long_cache_decode_matches_reference(dtype, kernel_name):
    query, key, value = _decode_inputs(4, 32768 + 77, dtype)
    out = kernel_from_name(kernel_name)(query, key, value, enable_gqa=True)
    rel_l2, rel_max = relative_errors(out, reference_attention(query, key, value, enable_gqa=True))
    assert TOLERANCES[str(dtype).removeprefix("torch.")].accepts(rel_l2, rel_max), (rel_l2, rel_max)


@gpu_only
def test_gpu_offsets_past_two_to_the_31():
    """A cache slice whose elements sit past 2^31 from its base (int64 offsets in the kernel)."""
    cache = torch.empty(3, 8, 2**20, 128, device="cuda", dtype=torch.float16)  # 3 x 2^30 elements, 6 GiB
    key = cache[2:, :, :5000]  # starts 2^31 elements into the cache
    key.normal_()
    value = torch.randn_like(key)
    query = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16)
    assert key.storage_offset() >= 2**31
    out = TritonDecodeKernel()(query, key, value, enable_gqa=True)
    rel_l2, rel_max = relative_errors(out, reference_attention(query, key, value, enable_gqa=True))
    assert TOLERANCES["float16"].accepts(rel_l2, rel_max), (rel_l2, rel_max)


@gpu_only
def test_gpu_compiles_whole_through_the_dispatcher(monkeypatch):
    from attn_dispatch.dispatcher import Dispatcher
    from tests.dispatcher.helpers import FixedRanker, use_ranking

    name = "triton_decode[splits=16,bn=64,w=4,s=2]"
    use_ranking(monkeypatch, FixedRanker([name]))
    ours = Dispatcher(kernels=[name])
    query, key, value = _decode_inputs(2, 4096, torch.float16)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: ours.attention(q, k, v, enable_gqa=True), fullgraph=True)
    out = compiled(query, key, value)
    torch.testing.assert_close(out, TritonDecodeKernel()(query, key, value, enable_gqa=True))
    assert ours.stats() == {f"{name} (traced)": 1}
    torch._dynamo.reset()


@gpu_only
def test_gpu_cuda_graph_capture_and_replay():
    kernel = TritonDecodeKernel(splits=32, bn=64)
    query, key, value = _decode_inputs(2, 8192, torch.bfloat16)
    kernel(query, key, value, enable_gqa=True)  # compile outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernel(query, key, value, enable_gqa=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel(query, key, value, enable_gqa=True)
    for seed in (1, 2):
        new_query, new_key, new_value = _decode_inputs(2, 8192, torch.bfloat16, seed=seed)
        query.copy_(new_query), key.copy_(new_key), value.copy_(new_value)
        graph.replay()
        torch.cuda.synchronize()
        rel_l2, rel_max = relative_errors(out, reference_attention(query, key, value, enable_gqa=True))
        assert TOLERANCES["bfloat16"].accepts(rel_l2, rel_max), (seed, rel_l2, rel_max)
