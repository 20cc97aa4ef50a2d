"""The dispatcher's own cost in a repeated decode loop once every length runs PyTorch's choice.

A long-running server's decode loop ends with every key length settled on PyTorch's default
(`dispatcher.selection.settle_after`). This times that steady state directly: dispatchers
limited to ``sdpa_default`` (so every plan is PyTorch's own call from the start, as a settled one
is) against `F.scaled_dot_product_attention`, in the decode pattern (per token a new key length,
one call per layer on K/V slices of one preallocated cache), passes alternating in one process:
PyTorch's SDPA, the dispatcher's fast path (``fast_attention``, what `patched` and transformers
call; built first where it is not: `dispatcher.fast_path`), the dispatcher with its hot path
(``attention``), the dispatcher with ``ATTN_DISPATCH_HOT_PATH=0``.

Usage (repository root): python -m bench.decode_settled [--device cuda] [--passes 30]
    [--context 1024] [--tokens 32] [--layers 32] [--batch 1]
Prints per-token medians (ms), the extra per call over SDPA (us) and the hot path's hits.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.nn.functional as F

from attn_dispatch.dispatcher import Dispatcher, fast_path
from attn_dispatch.models.environment import HOT_PATH
from bench.decode_loop import decode_pass


def dispatcher(hot: bool) -> Dispatcher:
    previous = os.environ.get(HOT_PATH.name)
    os.environ[HOT_PATH.name] = "1" if hot else "0"  # read when the dispatcher is made
    try:
        return Dispatcher(kernels=["sdpa_default"])
    finally:
        if previous is None:
            os.environ.pop(HOT_PATH.name, None)
        else:
            os.environ[HOT_PATH.name] = previous


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--passes", type=int, default=30)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    total = args.context + args.tokens
    query = torch.randn(args.batch, args.heads, 1, args.head_dim, device=device, dtype=dtype)
    cache_k = torch.randn(args.batch, args.kv_heads, total, args.head_dim, device=device, dtype=dtype)
    cache_v = torch.randn_like(cache_k)
    if fast_path.fast_path_enabled() and fast_path.load() is None:
        print(f"building the fast path ... {fast_path.build()}")
    fast, hot, cold = dispatcher(True), dispatcher(True), dispatcher(False)
    paths = {"sdpa": F.scaled_dot_product_attention, "fast path": fast.fast_attention, "hot path": hot.attention,
             "dict path": cold.attention}

    def one_pass(attend) -> list[float]:
        return decode_pass(attend, query, cache_k, cache_v, args.context, args.tokens, args.layers)

    for attend in paths.values():  # every length warm for every path (PyTorch's per-shape plans too)
        one_pass(attend)
    times: dict[str, list[float]] = {name: [] for name in paths}
    for index in range(args.passes):
        names = list(paths)
        names = names[index % len(names):] + names[:index % len(names)]
        for name in names:
            times[name].extend(one_pass(paths[name]))
    base = statistics.median(times["sdpa"])
    print(f"decode, settled: {args.layers} calls a token, B{args.batch} {args.heads}/{args.kv_heads} heads D{args.head_dim} "
          f"{args.dtype}, {args.context}+{args.tokens} keys (slices), {args.passes} passes, {device}, torch {torch.__version__}")
    for name, values in times.items():
        median = statistics.median(values)
        quartiles = statistics.quantiles(values, n=4)
        print(f"  {name:10s} {median * 1e3:.3f} ms/token (quartiles {quartiles[0] * 1e3:.3f}-{quartiles[2] * 1e3:.3f}), "
              f"{median / base:.3f}x, {(median - base) / args.layers * 1e6:+.2f} us per call")
    served = fast._fast.hits if fast._fast is not None else "no fast path"
    print(f"  calls counted: fast {fast.stats()} (served in C++: {served}), hot {hot.stats()}, dict {cold.stats()}")


if __name__ == "__main__":
    main()
