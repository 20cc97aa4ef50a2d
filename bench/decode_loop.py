"""A decode loop with a growing KV cache, at the attention level: what transformers' DynamicCache
does to attention (the key length grows by one per token; every layer calls attention once per
token with the same shape).

Each run is its own process (`--child`), so "cold" really is a fresh process: pass 1 is a fresh
process's first pass over the key lengths, pass 2 runs the same lengths again in the same process
(per-shape state warm: a long-running server). PyTorch's SDPA and the dispatcher run the same
loop, in separate processes, interleaved by repetition.

Usage (from the repository root):
    python -m bench.decode_loop --device cuda --contexts 1024,8192,32768 --batches 1,8 --tokens 64 \\
        --layers 32 --repeats 2 --out bench/results/decode_loop.jsonl
Prints per-token medians (ms) with the 10th-90th percentile range and the dispatcher/SDPA ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch


def decode_pass(attend, query: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, context: int, tokens: int,
                layers: int, *, contiguous: bool = False, mask: torch.Tensor | None = None) -> list[float]:
    """Seconds per token of one pass: for each of `tokens` key lengths from `context` on, `layers`
    calls of ``attend(query [B, Hq, 1, D], key, value, enable_gqa=True)`` on ``[B, Hkv, length, D]``
    slices of the caches (``contiguous``: dense copies made outside the timing, as transformers'
    DynamicCache makes them with torch.cat), the device synchronised around each token. `mask`
    ([B, 1, 1, total], optional): its first ``length`` columns go with each call as ``attn_mask``
    (a decode step's padding mask, as transformers passes it for a padded batch)."""
    device = query.device
    per_token = []
    for step in range(tokens):
        length = context + step
        key, value = cache_k[:, :, :length], cache_v[:, :, :length]
        if contiguous:
            key, value = key.contiguous(), value.contiguous()
        extra = {} if mask is None else {"attn_mask": mask[..., :length]}
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _layer in range(layers):
            attend(query, key, value, enable_gqa=True, **extra)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        per_token.append(time.perf_counter() - start)
    return per_token


def child(args) -> dict:
    """One process: `args.impl` over `args.tokens` tokens from `args.context` keys, `args.passes` times.
    `--impl both`: SDPA and the dispatcher in this one process, SDPA's first pass first, then the
    two alternating pass by pass (warm against warm on the same host state)."""
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    total = args.context + args.tokens
    q_heads, kv_heads, dim = args.heads, args.kv_heads, args.head_dim
    query = torch.randn(args.batch, q_heads, 1, dim, device=device, dtype=dtype)
    cache_k = torch.randn(args.batch, kv_heads, total, dim, device=device, dtype=dtype)
    cache_v = torch.randn(args.batch, kv_heads, total, dim, device=device, dtype=dtype)
    mask = padding_mask(args.mask, args.batch, total, device, dtype)
    attends, stats = {}, None
    if args.impl in ("sdpa", "both"):
        attends["sdpa"] = torch.nn.functional.scaled_dot_product_attention
    if args.impl in ("dispatch", "both"):
        import attn_dispatch as ad
        from attn_dispatch.dispatcher.core import KERNEL_SETS

        kernels = args.kernels if args.kernels in KERNEL_SETS else args.kernels.split(";")
        ours = ad.Dispatcher(kernels=kernels, memory_budget=args.memory_budget)
        attends["dispatch"], stats = ours.fast_attention, ours.stats  # what patched() and transformers call

    def one_pass(attend) -> list[float]:
        return decode_pass(attend, query, cache_k, cache_v, args.context, args.tokens, args.layers,
                           contiguous=args.layout == "contiguous", mask=mask)

    passes: dict[str, list[list[float]]] = {name: [] for name in attends}
    names = list(attends)
    for index in range(args.passes):
        for name in names if index % 2 == 0 else names[::-1]:
            passes[name].append(one_pass(attends[name]))
    keep = lambda runs: [runs[0], runs[1], runs[-1]] if len(runs) > 2 else runs  # noqa: E731
    if args.impl == "both":
        return {"passes_by_impl": {name: keep(runs) for name, runs in passes.items()},
                "stats": stats() if stats else None}
    return {"passes": keep(passes[args.impl]), "stats": stats() if stats else None}


PADDED_KEYS = 7
"""Keys masked out at the front of every row but the first of a `--mask` batch (left padding)."""


def padding_mask(kind: str, batch: int, total: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
    """A [B, 1, 1, total] left-padding mask (``--mask bool``: True attends; ``float``: 0 or -inf in
    the inputs' dtype; ``none``: None): row 0 unpadded, the others `PADDED_KEYS` keys padded."""
    if kind == "none":
        return None
    attends = torch.ones(batch, 1, 1, total, dtype=torch.bool, device=device)
    attends[1:, ..., :PADDED_KEYS] = False
    if kind == "bool":
        return attends
    return torch.zeros(attends.shape, dtype=dtype, device=device).masked_fill(~attends, float("-inf"))


def summary(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median_ms": statistics.median(ordered) * 1e3, "p10_ms": pick(0.1) * 1e3, "p90_ms": pick(0.9) * 1e3,
            "total_ms": sum(ordered) * 1e3}


def run_child(base: list[str], impl: str, context: int, batch: int) -> dict:
    command = [sys.executable, "-m", "bench.decode_loop", *base, "--child", "--impl", impl,
               "--context", str(context), "--batch", str(batch)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--contexts", default="1024,8192,32768")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--kernels", default="all",
                        help="the dispatcher's kernel set: all, portable, or kernel names separated by ';' (e.g. "
                             "\"triton_decode[splits=16,bn=128,w=4,s=2]\": the dispatcher serving that kernel alone)")
    parser.add_argument("--memory-budget", default=None)
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per implementation and shape")
    parser.add_argument("--layout", choices=["slice", "contiguous"], default="slice",
                        help="K/V as slices of one preallocated cache (strided), or dense per token (outside the timing)")
    parser.add_argument("--passes", type=int, default=2,
                        help="passes over the key lengths per process (> 2: the last is reported as 'steady', a "
                             "long-running server that has met every length many times)")
    parser.add_argument("--same-process", action="store_true",
                        help="SDPA and the dispatcher in one process per run, passes alternating: warm against warm on "
                             "the same host state (the host's speed differed by up to 1.7x between processes on the "
                             "H200 host); the dispatcher's pass 1 then follows SDPA's, so its 'cold' is not a fresh "
                             "process's")
    parser.add_argument("--mask", choices=["none", "float", "bool"], default="none",
                        help="pass a [B, 1, 1, length] left-padding mask with every call (`padding_mask`)")
    parser.add_argument("--out", default=None, help="append one JSON line per shape here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default="sdpa", help=argparse.SUPPRESS)
    parser.add_argument("--context", type=int, default=1024, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    base = ["--device", args.device, "--dtype", args.dtype, "--tokens", str(args.tokens), "--layers", str(args.layers),
            "--heads", str(args.heads), "--kv-heads", str(args.kv_heads), "--head-dim", str(args.head_dim),
            "--kernels", args.kernels, "--passes", str(args.passes), "--layout", args.layout, "--mask", args.mask] + (["--memory-budget", args.memory_budget] if args.memory_budget else [])
    print(f"decode loop: {args.layers} attention calls per token, Lq=1, {args.heads}/{args.kv_heads} heads, "
          f"D={args.head_dim}, {args.dtype}, K/V {args.layout}, mask {args.mask}, {args.tokens} tokens from each context, device {args.device}, "
          f"torch {torch.__version__}; "
          + ("SDPA and the dispatcher in ONE process per run, passes alternating (SDPA's pass 1 a fresh process's, the "
             "dispatcher's after it)" if args.same_process else "each run a fresh process, interleaved")
          + f" (pass 1 cold, pass 2 warm, {args.passes} passes); {args.repeats} runs each; "
          f"per-token medians over tokens and runs (p10-p90)")
    for batch in (int(b) for b in args.batches.split(",")):
        for context in (int(c) for c in args.contexts.split(",")):
            runs = {"sdpa": [], "dispatch": []}
            for _ in range(args.repeats):
                if args.same_process:  # one process, passes alternating (`child`)
                    both = run_child(base, "both", context, batch)
                    for impl in runs:
                        runs[impl].append({"passes": both["passes_by_impl"][impl],
                                           "stats": both["stats"] if impl == "dispatch" else None}
                                          if "passes_by_impl" in both else both)
                    continue
                for impl in runs:
                    runs[impl].append(run_child(base, impl, context, batch))
            row = {"batch": batch, "context": context, "conditions": vars(args) | {"torch": torch.__version__}}
            for impl, results in runs.items():
                ok = [r for r in results if "passes" in r]
                if not ok:
                    row[impl] = {"error": results[0].get("error")}
                    continue
                row[impl] = {"cold": summary([s for r in ok for s in r["passes"][0]]),
                             "warm": summary([s for r in ok for s in r["passes"][1]]), "stats": ok[-1]["stats"]}
                if args.passes > 2:
                    row[impl]["steady"] = summary([s for r in ok for s in r["passes"][-1]])
            if "cold" in row["sdpa"] and "cold" in row["dispatch"]:
                for when in ("cold", "warm"):
                    row[f"ratio_{when}"] = row["dispatch"][when]["median_ms"] / row["sdpa"][when]["median_ms"]
                row["ratio_vs_warm_sdpa"] = row["dispatch"]["warm"]["median_ms"] / row["sdpa"]["warm"]["median_ms"]
                steady = ""
                if args.passes > 2:
                    row["ratio_steady"] = row["dispatch"]["steady"]["median_ms"] / row["sdpa"]["steady"]["median_ms"]
                    steady = (f"; pass {args.passes}: SDPA {row['sdpa']['steady']['median_ms']:.3f} dispatcher "
                              f"{row['dispatch']['steady']['median_ms']:.3f} ({row['ratio_steady']:.2f}x)")
                print(f"B={batch} ctx={context}: SDPA cold {row['sdpa']['cold']['median_ms']:.3f} ms/token "
                      f"warm {row['sdpa']['warm']['median_ms']:.3f}; dispatcher cold "
                      f"{row['dispatch']['cold']['median_ms']:.3f} warm {row['dispatch']['warm']['median_ms']:.3f} "
                      f"(ratio cold {row['ratio_cold']:.2f}x, warm {row['ratio_warm']:.2f}x){steady} kernels {row['dispatch']['stats']}")
            else:
                print(f"B={batch} ctx={context}: {row}")
            if args.out:
                os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
                with open(args.out, "a") as handle:
                    handle.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
