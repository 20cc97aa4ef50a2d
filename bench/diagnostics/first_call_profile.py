"""Where a fresh process's first `generate()` spends its time with the dispatcher: cProfile of the
first generation (prefill and two decode tokens) of a Llama-3-8B-shaped model (`--layers`, bf16),
the functions with the most cumulative time. The e2e runs measured the first prefill 0.6 s slower
with the dispatcher than with `sdpa` (docs/RESULTS.md section 13).

Usage (GPU, from the repository root): python -m bench.diagnostics.first_call_profile [--prompt 512] [--layers 8]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=40)
    args = parser.parse_args()
    sys.argv = sys.argv[:1]
    from transformers import LlamaConfig, LlamaForCausalLM

    import attn_dispatch as ad
    from attn_dispatch.dispatcher.hf import register_transformers
    from bench.e2e import LLM

    ours = ad.Dispatcher()
    config = LlamaConfig(**LLM, num_hidden_layers=args.layers, max_position_embeddings=args.prompt + 64)
    config._attn_implementation = register_transformers(dispatcher=ours)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    prompt = torch.randint(0, LLM["vocab_size"], (1, args.prompt), device="cuda")
    gen = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        profiler.enable()
        model.generate(prompt, **gen)
        torch.cuda.synchronize()
        profiler.disable()
    print(f"first generate(): {time.perf_counter() - start:.3f} s; stats {ours.stats()}")
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(prompt, **gen)
    torch.cuda.synchronize()
    print(f"second generate(): {time.perf_counter() - start:.3f} s")
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(r"attn_dispatch|cuda|import", args.rows)
    stats.sort_stats("tottime").print_stats(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
