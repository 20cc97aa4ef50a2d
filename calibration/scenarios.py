"""The shapes of `attn-dispatch bench`: four scenarios measured separately, because a win on one
says nothing about the others.

- ``prefill``: first-batch prefill of an LLM, self-attention ``Lq = Lk``, causal (SDPA's
  ``is_causal``, which is exact here since the lengths are equal).
- ``fill``: long-context fill (chunked prefill): a chunk of ``Lq`` new tokens against a KV cache
  of ``Lk >> Lq``. SDPA's ``is_causal`` is aligned top-left, which is wrong for ``Lq < Lk``;
  transformers passes an explicit ``[B, 1, Lq, Lk]`` bool mask there, and so do we. Its
  content is random (`calibration.inputs.MASK_KEEP_PROBABILITY`), not the bottom-right causal
  pattern: none of our kernels, nor PyTorch's masked backends, skips blocks by mask content, so
  the cost is the same.
- ``decode``: deep-context generation: ``Lq = 1`` (one token) and ``Lq = 4..16`` (speculative
  decoding) against ``Lk`` 4k-128k, non-causal, no mask.
- ``video``: video diffusion: one long non-causal self-attention, 16-24 heads of 64, 8k-128k
  tokens.
- ``heldout``: shapes a calibration never measures, to test how the table generalises: lengths
  that are not powers of two, GQA ratios outside the sweep's 1/2/4/8 (5, 7), batches of 2-8,
  head dims 64-128, all three dtypes (fp32 among them, where a lossy conversion may pay), every
  mask kind. Not part of ``all``; ``tests/calibration/test_scenarios.py`` checks that none of
  them is in the calibration sweep.

LLM shapes follow Llama-3-8B-like attention (32 query heads, 8 KV heads, head dim 128);
video shapes CogVideoX / HunyuanVideo-like attention (head dim 64, 16-24 heads). ``full`` sizes
are GPU-sized; ``small`` keeps the structure at sizes a 2-core CPU runs in seconds.
"""

from __future__ import annotations

import torch

from attn_dispatch.calibration.kernel_bench import NamedShape, on_device
from attn_dispatch.kernels.problem import Problem

SCENARIOS = ("prefill", "fill", "decode", "video")
EXTRA_SCENARIOS = ("heldout",)
SIZES = ("small", "full")

# Llama-3-8B attention: 32 query heads, 8 KV heads, head dim 128 (its config.json).
LLM_Q_HEADS, LLM_KV_HEADS, LLM_HEAD_DIM = 32, 8, 128
# Video DiT attention: head dim 64 (CogVideoX), 16-24 heads (CogVideoX-2B: 30; HunyuanVideo: 24
# of 128; we keep D=64 as the issue asks and vary the heads over 16-24).
VIDEO_HEAD_DIM = 64
# CPU-sized stand-ins: the same GQA ratio (4) and causality, a quarter of the heads, half the dim.
SMALL_Q_HEADS, SMALL_KV_HEADS, SMALL_HEAD_DIM = 8, 2, 64
SMALL_VIDEO_HEADS = 4


# A benchmarked call: `suite` is its scenario, `label` reads "decode B1 H32/8 L1 S4096 D128 float16".
Shape = NamedShape


def _llm(scenario: str, q_len: int, kv_len: int, dtype: str, *, small: bool, causal: bool = False,
         mask: bool = False) -> Shape:
    heads, kv_heads, dim = (SMALL_Q_HEADS, SMALL_KV_HEADS, SMALL_HEAD_DIM) if small else (
        LLM_Q_HEADS, LLM_KV_HEADS, LLM_HEAD_DIM)
    mask_kind, mask_shape = ("bool", (1, 1, q_len, kv_len)) if mask else ("none", ())
    return Shape(scenario, Problem(1, heads, kv_heads, q_len, kv_len, dim, dim, dtype, causal, mask_kind, mask_shape))


def _video(length: int, heads: int, dtype: str) -> Shape:
    return Shape("video", Problem(1, heads, heads, length, length, VIDEO_HEAD_DIM, VIDEO_HEAD_DIM, dtype))


def _heldout(batch: int, heads: int, kv_heads: int, q_len: int, kv_len: int, dim: int, dtype: str,
             causal: bool = False, mask_kind: str = "none") -> Shape:
    mask_shape = (batch, 1, q_len, kv_len) if mask_kind != "none" else ()
    return Shape("heldout", Problem(batch, heads, kv_heads, q_len, kv_len, dim, dim, dtype, causal, mask_kind, mask_shape))


# Held-out GPU shapes: (batch, heads, kv heads, Lq, Lk, head dim, dtype, causal, mask kind). Lengths
# are off the powers of two; GQA 5 (40/8 heads) and 7 (28/4, Qwen2-7B-like) are outside the sweep.
FULL_HELDOUT = (
    (2, 16, 16, 3000, 3000, 96, "bfloat16", True, "none"),       # prefill, MHA, D=96
    (1, 40, 8, 6144, 6144, 128, "float16", True, "none"),        # prefill, GQA 5
    (4, 12, 12, 1536, 1536, 64, "float16", True, "none"),        # prefill, small model, batch 4
    (1, 32, 8, 2000, 2000, 128, "float32", True, "none"),        # prefill in fp32
    (4, 32, 4, 1, 20000, 128, "float16", False, "none"),         # decode, GQA 8, batch 4
    (8, 32, 32, 1, 8000, 128, "float16", False, "none"),         # decode, MHA, batch 8
    (2, 28, 4, 3, 50000, 128, "bfloat16", False, "none"),        # speculative decode, GQA 7
    (1, 64, 8, 8, 100000, 128, "float16", False, "none"),        # speculative decode, 64 heads
    (1, 32, 8, 1, 60000, 128, "float32", False, "none"),         # decode in fp32
    (1, 32, 8, 1000, 24000, 128, "float16", False, "bool"),      # chunked prefill, bool mask
    (2, 16, 2, 300, 9000, 128, "bfloat16", False, "float"),      # chunked prefill, float mask, GQA 8
    (2, 24, 24, 12000, 12000, 64, "bfloat16", False, "none"),    # video, batch 2
    (1, 30, 30, 45000, 45000, 64, "bfloat16", False, "none"),    # video, CogVideoX-2B heads
    (1, 16, 16, 20000, 20000, 80, "float16", False, "none"),     # video, D=80
    (1, 24, 24, 10000, 10000, 64, "float32", False, "none"),     # video in fp32
)
# CPU stand-ins with the same variety, small enough for seconds per shape on 2 cores.
SMALL_HELDOUT = (
    (2, 6, 6, 300, 300, 96, "float32", True, "none"),
    (1, 10, 2, 600, 600, 64, "float32", True, "none"),
    (3, 8, 1, 1, 3000, 64, "float32", False, "none"),
    (2, 7, 1, 3, 5000, 64, "float32", False, "none"),
    (1, 8, 2, 100, 2400, 64, "float32", False, "bool"),
    (2, 4, 4, 700, 700, 80, "float32", False, "none"),
)


# GPU sizes. Prefill: 512-16k prompts in both half dtypes. Fill: chunks of 512-4096 against caches
# of 16k-128k. Decode: 1, 4 and 16 new tokens against 4k-128k. Video: 8k-128k tokens (a 5 s 720p
# clip in a CogVideoX-style latent is ~17k tokens; 128k is a long high-resolution clip).
FULL_PREFILL = (512, 1024, 2048, 4096, 8192, 16384)
FULL_FILL_CHUNKS, FULL_FILL_CACHES = (512, 2048, 4096), (16384, 65536, 131072)
FULL_DECODE_QUERIES, FULL_DECODE_CACHES = (1, 4, 16), (4096, 32768, 131072)
FULL_VIDEO = ((8192, 24), (16384, 24), (32768, 24), (65536, 16), (131072, 16))
# CPU sizes: the same grid shapes, small enough that every path of every shape runs in
# milliseconds on a 2-core CI machine.
SMALL_PREFILL = (128, 256, 512)
SMALL_FILL_CHUNKS, SMALL_FILL_CACHES = (32, 128), (1024, 2048)
SMALL_DECODE_QUERIES, SMALL_DECODE_CACHES = (1, 8), (1024, 4096)
SMALL_VIDEO = ((512, SMALL_VIDEO_HEADS), (1024, SMALL_VIDEO_HEADS))


def _full(scenario: str) -> list[Shape]:
    if scenario == "heldout":
        return [_heldout(*row) for row in FULL_HELDOUT]
    if scenario == "prefill":
        return [_llm("prefill", n, n, dtype, small=False, causal=True)
                for dtype in ("float16", "bfloat16") for n in FULL_PREFILL]
    if scenario == "fill":
        return [_llm("fill", q, k, "float16", small=False, mask=True) for k in FULL_FILL_CACHES for q in FULL_FILL_CHUNKS]
    if scenario == "decode":
        return [_llm("decode", q, k, "float16", small=False) for k in FULL_DECODE_CACHES for q in FULL_DECODE_QUERIES]
    return [_video(n, heads, "bfloat16") for n, heads in FULL_VIDEO]


def _small(scenario: str, dtype: str) -> list[Shape]:
    if scenario == "heldout":
        return [_heldout(*row[:6], dtype, *row[7:]) for row in SMALL_HELDOUT]
    if scenario == "prefill":
        return [_llm("prefill", n, n, dtype, small=True, causal=True) for n in SMALL_PREFILL]
    if scenario == "fill":
        return [_llm("fill", q, k, dtype, small=True, mask=True) for k in SMALL_FILL_CACHES for q in SMALL_FILL_CHUNKS]
    if scenario == "decode":
        return [_llm("decode", q, k, dtype, small=True) for k in SMALL_DECODE_CACHES for q in SMALL_DECODE_QUERIES]
    return [_video(n, heads, dtype) for n, heads in SMALL_VIDEO]


def scenario_shapes(scenarios: str | tuple[str, ...], *, size: str, device_type: str,
                    small_dtype: str = "float32") -> list[Shape]:
    """The shapes of `scenarios` (a name, ``"all"`` or a tuple of names) at `size`.

    Parameters
    ----------
    size: ``"full"`` (GPU sizes; LLM shapes in fp16/bf16, video in bf16) or ``"small"`` (CPU sizes,
        every shape in `small_dtype`).
    device_type: the device the problems will run on (``"cpu"``, ``"cuda"``).
    """
    names = SCENARIOS if scenarios == "all" else (scenarios,) if isinstance(scenarios, str) else tuple(scenarios)
    unknown = [name for name in names if name not in SCENARIOS + EXTRA_SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}: choose among "
                         f"{', '.join(SCENARIOS + EXTRA_SCENARIOS)} or 'all'")
    if size not in SIZES:
        raise ValueError(f"size={size!r}: choose 'small' (CPU-sized) or 'full' (GPU-sized)")
    shapes = []
    for name in names:
        shapes += _full(name) if size == "full" else _small(name, small_dtype)
    return [on_device(shape, torch.device(device_type)) for shape in shapes]


def default_size(device_type: str) -> str:
    """``full`` on a GPU, ``small`` on the CPU (full sizes would take hours there)."""
    return "small" if device_type == "cpu" else "full"
