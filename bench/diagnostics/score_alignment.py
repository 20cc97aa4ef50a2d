"""Do padded score rows (`kernels._blocks.SCORE_ROW_ALIGNMENT` = `KEY_COUNT_MULTIPLE`) make our
portable kernels faster where the key count is not a multiple of 8, and leave them as fast where it is?

Per shape, each portable kernel runs with rows padded to `KEY_COUNT_MULTIPLE` and unpadded
(alignment 1, as shipped until this is measured), paired per round against PyTorch's default
(`bench.diagnostics.gqa_fold.paired`); and each output's error against a float64 reference.

    python -m bench.diagnostics.score_alignment --device cuda --rounds 9 [--out score_alignment.json]
    python -m bench.diagnostics.score_alignment --device cpu --small --rounds 3   # smoke run
"""

from __future__ import annotations

import argparse
import json

import torch

from attn_dispatch.kernels import _blocks, kernel_from_name
from attn_dispatch.kernels.reference import reference_attention, relative_errors
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from bench.diagnostics.gqa_fold import SMALL_KV_DIVISOR, paired, random_inputs

# (batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype): the worst table pick of session 15's
# seed-5 draw (small_q[splits=1] 2.45x PyTorch's default at 4731 keys) and aligned controls.
SHAPES = [(4, 32, 8, 2, 4731, 256, "bfloat16"), (4, 32, 8, 2, 4736, 256, "bfloat16"),
          (1, 32, 8, 16, 10001, 128, "float16"), (1, 32, 8, 16, 10000, 128, "float16"),
          (1, 32, 8, 1, 8191, 128, "bfloat16"), (1, 32, 8, 1, 8192, 128, "bfloat16"),
          (1, 32, 32, 512, 3001, 64, "float16"), (1, 32, 32, 512, 3008, 64, "float16")]
KERNELS = ("small_q[splits=1]", "small_q[splits=8]", "chunked[q=2048,kv=16384]", "math")
UNPADDED = 1  # SCORE_ROW_ALIGNMENT of the plain layout: rows exactly Sc elements apart


def with_alignment(alignment: int, call):
    """`call` run with `_blocks.SCORE_ROW_ALIGNMENT` set to `alignment` (restored after)."""
    def run():
        shipped, _blocks.SCORE_ROW_ALIGNMENT = _blocks.SCORE_ROW_ALIGNMENT, alignment
        try:
            return call()
        finally:
            _blocks.SCORE_ROW_ALIGNMENT = shipped
    return run


def diagnose(shape: tuple, device: torch.device, rounds: int, small: bool) -> dict:
    q, k, v, problem = random_inputs(shape, device, small)
    b, hq, hkv, length, kv_len, d, dtype = (*shape[:4], problem.kv_len, *shape[5:])
    reference = reference_attention(q, k, v, None, False, enable_gqa=True)
    calls, errors = {"default": lambda: pytorch_sdpa(q, k, v, enable_gqa=True)}, {}
    for name in KERNELS:
        run = kernel_from_name(name).runner(problem)
        for label, alignment in (("padded", _blocks.KEY_COUNT_MULTIPLE), ("unpadded", UNPADDED)):
            call = with_alignment(alignment, lambda run=run: run(q, k, v, None, None, True, problem))
            calls[f"{name} {label}"] = call
            errors[f"{name} {label}"] = relative_errors(call(), reference)[0]
    row = {"shape": dict(zip(("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype"),
                             (b, hq, hkv, length, kv_len, d, dtype), strict=True)), "rel_l2": errors}
    return row | paired(calls, rounds, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--small", action="store_true", help=f"Lk / {SMALL_KV_DIVISOR} (smoke runs)")
    parser.add_argument("--out", help="JSON file for all numbers")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}; torch {torch.__version__}; rounds {args.rounds}; alignment {_blocks.KEY_COUNT_MULTIPLE} "
          "against 1; ratios: paired median [quartiles] of path / PyTorch's default per round; rel L2 vs float64")
    rows = []
    for shape in SHAPES:
        row = diagnose(shape, device, args.rounds, args.small)
        rows.append(row)
        s = row["shape"]
        print(f"B{s['batch']} {s['q_heads']}/{s['kv_heads']} Lq{s['q_len']} Lk{s['kv_len']} D{s['head_dim']} "
              f"{s['dtype']}: default {row['default_us']:.1f} us")
        for label, r in row["ratios"].items():
            if label != "default":
                print(f"    {label:<36} {r['median']:6.3f}x  [{r['q1']:.3f} - {r['q3']:.3f}]  rel L2 {row['rel_l2'][label]:.1e}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"conditions": {"device": name, "torch": torch.__version__, "rounds": args.rounds}, "shapes": rows},
                      handle, indent=1)


if __name__ == "__main__":
    main()
