"""The dispatcher's warm-path cost on tiny calls (a few us of PyTorch work, so little timing noise):
`Dispatcher.attention`, `F.scaled_dot_product_attention` under `patched()`, and PyTorch's SDPA
called directly, interleaved; min over rounds of the per-call time, and the added cost.

Usage (repository root): python -m bench.diagnostics.warm_path_tiny [--rounds 25] [--calls 10000]
"""

from __future__ import annotations

import argparse
import os
import timeit

import torch
import torch.nn.functional as F

from attn_dispatch.dispatcher import Dispatcher, patched


def cases() -> dict[str, tuple]:
    """name -> (query, key, value, mask, enable_gqa): tiny CPU calls of each warm-path kind."""
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 1, 4, 8)
    x = torch.randn(1, 2, 4, 8)
    strided = torch.randn(1, 4, 2, 8).transpose(1, 2)
    return {
        "decode gqa, no mask": (q, k, k.clone(), None, True),
        "prefill, no mask": (x, x.clone(), x.clone(), None, False),
        "prefill, bool mask": (x, x.clone(), x.clone(), torch.rand(4, 4) > 0.3, False),
        "strided, no mask": (strided, strided.clone(), strided.clone(), None, False),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--calls", type=int, default=10000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sdpa = torch._C._nn.scaled_dot_product_attention
    print(f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}, min of {args.rounds} x {args.calls} calls")
    for name, (q, k, v, mask, gqa) in cases().items():
        ours = Dispatcher(kernels=["sdpa_default"])
        with torch.inference_mode(), patched(ours):
            ours.attention(q, k, v, mask, enable_gqa=gqa)
            calls = {
                "sdpa": lambda: sdpa(q, k, v, mask, enable_gqa=gqa),
                "attention": lambda: ours.attention(q, k, v, mask, enable_gqa=gqa),
                "patched F.sdpa": lambda: F.scaled_dot_product_attention(q, k, v, mask, enable_gqa=gqa),
            }
            best = dict.fromkeys(calls, float("inf"))
            for _ in range(args.rounds):  # interleaved: drift hits every call alike
                for label, call in calls.items():
                    best[label] = min(best[label], timeit.timeit(call, number=args.calls))
        base = best["sdpa"] / args.calls * 1e6
        extra = "  ".join(f"{label} {best[label] / args.calls * 1e6 - base:+.2f} us" for label in calls if label != "sdpa")
        print(f"{name:22s} sdpa {base:6.2f} us  {extra}")


if __name__ == "__main__":
    main()
