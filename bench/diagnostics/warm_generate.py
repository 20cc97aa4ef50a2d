"""Where does a warm `generate()` spend its time, through the dispatcher and through SDPA, one
implementation per process (as `bench.e2e --matrix llm` runs them)?

Session 12's matrix run (H200) gave the dispatcher's second generation at prompt 512 93 tokens/s
against SDPA's 161 (its first, fresh: 82 against 17). Per generation this prints decode tokens/s,
the median and p90 time between tokens, how many attention calls the C++ fast path served and how
many went to Python (`Dispatcher.stats` minus the fast path's hits), and Python's garbage
collections; then the last generation under `torch.profiler`: the ops with the most host (self CPU)
time.

    python -m bench.diagnostics.warm_generate --impl dispatch --prompt 512 --repeats 6
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from bench.e2e import LLM, StepClock, _llm_model, _sync

PROFILE_ROWS = 18


def _collections() -> int:
    return sum(generation["collections"] for generation in gc.get_stats())


def _served(ours) -> tuple[int, int]:
    """(calls counted by the dispatcher, calls served in C++) so far."""
    calls = sum(ours.stats().values())
    fast = ours._fast
    return calls, (fast.hits if fast is not None else 0)


def _one_generation(args, model, prompt, ours) -> dict:
    from transformers import LogitsProcessorList

    clock = StepClock()
    before, collections = (_served(ours) if ours else (0, 0)), _collections()
    _sync()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(prompt, logits_processor=LogitsProcessorList([clock]), max_new_tokens=args.tokens,
                       min_new_tokens=args.tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
    _sync()
    end = time.perf_counter()
    gaps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    after = _served(ours) if ours else (0, 0)
    calls, fast = after[0] - before[0], after[1] - before[1]
    return {"tokens_per_s": len(gaps) / (end - clock.stamps[0]), "median_ms": statistics.median(gaps) * 1e3,
            "p90_ms": statistics.quantiles(gaps, n=10)[-1] * 1e3, "calls": calls, "fast": fast,
            "collections": _collections() - collections, "prefill_s": clock.stamps[0] - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("sdpa", "dispatch"), default="dispatch")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    args.batch = 1
    ours, implementation = None, "sdpa"
    if args.impl == "dispatch":
        import attn_dispatch as ad
        from attn_dispatch.dispatcher import fast_path
        from attn_dispatch.dispatcher.hf import register_transformers

        ours = ad.Dispatcher()
        implementation = register_transformers(dispatcher=ours)
        print(f"fast path: {fast_path.status()}")
    model = _llm_model(args, implementation)
    prompt = torch.randint(0, LLM["vocab_size"], (1, args.prompt), device=model.device)
    print(f"{args.impl}, prompt {args.prompt}, {args.layers} layers, {args.tokens} tokens, torch {torch.__version__}")
    for index in range(args.repeats):
        row = _one_generation(args, model, prompt, ours)
        print(f"  generation {index + 1}: {row['tokens_per_s']:.1f} tokens/s, between tokens median "
              f"{row['median_ms']:.2f} ms p90 {row['p90_ms']:.2f} ms, prefill {row['prefill_s'] * 1e3:.1f} ms; "
              f"attention calls {row['calls']}, served in C++ {row['fast']}; gc collections {row['collections']}")
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        _one_generation(args, model, prompt, ours)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=PROFILE_ROWS, max_name_column_width=55))


if __name__ == "__main__":
    main()
