"""End to end: real models (random weights from a config, nothing downloaded), through PyTorch's SDPA
and through the dispatcher, each in a fresh process.

Cases
-----
llm: a Llama-3-8B-shaped transformers model (hidden 4096, 32/8 heads, D=128, MLP 14336; `--layers`
    of them), `generate()` greedy from a random prompt. Reports prefill seconds (time to the first
    token) and decode tokens/s, for the first generation in the process (cold) and a repeat (warm).
    `--cache dynamic|static|static-compile` (transformers' static cache without / with its
    torch.compile of the decoding step).
dit: a Wan2.1-shaped diffusers video transformer (40 heads, D=128; `--layers` blocks) at a real token
    count (`--frames` latent frames of 60x104 latents: 1560 tokens each), one denoising step
    (a forward pass), cold and warm, under `patched()`.

`--impl`: sdpa (PyTorch's own), dispatch (the dispatcher, all kernels), portable (`--kernels
portable --memory-budget 16GiB`: the gfx906 stand-in), math (PyTorch held to its math backend), both
(llm only: sdpa and dispatch models in one process, generations interleaved: warm against warm on
the same host state; `run_llm_interleaved`).
`--lossy fp32->bf16` lets the dispatcher convert an fp32 model. Every run appends one JSON line.
With `--matrix`, each configuration runs in a fresh process with a fresh ``ATTN_DISPATCH_HOME``
(the bundled table; no tunings remembered from another configuration).

Usage (from the repository root; one process per configuration):
    python -m bench.e2e --case llm --impl dispatch --prompt 8192 --batch 1 --layers 8 --out OUT.jsonl
    python -m bench.e2e --matrix llm --out OUT.jsonl    # sdpa vs dispatch over prompts 512, 8k, 32k
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

LLM = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336,
           vocab_size=32000)
"""Llama-3-8B's attention and MLP shapes (vocabulary cut to 32k: the embedding is not what is measured)."""
WAN_LATENT = (60, 104)
"""Latent height and width of a 480x832 Wan2.1 video (8x VAE): 30x52 = 1560 tokens per latent frame."""


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _dispatcher(args):
    import attn_dispatch as ad

    policy = ad.AccuracyPolicy.allowing(args.lossy) if args.lossy else ad.LOSSLESS
    if args.impl == "portable":
        return ad.Dispatcher(kernels="portable", memory_budget=args.memory_budget or "16GiB", policy=policy)
    return ad.Dispatcher(policy=policy, memory_budget=args.memory_budget)


def _attention_context(args, ours):
    """What wraps each measured call: patched() for the dispatcher, sdpa_kernel(MATH) for math."""
    if ours is not None:
        from attn_dispatch import patched

        return patched(ours)
    if args.impl == "math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


class StepClock:
    """A transformers LogitsProcessor that timestamps every generated token (synchronised)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        _sync()
        self.stamps.append(time.perf_counter())
        return scores


def decisions(ours) -> list[dict] | None:
    """What the dispatcher planned, per exact shape: problem, kernel, calls, the decision's notes
    (tuning or check timings, set-up weighing): an e2e anomaly then explains itself."""
    if ours is None:
        return None
    return [{"problem": str(plan.problem), "kernel": plan.kernel.name, "calls": plan.count[0],
             "settle_at": plan.settle_at, "notes": list(plan.decision.notes)}
            for plan in list(ours._plans.values())]


def _llm_model(args, implementation: str):
    """The Llama-3-8B-shaped model with `args.layers` layers (the same random weights every time)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**LLM, num_hidden_layers=args.layers, max_position_embeddings=args.prompt + args.tokens + 64)
    config._attn_implementation = implementation
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        return LlamaForCausalLM(config).to(getattr(torch, args.dtype)).eval()


def _generate(args, model, prompt) -> dict:
    """One timed `generate()`: prefill seconds (to the first token), decode tokens/s, total seconds."""
    from transformers import LogitsProcessorList

    generation = dict(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, pad_token_id=0,
                      eos_token_id=None)
    if args.cache != "dynamic":
        generation["cache_implementation"] = "static"
        generation["disable_compile"] = args.cache == "static"
    clock = StepClock()
    _sync()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(prompt, logits_processor=LogitsProcessorList([clock]), **generation)
    _sync()
    end = time.perf_counter()
    first = clock.stamps[0]
    decode_s = end - first if len(clock.stamps) > 1 else float("nan")
    return {"prefill_s": first - start, "decode_tokens_per_s": (len(clock.stamps) - 1) * args.batch / decode_s,
            "total_s": end - start}


def run_llm(args) -> dict:
    ours = None if args.impl in ("sdpa", "math") else _dispatcher(args)
    implementation = "sdpa"
    if ours is not None:
        from attn_dispatch.dispatcher.hf import register_transformers

        implementation = register_transformers(dispatcher=ours)
    model = _llm_model(args, implementation)
    prompt = torch.randint(0, LLM["vocab_size"], (args.batch, args.prompt), device=model.device)
    runs = [_generate(args, model, prompt) for _ in range(args.repeats)]
    return {"runs": runs, "stats": ours.stats() if ours is not None else None, "decisions": decisions(ours)}


def run_llm_interleaved(args) -> dict:
    """`--impl both`: an `sdpa` model and an `attn_dispatch` model with the same weights in ONE process,
    their generations alternating (the order swapped every round), so that the host's speed, which
    can differ by more than the effect between processes on one host, is the same for both. Round 1 warms both (PyTorch's per-shape state is shared by the process: only the
    later rounds compare warm with warm); `ratios` are dispatch / sdpa decode tokens/s per round."""
    from attn_dispatch.dispatcher.hf import register_transformers

    ours = _dispatcher(args)
    models = {"sdpa": _llm_model(args, "sdpa"), "dispatch": _llm_model(args, register_transformers(dispatcher=ours))}
    prompt = torch.randint(0, LLM["vocab_size"], (args.batch, args.prompt), device=models["sdpa"].device)
    runs: dict[str, list[dict]] = {"sdpa": [], "dispatch": []}
    for round_index in range(args.repeats):
        order = ("sdpa", "dispatch") if round_index % 2 == 0 else ("dispatch", "sdpa")
        for name in order:
            runs[name].append(_generate(args, models[name], prompt))
    ratios = [ours_run["decode_tokens_per_s"] / theirs["decode_tokens_per_s"]
              for ours_run, theirs in zip(runs["dispatch"][1:], runs["sdpa"][1:], strict=True)]
    return {"runs": runs["dispatch"], "sdpa_runs": runs["sdpa"], "warm_decode_ratios": ratios,
            "stats": ours.stats(), "decisions": decisions(ours)}


def run_dit(args) -> dict:
    from diffusers import WanTransformer3DModel

    dtype = getattr(torch, args.dtype)
    ours = None if args.impl in ("sdpa", "math") else _dispatcher(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = WanTransformer3DModel(num_layers=args.layers).to(dtype).eval()
    latents = torch.randn(args.batch, 16, args.frames, *WAN_LATENT, device=device, dtype=dtype)
    text = torch.randn(args.batch, 512, 4096, device=device, dtype=dtype)
    timestep = torch.tensor([500] * args.batch, device=device)
    runs = []
    for _ in range(args.repeats):
        _sync()
        start = time.perf_counter()
        with torch.no_grad(), _attention_context(args, ours):
            model(hidden_states=latents, timestep=timestep, encoder_hidden_states=text, return_dict=False)
        _sync()
        runs.append({"step_s": time.perf_counter() - start,
                     "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None})
    return {"runs": runs, "stats": ours.stats() if ours is not None else None, "decisions": decisions(ours),
            "tokens": args.frames * WAN_LATENT[0] * WAN_LATENT[1] // 4}


def conditions(args) -> dict:
    return {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, **{k: v for k, v in vars(args).items() if k not in ("matrix", "out")}}


MATRICES = {
    "llm": [dict(case="llm", impl=impl, prompt=prompt, batch=1) for prompt in (512, 8192, 32768)
            for impl in ("sdpa", "dispatch")],
    "llm-batch": [dict(case="llm", impl=impl, prompt=8192, batch=8) for impl in ("sdpa", "dispatch")],
    "llm-static": [dict(case="llm", impl=impl, prompt=512, batch=1, cache=cache) for cache in ("static", "static-compile")
                   for impl in ("sdpa", "dispatch")],
    "dit": [dict(case="dit", impl=impl, frames=frames) for frames in (11, 21) for impl in ("sdpa", "dispatch")],
    "portable": [dict(case="dit", impl=impl, frames=21) for impl in ("portable", "math")]
                + [dict(case="llm", impl=impl, prompt=8192, batch=1) for impl in ("portable", "math")],
    "llm-interleaved": [dict(case="llm", impl="both", prompt=prompt, batch=batch) for prompt, batch in
                        ((512, 1), (8192, 1), (32768, 1), (8192, 8))]
                       + [dict(case="llm", impl="both", prompt=512, batch=1, cache="static")],
    "fp32": [dict(case="llm", impl=impl, prompt=8192, batch=1, dtype="float32", lossy=lossy)
             for impl, lossy in (("sdpa", None), ("dispatch", "fp32->bf16"))],
}


def fresh_home() -> str:
    """A fresh ``ATTN_DISPATCH_HOME`` for one configuration: no tunings remembered from another one
    (the bundled table serves), but this home's fast path linked in, built first where it is not,
    as a user who ran `attn-dispatch build-fast-path` (or `calibrate`) finds it."""
    from attn_dispatch.dispatcher import fast_path
    from attn_dispatch.dispatcher.fast_path import BUILD_SUBDIR
    from attn_dispatch.models.paths import home

    home_dir = tempfile.mkdtemp(prefix="e2e-home-")
    if fast_path.fast_path_enabled():
        if fast_path.load() is None:
            print(f"building the fast path ... {fast_path.build()}", flush=True)
        os.symlink(home() / BUILD_SUBDIR, os.path.join(home_dir, BUILD_SUBDIR))
    return home_dir


def run_matrix(args) -> int:
    base = {"layers": args.layers, "tokens": args.tokens, "repeats": args.repeats, "dtype": args.dtype}
    for overrides in MATRICES[args.matrix]:
        settings = {**base, **overrides}
        command = [sys.executable, "-m", "bench.e2e", "--out", args.out]
        for name, value in settings.items():
            if value is not None:
                command += [f"--{name}", str(value)]
        started = time.perf_counter()
        env = {**os.environ, "ATTN_DISPATCH_HOME": fresh_home()}
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env)
        tail = (done.stdout.strip().splitlines() or [""])[-1]
        if done.returncode != 0:
            tail = "FAILED: " + ((done.stderr.strip().splitlines() or ["?"])[-1])
            with open(args.out, "a") as handle:
                handle.write(json.dumps({"settings": settings, "error": tail}) + "\n")
        print(f"{settings} ({time.perf_counter() - started:.0f} s): {tail}", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=["llm", "dit"], default="llm")
    parser.add_argument("--impl", choices=["sdpa", "dispatch", "portable", "math", "both"], default="sdpa")
    parser.add_argument("--matrix", choices=sorted(MATRICES), help="run a set of configurations, a process each")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated (llm)")
    parser.add_argument("--frames", type=int, default=21, help="latent frames (dit): 21 is 32,760 tokens")
    parser.add_argument("--cache", choices=["dynamic", "static", "static-compile"], default="dynamic")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--lossy", default=None, help="accuracy policy for the dispatcher, e.g. fp32->bf16")
    parser.add_argument("--memory-budget", default=None)
    parser.add_argument("--repeats", type=int, default=2, help="runs in the process: the first is cold")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per configuration (--matrix)")
    parser.add_argument("--out", default="bench/results/e2e.jsonl")
    args = parser.parse_args()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    if args.matrix:
        return run_matrix(args)
    if args.impl == "both" and args.case != "llm":
        parser.error("--impl both: llm only")
    runner = run_dit if args.case == "dit" else run_llm_interleaved if args.impl == "both" else run_llm
    result = runner(args)
    record = {"conditions": conditions(args), **result}
    with open(args.out, "a") as handle:
        handle.write(json.dumps(record) + "\n")
    summary = [{k: round(v, 4) if isinstance(v, float) else v for k, v in run.items()} for run in result["runs"]]
    extra = {"warm_decode_ratios": [round(r, 3) for r in result["warm_decode_ratios"]]} if "warm_decode_ratios" in result else {}
    print(json.dumps({"impl": args.impl, "case": args.case, "runs": summary, **extra, "stats": result["stats"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
