"""On a GPU: the fast path's operator and range entries give the Python path's exact results.

The CPU suite checks the C++ operator call with PyTorch's CPU flash operator only
(tests/dispatcher/test_fast_path_ranges.py); this runs the CUDA operators (flash, memory-efficient,
cuDNN) through the fast path on decode and prefill shapes, GQA native or folded, with and without a
scale: per case, whether the call was served in C++ (the hit counter moved) and whether its output
equals, bit for bit, what the plan's Python runner returns; and for decode, the key lengths of the
plan's bucket served from their first call (a range entry) with results equal to a fresh
dispatcher's Python path. Exits 1 on any mismatch where the Python path itself repeats bit for bit
(PyTorch's default on the H200 did not, at batch 8 head dim 64 bf16 decode with 600 keys: 4-8 of
10 identical direct calls equal to the first, within 6.1e-5; session 11, docs/RESULTS.md section 17).

Usage (repository root): python -m bench.diagnostics.fast_path_ops_check [--device cuda]
"""

from __future__ import annotations

import argparse
import sys

import torch

from attn_dispatch.dispatcher import Dispatcher, fast_path
from attn_dispatch.dispatcher.errors import NoKernelError

BACKENDS = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_default")
CASES = (  # name, batch, q heads, kv heads, q len, kv len, head dim, causal
    ("decode B1 32/8 D128", 1, 32, 8, 1, 1000, 128, False),
    ("decode B8 32/8 D64", 8, 32, 8, 1, 600, 64, False),
    ("Lq4 32/8 D128 (GQA folded)", 1, 32, 8, 4, 2000, 128, False),
    ("prefill causal 32/32 D128", 1, 32, 32, 512, 512, 128, True),
)
RANGE_LENGTHS = (513, 777, 1023, 1024)  # the bucket of 1000 (513..1024), decode cases only


def check_case(backend, case, dtype, device, scale) -> list[str]:
    name, batch, heads, kv_heads, q_len, kv_len, dim, causal = case
    generator = torch.Generator(device=device).manual_seed(0)
    cache = max(kv_len, max(RANGE_LENGTHS)) + 8  # slices, never the whole (contiguous) cache
    query = torch.randn(batch, heads, q_len, dim, device=device, dtype=dtype, generator=generator)
    cache_k = torch.randn(batch, kv_heads, cache, dim, device=device, dtype=dtype, generator=generator)
    cache_v = torch.randn(batch, kv_heads, cache, dim, device=device, dtype=dtype, generator=generator)
    gqa = heads != kv_heads
    kwargs = {"is_causal": causal, "enable_gqa": gqa, **({} if scale is None else {"scale": scale})}
    ours = Dispatcher(kernels=[backend])
    fast = ours.fast_attention
    key, value = cache_k[:, :, :kv_len], cache_v[:, :, :kv_len]
    try:
        for _ in range(2):
            fast(query, key, value, **kwargs)
    except NoKernelError:
        return [f"  {backend:15s} {str(dtype)[6:]:9s} {name:28s} scale={scale}: does not run it"]
    (plan,) = ours._plans.table.values()
    before = ours._fast.hits
    out = fast(query, key, value, **kwargs)
    served = ours._fast.hits == before + 1
    expected = plan.run(query, key, value, None, scale, gqa, plan.problem)
    equal = torch.equal(out, expected)
    repeatable = torch.equal(expected, plan.run(query, key, value, None, scale, gqa, plan.problem))
    lines = [f"  {backend:15s} {str(dtype)[6:]:9s} {name:28s} scale={scale}: served in C++ {served}, equal {equal}"
             f"{'' if repeatable else ' (the Python path itself differs from call to call)'}"
             f" (bare call {plan.kernel.bare_call(plan.problem)})"]
    if not equal and repeatable:
        lines.append("MISMATCH")
    if q_len == 1:
        hits, equal_all = ours._fast.hits, True
        for length in RANGE_LENGTHS:
            key, value = cache_k[:, :, :length], cache_v[:, :, :length]
            got = fast(query, key, value, **kwargs)
            reference = Dispatcher(kernels=[backend]).attention(query, key, value, **kwargs)
            equal_all &= torch.equal(got, reference)
        lines.append(f"      range {RANGE_LENGTHS}: {ours._fast.hits - hits} of {len(RANGE_LENGTHS)} served in C++,"
                     f" equal {equal_all}, plans made {len(ours._plans)}")
        if not equal_all and repeatable:
            lines.append("MISMATCH")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    if fast_path.load() is None:
        print(f"building the fast path ... {fast_path.build()}")
    print(f"fast path operator check on {torch.cuda.get_device_name(device) if device.type == 'cuda' else device},"
          f" torch {torch.__version__}")
    lines = []
    with torch.inference_mode():
        for backend in BACKENDS:
            for dtype in (torch.bfloat16, torch.float16):
                for case in CASES:
                    for scale in (None, 0.125):
                        lines += check_case(backend, case, dtype, device, scale)
    print("\n".join(line for line in lines if line != "MISMATCH"))
    mismatches = lines.count("MISMATCH")
    print(f"{mismatches} mismatches")
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
