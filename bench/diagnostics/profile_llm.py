"""Where does warm decode time go (transformers, 8 Llama-3-8B layers, bf16), and what did the
dispatcher decide for each bucket and why (its decision notes: tuning and check timings)?

Usage (GPU, from the repository root): python -m bench.diagnostics.profile_llm [PROMPT] [dispatch,sdpa]
(first used at a 32k prompt, docs/RESULTS.md section 11: run5_profile_llm_32k.txt)."""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

PROMPT = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
IMPLS = sys.argv[2].split(",") if len(sys.argv) > 2 else ["dispatch", "sdpa"]
sys.argv = ["e2e"]
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import attn_dispatch as ad  # noqa: E402
from attn_dispatch.dispatcher.hf import register_transformers  # noqa: E402
from bench.e2e import LLM  # noqa: E402

for impl in IMPLS:
    ours = ad.Dispatcher() if impl == "dispatch" else None
    name = register_transformers(dispatcher=ours) if ours else "sdpa"
    config = LlamaConfig(**LLM, num_hidden_layers=8, max_position_embeddings=PROMPT + 96)
    config._attn_implementation = name
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    prompt = torch.randint(0, LLM["vocab_size"], (1, PROMPT), device="cuda")
    gen = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        for _ in range(2):
            model.generate(prompt, **gen)
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(prompt, **gen)
        torch.cuda.synchronize()
        print(f"== {impl}: warm generate {time.perf_counter() - t:.3f} s; stats {ours.stats() if ours else None}")
        if ours is not None:
            seen = set()
            for plan in list(ours._plans.values()):
                if id(plan.bucket) in seen:
                    continue
                seen.add(id(plan.bucket))
                print(f"   bucket of {plan.problem}: {plan.kernel.name} (settle_at {plan.settle_at}, recheck {plan.recheck})")
                for note in plan.decision.notes:
                    print(f"      - {note}")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            model.generate(prompt, **gen)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=14, max_name_column_width=60))
    del model
    torch.cuda.empty_cache()
