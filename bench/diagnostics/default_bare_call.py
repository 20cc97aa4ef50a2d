"""What PyTorch's SDPA spends choosing a backend, per call: `F.scaled_dot_product_attention` against
the ATen operator of the backend it picks (`torch._fused_sdp_choice`), called with the arguments
SDPA passes it, on host-bound and GPU-bound shapes. Pure torch (no attn_dispatch import).

    python -m bench.diagnostics.default_bare_call --device cuda [--json FILE]

Per shape: PyTorch's choice, whether the bare call's output is bitwise SDPA's (`torch.equal`), and
the median time per call over rounds of back-to-back calls (synchronised at each round's end), the
two interleaved round by round so that host-speed drift hits both alike.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}

SHAPES = (  # name, batch, q heads, kv heads, q len, kv len, head dim, dtype, causal, enable_gqa
    ("decode gqa4 native Lk4096 bf16", 1, 32, 8, 1, 4096, 128, torch.bfloat16, False, True),
    ("decode MHA Lk4096 bf16", 1, 32, 32, 1, 4096, 128, torch.bfloat16, False, False),
    ("decode B8 MHA Lk4096 fp16", 8, 32, 32, 1, 4096, 128, torch.float16, False, False),
    ("decode gqa4 native Lk32768 bf16", 1, 32, 8, 1, 32768, 128, torch.bfloat16, False, True),
    ("Lq16 Lk2048 gqa4 bf16", 1, 32, 8, 16, 2048, 128, torch.bfloat16, False, True),
    ("Lq64 Lk1024 D64 fp16", 1, 16, 16, 64, 1024, 64, torch.float16, False, False),
    ("prefill 512 causal bf16", 1, 32, 32, 512, 512, 128, torch.bfloat16, True, False),
    ("prefill 512 causal gqa4 bf16", 1, 32, 8, 512, 512, 128, torch.bfloat16, True, True),
    ("decode D256 Lk8192 bf16", 1, 16, 16, 1, 8192, 256, torch.bfloat16, False, False),
    ("decode D64 Lk2048 fp16", 4, 16, 16, 1, 2048, 64, torch.float16, False, False),
)


def bare_call(choice: int):
    """``(q, k, v, causal, gqa) -> out`` calling the chosen backend's operator as SDPA does, or None."""
    if choice == 1:
        op = torch._C._VariableFunctions._scaled_dot_product_flash_attention
        return lambda q, k, v, causal: op(q, k, v, 0.0, causal, False)[0]
    if choice == 3:
        op = torch._C._VariableFunctions._scaled_dot_product_cudnn_attention
        return lambda q, k, v, causal: op(q, k, v, None, False, 0.0, causal, False)[0]
    if choice == 2:
        op = torch._C._VariableFunctions._scaled_dot_product_efficient_attention
        return lambda q, k, v, causal: op(q, k, v, None, False, 0.0, causal)[0]
    return None


def per_call_seconds(fn, calls: int, sync) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


def measure(shape, device: torch.device, rounds: int, calls: int) -> dict:
    name, b, hq, hkv, lq, lk, d, dtype, causal, gqa = shape
    q = torch.randn(b, hq, lq, d, device=device, dtype=dtype)
    k = torch.randn(b, hkv, lk, d, device=device, dtype=dtype)
    v = torch.randn(b, hkv, lk, d, device=device, dtype=dtype)
    choice = int(torch._fused_sdp_choice(q, k, v, None, 0.0, causal, scale=None, enable_gqa=gqa))
    bare = bare_call(choice)
    row = {"shape": name, "choice": BACKENDS.get(choice, str(choice))}
    if bare is None:
        return row
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        reference = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        try:
            out = bare(q, k, v, causal)
        except RuntimeError as error:
            row["bare_error"] = str(error).splitlines()[0]
            return row
        row["bitwise_equal"] = bool(torch.equal(reference, out))
        fns = {
            "F.sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
            "bare": lambda: bare(q, k, v, causal),
            "choice": lambda: torch._fused_sdp_choice(q, k, v, None, 0.0, causal, scale=None, enable_gqa=gqa),
        }
        for fn in fns.values():
            per_call_seconds(fn, calls, sync)
        samples = {label: [] for label in fns}
        for _ in range(rounds):
            for label, fn in fns.items():
                samples[label].append(per_call_seconds(fn, calls, sync) * 1e6)
    row["median_us"] = {label: round(statistics.median(s), 3) for label, s in samples.items()}
    row["iqr_us"] = {label: round(statistics.quantiles(s, n=4)[2] - statistics.quantiles(s, n=4)[0], 3)
                     for label, s in samples.items()}
    row["bare_minus_sdpa_us"] = round(row["median_us"]["bare"] - row["median_us"]["F.sdpa"], 3)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    conditions = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device),
                  "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                  "rounds": args.rounds, "calls_per_round": args.calls,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps(conditions))
    rows = []
    for shape in SHAPES:
        row = measure(shape, device, args.rounds, args.calls)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"conditions": conditions, "shapes": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
