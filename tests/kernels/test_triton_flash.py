"""`triton_flash`: a fuzz of forward and gradients against the float64 reference (under Triton's
interpreter on the CPU, on the device with ``ATTN_DISPATCH_TEST_DEVICE=cuda``), its reasons, memory,
names, and how the dispatcher treats it. The contract suite (`test_contract`) covers its default
variants too."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

from attn_dispatch.calibration.measure import measure_peak_bytes
from attn_dispatch.kernels import (
    MathKernel,
    Problem,
    TritonFlashKernel,
    base,
    kernel_from_name,
    portable_kernels,
    reference_attention,
    relative_errors,
)
from attn_dispatch.kernels import _triton_flash_config as flash_config
from attn_dispatch.kernels.accuracy import Tolerance
from attn_dispatch.kernels.registry import interpreted
from tests.kernels.cases import LARGE_MAGNITUDE, Case
from tests.kernels.contract import TEST_DEVICE, problem_of
from tests.kernels.test_backward import GRADIENT_TOLERANCE_FACTOR, bytes_allocated_so_far, gradients
from tests.kernels.test_triton_support import fake_gpu

ON_GPU = torch.device(TEST_DEVICE).type == "cuda"
FUZZ_CASES = 200 if ON_GPU else 175
"""bf16 on a GPU adds inputs of large magnitude (forward only): more cases keep the gradient floor."""
FUZZ_GRADIENT_CASES = 150
"""Issue 32's floor: cases whose gradients are compared (inputs of large magnitude compare the forward only)."""
FUZZ_HEAD_DIMS = (8, 16, 24, 40, 64, 72, 80, 96, 112, 128)
FUZZ_CONFIGS = ((16, 16, 4, 1), (16, 32, 4, 2), (32, 16, 2, 2), (64, 32, 4, 2), (128, 64, 8, 3))
"""Small blocks on purpose: the fuzz's sequences (up to 20 queries, 36 keys) then span several
query and key blocks, diagonal blocks and partial last blocks. Few heads (up to 8 with the batch):
Triton's interpreter runs each program in turn."""
SMALL_CONFIG = (64, 32, 4, 2)
"""What a case runs where the GPU's shared memory refuses its drawn configuration."""
FUZZ_DTYPES = ("float32", "float16", "bfloat16") if ON_GPU else ("float32", "float16")
"""bf16 on GPUs only: `support.INTERPRETER_BF16_REASON`."""

MAX_DRAWS = 50

WHY_NOT_HERE = TritonFlashKernel().reasons(Problem(1, 2, 2, 8, 8, 16, 16, "float32", device_type=TEST_DEVICE))
needs_triton = pytest.mark.skipif(bool(WHY_NOT_HERE), reason="; ".join(WHY_NOT_HERE))
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="GPU test: set ATTN_DISPATCH_TEST_DEVICE=cuda on a GPU machine")


def fuzz_case(index: int) -> tuple[Case, str, TritonFlashKernel]:
    """The `index`-th fuzz case: (inputs, causal alignment "none" / "top_left" / "bottom_right",
    kernel). Drawn from generators seeded by `index`, so every case is reproducible alone; a draw
    where no row sees two keys is drawn again (`gradients_vanish`)."""
    for attempt in range(MAX_DRAWS):
        case, alignment, kernel = _draw(random.Random(index * MAX_DRAWS + attempt), index)
        if not gradients_vanish(case, alignment):
            return case, alignment, kernel
    raise AssertionError(f"fuzz case {index}: {MAX_DRAWS} draws in a row where no row sees two keys")


def _draw(draw: random.Random, index: int) -> tuple[Case, str, TritonFlashKernel]:
    dtype = FUZZ_DTYPES[index % len(FUZZ_DTYPES)]
    alignment = draw.choice(("none", "top_left", "bottom_right"))
    mask = "none" if alignment == "bottom_right" else draw.choice(("none", "bool", "float"))  # a CausalBias is the mask
    kv_heads = draw.choice((1, 2))
    case = Case(
        lead=draw.choice(((), (1,), (2,), (2, 1))),
        kv_heads=kv_heads,
        gqa_ratio=draw.choice((1, 2, 3) if kv_heads == 1 else (1, 2)),
        q_len=draw.randint(1, 20),
        kv_len=draw.randint(1, 36),
        head_dim=draw.choice(FUZZ_HEAD_DIMS),
        value_dim=draw.choice((None, None, 16, 48, 100)),
        dtype=dtype,
        causal=alignment == "top_left",
        mask=mask,
        mask_dims=tuple(draw.random() < 0.5 for _ in range(4)),
        mask_rank=draw.choice((2, 3, 4)),
        fully_masked_rows=draw.random() < 0.4,
        strided=draw.random() < 0.4,
        scale=draw.choice((None, None, 0.05, 0.3)),
        magnitude=LARGE_MAGNITUDE if dtype != "float32" and draw.random() < 0.25 else 1.0,
        seed=index,
    )
    return case, alignment, TritonFlashKernel(*draw.choice(FUZZ_CONFIGS))


def runnable(kernel: TritonFlashKernel, problem: Problem) -> TritonFlashKernel:
    """`kernel`, or `SMALL_CONFIG` where this GPU's shared memory refuses `kernel` (fp32 with a
    mask at the largest blocks on an H100); any other reason fails the test."""
    why = kernel.reasons(problem)
    if why and ON_GPU and all("shared memory" in reason for reason in why):
        kernel = TritonFlashKernel(*SMALL_CONFIG)
        why = kernel.reasons(problem)
    assert not why, why
    return kernel


def gradients_vanish(case: Case, alignment: str) -> bool:
    """Whether no row sees two keys. Then dQ and dK are zero in exact arithmetic (a softmax over
    one key is constant), and the relative error of any rounding against that zero means nothing."""
    inputs = reference_inputs(case.build(), alignment)
    mask = inputs["attn_mask"]
    visible = torch.ones(case.q_len, case.kv_len, dtype=torch.bool)
    if case.causal:
        visible = visible.tril()
    if mask is not None:
        visible = visible & (mask if mask.dtype == torch.bool else mask > float("-inf"))
    return bool((visible.sum(dim=-1) < 2).all())


def reference_inputs(inputs: dict, alignment: str) -> dict:
    """The float64 reference's arguments for `inputs`: a bottom-right `CausalBias` as the bool
    mask it stands for (query i sees keys up to i + S - L)."""
    if alignment != "bottom_right":
        return inputs
    q_len, kv_len = inputs["query"].shape[-2], inputs["key"].shape[-2]
    rows = torch.arange(q_len, device=inputs["query"].device)[:, None]
    cols = torch.arange(kv_len, device=inputs["query"].device)[None, :]
    return {**inputs, "attn_mask": cols <= rows + kv_len - q_len}


def reference_logsumexp(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """Each row's logsumexp of its masked, scaled scores in float64 (`reference_attention`'s scores); 0 for a row
    that sees no key."""
    q, k = query.double(), key.double()
    if enable_gqa:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril(), float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask.double()
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    return scores.masked_fill(dead, 0.0).logsumexp(dim=-1).masked_fill(dead[..., 0], 0.0)


def stored_output_gradients(inputs: dict, grad_out: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(output, dQ, dK, dV) in float64 as FlashAttention-2 defines them: ``delta = rowsum(dO * O)`` read from the
    output as stored, in `dtype`. That rounding moves dQ and dK by ``-delta_error * dlse/dq`` (the gradient of
    ``-sum(delta_error * logsumexp)``); where the softmax is nearly one-hot they are small and the move is
    large beside them (fp16, 4 rows over 22 keys: 4.1e-2 relative L2), whatever the kernel."""
    leaves = [inputs[name].detach().double().requires_grad_(True) for name in ("query", "key", "value")]
    rest = {name: value for name, value in inputs.items() if name not in ("query", "key", "value")}
    out = reference_attention(*leaves, **rest)
    grad64 = grad_out.double()
    delta_error = (grad64 * (out.detach().to(dtype).double() - out.detach())).sum(dim=-1)
    loss = (out * grad64).sum() - (delta_error * reference_logsumexp(*leaves, **rest)).sum()
    return (out, *torch.autograd.grad(loss, leaves))


def dead_rows(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Rows of a bool mask (broadcast shape) with every key blocked, or None without a mask."""
    if mask is None:
        return None
    return (~mask if mask.dtype == torch.bool else mask == float("-inf")).all(dim=-1)


@needs_triton
@pytest.mark.parametrize("index", range(FUZZ_CASES))
def test_fuzz_forward_and_gradients_match_float64(index):
    case, alignment, kernel = fuzz_case(index)
    inputs = case.build(TEST_DEVICE)
    if alignment == "bottom_right":
        inputs["attn_mask"] = causal_lower_right(case.q_len, case.kv_len)
    problem = problem_of(inputs)
    assert problem.causal_alignment == ("bottom_right" if alignment == "bottom_right" and case.q_len != case.kv_len
                                        else "top_left")
    kernel = runnable(kernel, problem)
    expected_inputs = reference_inputs(inputs, alignment)
    reference = reference_attention(**expected_inputs)
    grad_out = torch.randn(reference.shape, generator=torch.Generator().manual_seed(index)).to(reference.device)
    ours = gradients(kernel, inputs, grad_out)
    expected = stored_output_gradients(expected_inputs, grad_out, inputs["query"].dtype)
    forward = kernel.tolerance(problem)
    tolerances = (forward,) + (Tolerance(forward.relative_l2 * GRADIENT_TOLERANCE_FACTOR,
                                         forward.relative_max * GRADIENT_TOLERANCE_FACTOR),) * 3
    # Inputs of magnitude 64 make the softmax one-hot: dQ and dK vanish (e**-1000) and only the
    # forward is compared (the large-score case of the forward is what such inputs test).
    compared = 1 if case.magnitude > 1 else 4
    for label, got, want, tolerance in list(zip(("out", "d_query", "d_key", "d_value"), ours, expected, tolerances,
                                                strict=True))[:compared]:
        assert got.shape == want.shape and got.dtype == inputs["query"].dtype, label
        rel_l2, rel_max = relative_errors(got, want)
        assert tolerance.accepts(rel_l2, rel_max), f"{kernel.name} {case} {alignment} {label}: {rel_l2:.2e} (max {rel_max:.2e})"
    blocked = dead_rows(expected_inputs["attn_mask"])
    if blocked is not None and blocked.any():  # SDPA's zeros, and no gradient through those rows
        rows = blocked.expand(ours[0].shape[:-1])
        assert torch.count_nonzero(ours[0][rows]) == 0 and torch.count_nonzero(ours[1][rows]) == 0


def test_the_fuzz_covers_every_axis():
    drawn = [fuzz_case(index) for index in range(FUZZ_CASES)]
    cases = [case for case, _, _ in drawn]
    assert {alignment for _, alignment, _ in drawn} == {"none", "top_left", "bottom_right"}
    assert any(a == "bottom_right" and c.q_len > c.kv_len for c, a, _ in drawn)  # rows that see no key
    assert {c.mask for c in cases} == {"none", "bool", "float"}
    assert {c.head_dim for c in cases} == set(FUZZ_HEAD_DIMS)
    assert {c.dtype for c in cases} == set(FUZZ_DTYPES)
    assert any(c.gqa_ratio > 1 for c in cases) and any(c.strided for c in cases)
    assert any(c.value_dim not in (None, c.head_dim) for c in cases)
    assert any(c.fully_masked_rows and c.mask != "none" for c in cases)
    assert any(c.mask != "none" and not all(c.mask_dims) for c in cases)  # broadcast masks
    assert {kernel.name for _, _, kernel in drawn} == {TritonFlashKernel(*config).name for config in FUZZ_CONFIGS}
    assert sum(c.magnitude == 1.0 for c in cases) >= FUZZ_GRADIENT_CASES


# ---------------------------------------------------------------- names and reasons
def test_names_round_trip_and_bad_parameters_name_themselves():
    kernel = kernel_from_name("triton_flash[bm=64,bn=32,w=4,s=2]")
    assert kernel == TritonFlashKernel(bm=64, bn=32, w=4, s=2) and kernel.supports_backward
    for bad, word in (("bm=48", "bm"), ("bn=8", "bn"), ("w=3", "w (warps)"), ("s=0", "s (pipeline stages)")):
        with pytest.raises(ValueError, match=re.escape(word)):
            kernel_from_name(f"triton_flash[{bad}]")


def test_head_dims_past_256_are_a_reason():
    problem = Problem(1, 2, 2, 8, 8, 320, 64, "float32", device_type=TEST_DEVICE)
    assert any("head dims up to 256" in reason for reason in TritonFlashKernel().reasons(problem))


def test_configs_past_the_cards_shared_memory_are_a_reason(monkeypatch):
    """A gfx906 card's 64 KiB: the large default at head dim 256 is refused, a small one runs."""
    fake_gpu(monkeypatch, "gfx906", (9, 0), (3, 8), hip=True)
    monkeypatch.setattr("attn_dispatch.kernels.triton_flash.shared_memory_limit", lambda: 64 * 1024)
    problem = Problem(1, 8, 8, 4096, 4096, 256, 256, "float16", device_type="cuda")
    [reason] = TritonFlashKernel(bm=128, bn=64, w=8, s=3).reasons(problem)
    assert "shared memory" in reason and "64 KiB" in reason
    assert TritonFlashKernel(bm=32, bn=16, w=4, s=2).reasons(problem) == []


# (config, head dim, value dim, itemsize, mask kind, bytes Triton 3.6 allocated on an H100)
TRITON_36_SM90_FORWARDS = [((128, 64, 8, 3), 128, 16, 4, "float", 237568), ((128, 64, 8, 3), 128, 128, 4, "float", 295424),
                           ((128, 64, 8, 3), 128, 128, 4, "bool", 233472), ((128, 64, 8, 3), 112, 64, 4, "float", 262144)]


@pytest.mark.parametrize(("config", "head_dim", "value_dim", "itemsize", "mask_kind", "allocated"), TRITON_36_SM90_FORWARDS)
def test_the_estimate_covers_what_triton_allocated(config, head_dim, value_dim, itemsize, mask_kind, allocated):
    """Launches that failed for want of shared memory on an H100 (GPU suite, Triton 3.6): the estimate
    is at least what Triton asked for, so the kernel refuses them as a reason."""
    mask = flash_config.mask_element_bytes(mask_kind, itemsize)
    estimate = flash_config.forward_shared_bytes(flash_config.FlashConfig(*config), head_dim, value_dim, itemsize, mask)
    assert allocated <= estimate <= 1.25 * allocated


def test_backward_blocks_shrink_to_the_card():
    config = flash_config.FlashConfig(128, 64, 8, 3)
    unlimited = flash_config.backward_blocks(config, 128, 128, 2, None)
    assert unlimited == flash_config.BackwardBlocks(128, 32, 3)
    for limit, head_dim, itemsize in ((227 * 1024, 256, 4), (64 * 1024, 256, 2), (64 * 1024, 128, 4), (48 * 1024, 256, 2)):
        for mask in (0, 2, itemsize):
            blocks = flash_config.backward_blocks(config, head_dim, head_dim, itemsize, limit, mask)
            assert flash_config.backward_shared_bytes(blocks, head_dim, head_dim, itemsize, mask) <= limit
            assert min(blocks.resident, blocks.streamed) >= flash_config.MIN_BLOCK and blocks.stages >= 1


@needs_triton
def test_a_mask_requiring_grad_is_refused():
    inputs = Case(mask="float").build(TEST_DEVICE)
    mask = inputs.pop("attn_mask").requires_grad_(True)
    with pytest.raises(RuntimeError, match="attn_mask requires grad"):
        TritonFlashKernel()(inputs.pop("query").requires_grad_(True), inputs.pop("key"), inputs.pop("value"),
                            attn_mask=mask, **inputs)


@needs_triton
def test_key_and_value_head_counts_that_differ():
    """GQA where key and value have different head counts (canonicalisation repeats them)."""
    generator = torch.Generator().manual_seed(5)
    query = torch.randn(1, 4, 9, 16, generator=generator).to(TEST_DEVICE)
    key = torch.randn(1, 2, 11, 16, generator=generator).to(TEST_DEVICE)
    value = torch.randn(1, 1, 11, 24, generator=generator).to(TEST_DEVICE)
    out = TritonFlashKernel(bm=16, bn=16, w=4, s=1)(query, key, value, enable_gqa=True)
    rel_l2, rel_max = relative_errors(out, reference_attention(query, key, value, enable_gqa=True))
    assert rel_l2 < 2e-5 and rel_max < 1e-4


# ---------------------------------------------------------------- memory
@needs_triton
def test_strided_inputs_are_read_in_place():
    """A ``[B, L, H, D]`` layout viewed as ``[B, H, L, D]`` (transformers') is read through its
    strides: the call allocates its output (and a 4-byte placeholder for the log-sum-exp) only."""
    inputs = Case(lead=(2,), strided=True, gqa_ratio=2, q_len=20, kv_len=30).build(TEST_DEVICE)
    problem = problem_of(inputs)
    assert problem.strided
    kernel = TritonFlashKernel(bm=16, bn=16, w=4, s=1)
    with torch.inference_mode():
        kernel(**inputs)
        peak, _ = measure_peak_bytes(lambda: kernel(**inputs), inputs["query"].device)
    assert problem.out_bytes <= peak <= problem.out_bytes + 512  # 512: the CUDA allocator's rounding


@needs_triton
@pytest.mark.parametrize("case", [
    Case(q_len=40, kv_len=56, causal=True, gqa_ratio=2),
    Case(lead=(2,), mask="bool", mask_dims=(True, False, True, True), strided=True, q_len=24, kv_len=33),
    Case(dtype="float16", mask="float", q_len=17, kv_len=29),
], ids=["causal_gqa", "masked_strided", "float_mask_fp16"])
def test_forward_and_backward_stay_within_backward_workspace_bytes(case):
    inputs = case.build(TEST_DEVICE)
    problem = problem_of(inputs)
    kernel = TritonFlashKernel(bm=16, bn=16, w=4, s=1)
    leaves = [inputs.pop(name).requires_grad_(True) for name in ("query", "key", "value")]
    grad_out = torch.randn(reference_attention(*leaves, **inputs).shape).to(leaves[0].device)

    def train_step():
        return torch.autograd.grad(kernel(*leaves, **inputs), leaves, grad_out)

    train_step()  # warm-up
    device = leaves[0].device
    allocated_before = bytes_allocated_so_far(device)
    peak, grads = measure_peak_bytes(train_step, device)
    assert len(grads) == 3
    assert peak <= kernel.backward_workspace_bytes(problem) + 16 * 512
    # the gradients were allocated: on CUDA read from the allocator's running total (`bytes_allocated_so_far`)
    allocated = peak if allocated_before is None else bytes_allocated_so_far(device) - allocated_before
    assert allocated >= problem.q_bytes + problem.kv_bytes


# ---------------------------------------------------------------- where it runs
def test_dispatch_sets_leave_out_interpreted_kernels():
    """Under the interpreter the Triton kernels are right but never fast: the sets a dispatcher
    chooses from and calibration times leave them out; `portable_kernels` (what a gfx906 owner
    has) lists them, and their reasons say where they cannot run."""
    from attn_dispatch.calibration.candidates import kernel_set as calibration_set
    from attn_dispatch.dispatcher.core import kernel_set
    from attn_dispatch.kernels.accuracy import LOSSLESS

    assert any(k.family == "triton_flash" for k in portable_kernels())
    if not base.interpreting():
        pytest.skip("Triton's interpreter is off here: nothing to leave out")
    assert all(interpreted(k) for k in portable_kernels() if k.family == "triton_flash")
    for name in ("all", "portable"):
        assert not any("triton" in kernel for kernel in kernel_set(name, LOSSLESS))
        assert not any(k.family == "triton_flash" for k in calibration_set(name, policy=LOSSLESS))
    assert "triton_flash[bm=16,bn=16,w=4,s=1]" in kernel_set(["triton_flash[bm=16,bn=16,w=4,s=1]"], LOSSLESS)


def test_importing_the_kernels_does_not_import_triton():
    """The first-call budget: `attn_dispatch.kernels` (names, reasons, workspace) without Triton;
    Triton is imported by the first run."""
    code = ("import os, sys; os.environ['TRITON_INTERPRET'] = '1'\n"
            "from attn_dispatch.kernels import Problem, all_kernels\n"
            "kernels = [k for k in all_kernels() if k.family == 'triton_flash']\n"
            "problem = Problem(1, 2, 2, 8, 8, 16, 16, 'float32')\n"
            "assert kernels and not any(k.reasons(problem) for k in kernels)\n"
            "[k.workspace_bytes(problem) for k in kernels]\n"
            "print('triton' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"


@needs_triton
def test_a_launch_failure_falls_back_in_the_dispatcher(monkeypatch):
    """A configuration Triton cannot build for the card raises at its first launch (here: out of
    shared memory); the dispatcher runs the next kernel and remembers the failure for the bucket."""
    from triton.runtime.errors import OutOfResources

    from attn_dispatch.dispatcher import Dispatcher
    from attn_dispatch.kernels import _triton_flash_ops
    from tests.dispatcher.helpers import FixedRanker, assert_matches_reference, qkv, use_ranking

    def refuse(*args, **kwargs):
        raise OutOfResources(262144, 232448, "shared memory")

    monkeypatch.setattr(_triton_flash_ops, "launch_forward", refuse)
    monkeypatch.setattr("attn_dispatch.kernels.triton_flash.compile_seconds", lambda kernel, problem: 0.0)  # no compile wait
    kernel = TritonFlashKernel()
    use_ranking(monkeypatch, FixedRanker([kernel.name, "math"]))
    ours = Dispatcher(kernels=[kernel, MathKernel()])
    inputs = {name: (tensor.to(TEST_DEVICE) if isinstance(tensor, torch.Tensor) else tensor)
              for name, tensor in qkv().items()}
    assert ours.explain(**inputs).kernel == kernel.name
    assert_matches_reference(ours.attention(**inputs), inputs)
    decision = ours.explain(**inputs)
    assert decision.kernel == "math" and "shared memory" in decision.reason_dropped(kernel.name)


# ---------------------------------------------------------------- on the GPU
GPU_SHAPES = {
    "prefill_causal_gqa": dict(lead=(2,), kv_heads=2, gqa_ratio=4, q_len=1000, kv_len=1000, head_dim=128, causal=True),
    "dit_head_dim_64": dict(lead=(1,), kv_heads=6, q_len=1536, kv_len=1536, head_dim=64),
    "odd_head_dim_masked": dict(lead=(2,), kv_heads=3, q_len=333, kv_len=517, head_dim=80, mask="bool",
                                mask_dims=(True, False, True, True), fully_masked_rows=True),
    "float_mask_value_dim": dict(lead=(1,), kv_heads=4, q_len=257, kv_len=700, head_dim=112, value_dim=64,
                                 mask="float", strided=True),
}


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("name", list(GPU_SHAPES))
def test_gpu_shapes_forward_and_gradients(name, dtype):
    case = Case(**GPU_SHAPES[name], dtype=dtype, seed=7)
    inputs = case.build(TEST_DEVICE)
    problem = problem_of(inputs)
    kernels = {kernel.name: kernel for kernel in (runnable(TritonFlashKernel(), problem), TritonFlashKernel(*SMALL_CONFIG))}
    for kernel in kernels.values():
        assert not kernel.reasons(problem), kernel.reasons(problem)
        reference = reference_attention(**inputs)
        grad_out = torch.randn_like(reference)
        ours = gradients(kernel, inputs, grad_out)
        expected = gradients(reference_attention, inputs, grad_out, dtype=torch.float64)
        forward = kernel.tolerance(problem)
        for label, got, want in zip(("out", "d_query", "d_key", "d_value"), ours, expected, strict=True):
            tolerance = forward if label == "out" else Tolerance(forward.relative_l2 * GRADIENT_TOLERANCE_FACTOR,
                                                                 forward.relative_max * GRADIENT_TOLERANCE_FACTOR)
            rel_l2, rel_max = relative_errors(got, want)
            assert tolerance.accepts(rel_l2, rel_max), f"{kernel.name} {name} {label}: {rel_l2:.2e} ({rel_max:.2e})"


@needs_gpu
def test_gpu_offsets_past_two_to_the_31():
    """Tensors of more than 2**31 elements: batch and head offsets are int64 (the last batch is
    checked against the reference)."""
    batch, heads, length, dim = 16400, 8, 128, 128  # 2.15e9 elements per tensor, 4.3 GB in fp16
    generator = torch.Generator(device=TEST_DEVICE).manual_seed(0)
    query, key, value = (torch.randn(batch, heads, length, dim, device=TEST_DEVICE, dtype=torch.float16,
                                     generator=generator) for _ in range(3))
    out = TritonFlashKernel()(query, key, value, is_causal=True)
    for index in (0, batch - 1):
        expected = reference_attention(query[index], key[index], value[index], is_causal=True)
        rel_l2, _ = relative_errors(out[index], expected)
        assert rel_l2 < 5e-3, (index, rel_l2)


@needs_gpu
def test_gpu_operators_compile_with_no_graph_break():
    """`torch.compile(fullgraph=True)` traces the kernel's custom operators, forward and backward
    (Inductor sees the Triton kernels: `torch.library.triton_op`)."""
    from attn_dispatch.kernels._triton_flash_ops import flash_attention

    config = TritonFlashKernel().config
    leaves = [torch.randn(2, 4, 300, 64, device=TEST_DEVICE, dtype=torch.float16, requires_grad=True)
              for _ in range(3)]

    def attend(query, key, value):
        return flash_attention(query, key, value, None, 0.125, True, 0, config, True)

    out = torch.compile(attend, fullgraph=True)(*leaves)
    grads = torch.autograd.grad(out.float().square().sum(), leaves)
    eager = attend(*leaves)
    eager_grads = torch.autograd.grad(eager.float().square().sum(), leaves)
    torch.testing.assert_close(out, eager)
    for got, want in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


@needs_gpu
def test_gpu_dispatcher_traces_the_kernel_under_compile(monkeypatch):
    """A dispatcher that ranks `triton_flash` first, called inside `torch.compile(fullgraph=True)`."""
    from attn_dispatch.dispatcher import Dispatcher
    from tests.dispatcher.helpers import FixedRanker, use_ranking

    kernel = TritonFlashKernel()
    use_ranking(monkeypatch, FixedRanker([kernel.name]))
    ours = Dispatcher(kernels=[kernel])
    query, key, value = (torch.randn(1, 8, 512, 128, device=TEST_DEVICE, dtype=torch.bfloat16) for _ in range(3))
    out = torch.compile(lambda q, k, v: ours.attention(q, k, v, is_causal=True), fullgraph=True)(query, key, value)
    torch.testing.assert_close(out, kernel(query, key, value, is_causal=True))
    assert any(name.startswith("triton_flash") for name in ours.stats())


@needs_gpu
def test_gpu_cuda_graph_capture_and_replay():
    """Captured once, replayed on new inputs: the launch path has no host synchronisation."""
    kernel = TritonFlashKernel()
    shape = (2, 8, 512, 128)
    static = [torch.randn(shape, device=TEST_DEVICE, dtype=torch.bfloat16) for _ in range(3)]
    kernel(*static, is_causal=True)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernel(*static, is_causal=True)
    for seed in (1, 2):
        generator = torch.Generator(device=TEST_DEVICE).manual_seed(seed)
        for tensor in static:
            tensor.copy_(torch.randn(shape, device=TEST_DEVICE, dtype=torch.bfloat16, generator=generator))
        graph.replay()
        torch.testing.assert_close(captured, kernel(*static, is_causal=True))
