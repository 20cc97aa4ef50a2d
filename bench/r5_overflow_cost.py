"""What fp32 scores (issue 13, R5) cost `math`, `chunked` and `small_q` on fp16 decode and prefill.

    python -m bench.r5_overflow_cost --device cuda:0 --out r5_overflow_cost.json
    python -m bench.r5_overflow_cost --device cpu --small

Before the fix the portable kernels multiplied fp16 Q and K into fp16 scores, which overflow past
65504 (NaN output; PyTorch's regression test for its issue #160841). Now half inputs are
multiplied into fp32 scores (`aten::bmm.dtype` on CUDA, the scale applied to the fp32 scores
unless it is a power of two; an fp32 upcast elsewhere) and the probabilities are cast back for
the value product. `old_score_path()` puts the old fp16-score
path back for the duration of a `with` block (this script only), so both are timed in one
process, alternating old and new rounds so drift hits both alike.

Each number is the median of the per-round medians (`calibration.timer.time_repetitions`);
`cost` is new / old - 1. The target (issue 13) is at most 3% on fp16 decode and prefill (H200).
"""

from __future__ import annotations

import argparse
import json
import statistics
from contextlib import contextmanager
from unittest import mock

import torch

from attn_dispatch.calibration.timer import time_repetitions
from attn_dispatch.kernels import _blocks, _single_pass, chunked, math_kernel, small_q
from attn_dispatch.kernels.registry import kernel_from_name

ROUNDS = 3
"""Alternating old/new rounds per (shape, kernel)."""

# (name, batch, q_heads, kv_heads, q_len, kv_len, head_dim, causal): the H200 decode shape of
# bench/small_q_variants.py and a causal prefill at two lengths.
SHAPES = [
    ("decode_gqa4_32k", 1, 32, 8, 1, 32768, 128, False),
    ("decode_gqa4_4k", 1, 32, 8, 1, 4096, 128, False),
    ("decode4_gqa4_32k", 1, 32, 8, 4, 32768, 128, False),
    ("prefill_2k_causal", 1, 16, 16, 2048, 2048, 128, True),
    ("prefill_8k_causal", 1, 16, 16, 8192, 8192, 128, True),
]
SMALL_SHAPES = [  # --small: the same kinds, sized for a CPU
    ("decode_gqa4_4k", 1, 32, 8, 1, 4096, 128, False),
    ("decode4_gqa4_4k", 1, 32, 8, 4, 4096, 128, False),
    ("prefill_512_causal", 1, 8, 8, 512, 512, 64, True),
    ("prefill_1k", 1, 8, 8, 1024, 1024, 64, False),
]
KERNELS = {
    "decode": ["small_q[splits=8]", "small_q[splits=32]", "chunked[q=512,kv=65536]", "math"],
    "prefill": ["chunked[q=512,kv=65536]", "chunked[q=512,kv=4096]", "chunked[q=256,kv=1024]", "math"],
}


def _old_recipe(dtype, device, scale):
    return _blocks.ScoreRecipe(dtype, scale, 1.0)


def _old_block_scores(rows, key_block, score_scale=1.0):
    return torch.matmul(rows, key_block.transpose(-1, -2)).to(_blocks.accumulation_dtype(rows.dtype))


def _old_row_major_scores(rows, key, score_scale=1.0):
    R, S = rows.shape[-2], key.shape[-2]
    heads = rows.shape[0] * rows.shape[1]
    buffer = torch.empty(R, heads, S, dtype=rows.dtype, device=rows.device)
    scores = buffer.transpose(0, 1)
    torch.bmm(rows.reshape(-1, *rows.shape[-2:]), key.reshape(-1, *key.shape[-2:]).transpose(1, 2), out=scores)
    return scores


@contextmanager
def old_score_path():
    """The pre-fix path: fp16 operands into fp16 scores (softmax then stays in fp16 too)."""
    patches = [
        mock.patch.object(module, "score_recipe", _old_recipe) for module in (chunked, math_kernel, small_q)
    ] + [
        mock.patch.object(module, "block_scores", _old_block_scores) for module in (chunked, math_kernel)
    ] + [mock.patch.object(_single_pass, "row_major_scores", _old_row_major_scores)]
    for patch in patches:
        patch.start()
    try:
        yield
    finally:
        for patch in reversed(patches):
            patch.stop()


def _inputs(shape, device):
    _, batch, hq, hkv, lq, lk, dim, causal = shape
    generator = torch.Generator(device="cpu").manual_seed(0)
    make = lambda h, n: torch.randn(batch, h, n, dim, generator=generator).to(device, torch.float16)  # noqa: E731
    return make(hq, lq), make(hkv, lk), make(hkv, lk), causal


def bench(device: torch.device, shapes) -> list[dict]:
    rows = []
    for shape in shapes:
        q, k, v, causal = _inputs(shape, device)
        kind = "decode" if shape[4] <= 64 else "prefill"
        for name in KERNELS[kind]:
            kernel = kernel_from_name(name)
            gqa = q.shape[1] != k.shape[1]
            call = lambda i: kernel(q, k, v, is_causal=causal, enable_gqa=gqa)  # noqa: E731
            times = {"old": [], "new": []}
            try:
                with torch.inference_mode():
                    for _ in range(ROUNDS):
                        with old_score_path():
                            times["old"].append(time_repetitions(call, device).median_s)
                        times["new"].append(time_repetitions(call, device).median_s)
            except RuntimeError as error:  # out of memory (math on long prefill), unsupported
                rows.append({"shape": shape[0], "kernel": name, "error": str(error).splitlines()[0][:200]})
                print(f"{shape[0]:20s} {name:26s} failed: {str(error).splitlines()[0][:80]}")
                continue
            old, new = statistics.median(times["old"]), statistics.median(times["new"])
            rows.append({"shape": shape[0], "kernel": name, "old_ms": old * 1e3, "new_ms": new * 1e3, "cost": new / old - 1})
            print(f"{shape[0]:20s} {name:26s} old {old * 1e3:9.3f} ms  new {new * 1e3:9.3f} ms  cost {new / old - 1:+6.1%}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="CPU-sized shapes")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = bench(device, SMALL_SHAPES if args.small else SHAPES)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"device": str(device), "torch": torch.__version__, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
