"""What each piece of `Dispatcher.attention`'s warm path costs, and what its cheaper candidates
cost: statements timed with `timeit` in one process, interleaved round by round (drift hits all
alike), an empty statement subtracted; prints the median ns per execution, the spread
(10th-90th percentile) over rounds and the fastest round. One CPU thread, tiny CPU tensors (a decode call: q [1,2,1,8],
k/v [1,1,4,8], GQA).

Usage (repository root): python -m bench.diagnostics.warm_path_pieces [--rounds 41] [--number 20000]
    [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import os
import statistics
import timeit

import torch

from attn_dispatch.dispatcher import Dispatcher
from attn_dispatch.dispatcher._plan import cache_key

PIECES = {
    # the call itself
    "call f(q,k,v,enable_gqa=True)": "f(q, k, v, enable_gqa=True)",
    "call f(q,k,v,None,enable_gqa=True)": "f(q, k, v, None, enable_gqa=True)",
    "call method o.m(q,k,v,enable_gqa=True)": "o.m(q, k, v, enable_gqa=True)",
    # key fields
    "q.shape": "q.shape",
    "q.dtype": "q.dtype",
    "q.device": "q.device",
    "q.get_device()": "q.get_device()",
    "q.is_cuda": "q.is_cuda",
    "q.is_contiguous()": "q.is_contiguous()",
    "q.is_meta": "q.is_meta",
    "q.is_nested": "q.is_nested",
    "q.requires_grad": "q.requires_grad",
    "q.__class__": "q.__class__",
    "contiguous x3 (and)": "q.is_contiguous() and k.is_contiguous() and v.is_contiguous()",
    "mask field, None": "None if m is None else (m.shape, m.dtype, m.device, m.__class__)",
    "mask field, bool mask": "None if bm is None else (bm.shape, bm.dtype, bm.device, bm.__class__)",
    "devices x3": "(q.device, k.device, v.device)",
    "device + k,v same? (==)": "(d := q.device, k.device == d and v.device == d)",
    "full key (today)": ("(q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,"
                         " q.is_contiguous() and k.is_contiguous() and v.is_contiguous(),"
                         " None if m is None else (m.shape, m.dtype, m.device, m.__class__), False, True)"),
    # lookup
    "hash(key)": "hash(key)",
    "hash(torch.Size)": "hash(size)",
    "hash(tuple of ints)": "hash(ints)",
    "hash(q.device object)": "hash(dev)",
    "hash(dtype)": "hash(dt)",
    "dev == dev2 (distinct objects)": "dev == dev2",
    "size == size2 (distinct objects)": "size == size2",
    "dict.get(key)": "get(key)",
    "dict subscript (the warm path's)": "table[key]",
    # after the lookup
    "count += 1, settle check": "count = plan.count\ncount[0] += 1\nif count[0] == plan.settle_at: pass",
    "plan.sdpa_call read": "plan.sdpa_call",
    "training check (no grad)": ("dropout_p != 0.0 or (ge() and (q.requires_grad or k.requires_grad"
                                 " or v.requires_grad or (m is not None and m.requires_grad)))"),
    "try/except around pass": "try:\n    pass\nexcept Exception:\n    pass",
    # PyTorch's SDPA itself, by how its arguments are passed
    "sdpa(q,k,v,None,is_causal=F,scale=None,enable_gqa=T)": "sdpa(q, k, v, None, is_causal=False, scale=None, enable_gqa=True)",
    "sdpa(q,k,v,None,0.0,False,scale=None,enable_gqa=T)": "sdpa(q, k, v, None, 0.0, False, scale=None, enable_gqa=True)",
    "sdpa(q,k,v,None,dropout_p=0.0,is_causal=F,scale=None,enable_gqa=T)": "sdpa(q, k, v, None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=True)",
    "sdpa(q,k,v,enable_gqa=T)": "sdpa(q, k, v, enable_gqa=True)",
    "sdpa(q,k,v,None,is_causal=F,enable_gqa=T)": "sdpa(q, k, v, None, is_causal=False, enable_gqa=True)",
}

SDPA_REFERENCE = "sdpa(q,k,v,None,is_causal=F,scale=None,enable_gqa=T)"
"""The warm path's call today; other ways of passing the same arguments are reported against it."""


def scope() -> dict:
    """The names the statements read: tensors, a warm dispatcher's plan and key."""
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    bool_mask = torch.rand(1, 4) > 0.3
    ours = Dispatcher(kernels=["sdpa_default"])
    ours.attention(q, k, v, enable_gqa=True)
    key = cache_key(q, k, v, None, False, True)
    plan = ours._plans.get(key)

    def f(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
        return None

    class Holder:
        def m(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
              enable_gqa=False):
            return None

    return {
        "torch": torch, "q": q, "k": k, "v": v, "m": None, "bm": bool_mask, "dropout_p": 0.0,
        "key": cache_key(q, k, v, None, False, True), "get": ours._plans.get, "table": ours._plans.table, "plan": plan, "o": Holder(), "f": f,
        "size": q.shape, "size2": torch.Size(q.shape), "ints": tuple(q.shape), "dev": q.device, "dev2": q.device,
        "dt": q.dtype, "ge": torch.is_grad_enabled, "sdpa": torch._C._nn.scaled_dot_product_attention,
        "hit": plan is not None and key in ours._plans,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--only", default="", help="time only the pieces whose label holds this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = scope()
    assert names["hit"], "the warm dispatcher's key must hit"  # noqa: S101 - a diagnostic's own sanity check
    pieces = {"(empty)": "pass", **{label: stmt for label, stmt in PIECES.items() if args.only in label}}
    timers = {label: timeit.Timer(stmt, globals=names) for label, stmt in pieces.items()}
    samples: dict[str, list[float]] = {label: [] for label in timers}
    with torch.inference_mode():
        for _ in range(args.rounds):
            ns = {label: timer.timeit(args.number) / args.number * 1e9 for label, timer in timers.items()}
            for label, value in ns.items():
                samples[label].append(value - ns["(empty)"] if label != "(empty)" else value)
    print(f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}, "
          f"{args.rounds} rounds x {args.number}; ns per execution, empty statement subtracted")
    for label, values in samples.items():
        deciles = statistics.quantiles(values, n=10)
        line = (f"{label:58s} median {statistics.median(values):7.1f}  p10-p90 {deciles[0]:7.1f} .. {deciles[-1]:7.1f}"
                f"  min {min(values):7.1f}")
        if label.startswith("sdpa(") and SDPA_REFERENCE in samples:  # paired: the kernel's noise cancels
            paired = [a - b for a, b in zip(values, samples[SDPA_REFERENCE], strict=True)]
            deciles = statistics.quantiles(paired, n=10)
            line += f"  vs the first sdpa {statistics.median(paired):+7.1f} ({deciles[0]:+.0f} .. {deciles[-1]:+.0f})"
        print(line)


if __name__ == "__main__":
    main()
