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


def arguments(doc: str) -> argparse.Namespace:
    """``--rounds`` and ``--calls`` (one CPU thread set as well: these are single-call timings)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--calls", type=int, default=10000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}, min of {args.rounds} x {args.calls} calls")
    return args


def fastest_us(calls: dict, rounds: int, number: int) -> dict[str, float]:
    """label -> the fastest round's us per call, rounds interleaved so drift hits every call alike."""
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for label, call in calls.items():
            best[label] = min(best[label], timeit.timeit(call, number=number))
    return {label: seconds / number * 1e6 for label, seconds in best.items()}


def added_cost(query, key, value, mask, enable_gqa, rounds: int, number: int) -> dict[str, float]:
    """us per call of PyTorch's SDPA (``"sdpa"``), and of the dispatcher's two entries over it."""
    sdpa = torch._C._nn.scaled_dot_product_attention
    ours = Dispatcher(kernels=["sdpa_default"])
    with torch.inference_mode(), patched(ours):
        ours.attention(query, key, value, mask, enable_gqa=enable_gqa)
        best = fastest_us({
            "sdpa": lambda: sdpa(query, key, value, mask, enable_gqa=enable_gqa),
            "attention": lambda: ours.attention(query, key, value, mask, enable_gqa=enable_gqa),
            "patched F.sdpa": lambda: F.scaled_dot_product_attention(query, key, value, mask, enable_gqa=enable_gqa),
        }, rounds, number)
    return {label: us if label == "sdpa" else us - best["sdpa"] for label, us in best.items()}


def main() -> None:
    args = arguments(__doc__)
    for name, inputs in cases().items():
        cost = added_cost(*inputs, args.rounds, args.calls)
        extra = "  ".join(f"{label} {us:+.2f} us" for label, us in cost.items() if label != "sdpa")
        print(f"{name:22s} sdpa {cost['sdpa']:6.2f} us  {extra}")

if __name__ == "__main__":
    main()
