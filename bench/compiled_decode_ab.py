"""Is the compiled decode step slower through the dispatcher than through PyTorch's SDPA, in ONE
process, interleaved (so host noise between processes cannot decide)?

Three copies of one Llama-3-8B-shaped model (same random weights, bf16, transformers' static cache
and its compiled decoding step: inductor, mode="reduce-overhead", as `generate` compiles it):

- ``sdpa``: attn_implementation="sdpa" (transformers repeats K/V for GQA when a mask is given);
- ``sdpa_gqa``: `F.scaled_dot_product_attention` through our transformers function (GQA passed as
  ``enable_gqa``, K/V not repeated): the dispatcher's graph without the dispatcher;
- ``dispatch``: attn_implementation="attn_dispatch" (a fresh `Dispatcher()`).

It prints, per variant: the attention backend PyTorch picks for the decode call's shapes, the ATen
ops of the compiled decode graph where they differ (one extra compile with a graph-catching
backend), the decode tokens/s of whole `generate()` calls in interleaved rounds, and the time of
each decode step (one compiled step's CUDA-graph replay plus generate's per-token host work,
synchronised per token) pooled over those rounds. Ratios are variant / sdpa time (below 1: faster
than sdpa).

The three models share one compiled code object (transformers' forward): Dynamo keeps one cache
entry per model and rejects another model's entry at its first differing guard (the
implementation name), microseconds against milliseconds per step. `--tiny` only checks that the
script runs: its timings on a shared CPU mean nothing (steps of one variant varied 1-40 ms).

Usage (GPU, from the repository root; about 2-4 minutes with 8 layers):
    python -m bench.compiled_decode_ab [--layers 8 --prompt 512 --tokens 32 --rounds 6]
    python -m bench.compiled_decode_ab --tiny     # a CPU smoke run (no CUDA graphs)
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import statistics
import tempfile
import time
import types

import torch
import torch.nn.functional as F

VARIANTS = ("sdpa", "sdpa_gqa", "dispatch")
COPY_OPS = ("aten.clone.default", "aten.copy_.default", "aten._to_copy.default", "aten.expand.default")
TINY = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=256,
            vocab_size=256)
"""`--tiny`: a CPU-sized GQA model with the same head ratio structure, for a smoke run."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class StepClock:
    """A LogitsProcessor stamping each generated token (synchronised)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.stamps = device, []

    def __call__(self, input_ids, scores):
        _sync(self.device)
        self.stamps.append(time.perf_counter())
        return scores


class GraphCatcher:
    """A compile backend keeping the ATen forward graphs (transformers deep-copies it: shared)."""

    def __init__(self) -> None:
        self.graphs: list = []

    def __deepcopy__(self, memo):
        return self

    def __call__(self, graph_module, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        def keep(gm, inputs):
            self.graphs.append(gm)
            return gm.forward

        return aot_autograd(fw_compiler=keep)(graph_module, example_inputs)

    def ops(self) -> collections.Counter:
        return collections.Counter(str(n.target) for gm in self.graphs for n in gm.graph.nodes if n.op == "call_function")


def build(args, device):
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    import attn_dispatch as ad
    from attn_dispatch.dispatcher.hf import make_attention_function, register_transformers
    from bench.e2e import LLM

    ours = ad.Dispatcher()
    names = {"sdpa": "sdpa", "dispatch": register_transformers(dispatcher=ours), "sdpa_gqa": "sdpa_gqa"}
    AttentionInterface.register("sdpa_gqa", make_attention_function(types.SimpleNamespace(
        attention=F.scaled_dot_product_attention)))
    AttentionMaskInterface.register("sdpa_gqa", sdpa_mask)
    shape = TINY if args.tiny else LLM
    models = {}
    for variant in VARIANTS:
        config = LlamaConfig(**shape, num_hidden_layers=args.layers,
                             max_position_embeddings=args.prompt + args.tokens + 64)
        config._attn_implementation = names[variant]
        torch.manual_seed(0)
        with torch.device(device):
            models[variant] = LlamaForCausalLM(config).to(getattr(torch, args.dtype)).eval()
    return models, ours, shape


def backend_choice(shape, args, device, dtype) -> dict[str, str]:
    """The SDPA backend PyTorch picks for the decode call each variant makes (Lq 1 against a full
    static cache of prompt + tokens keys, a bool mask [B, 1, 1, S])."""
    heads, kv_heads, dim = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    keys = args.prompt + args.tokens
    query = torch.randn(args.batch, heads, 1, dim, device=device, dtype=dtype)
    kv = torch.randn(args.batch, kv_heads, keys, dim, device=device, dtype=dtype)
    repeated = kv.repeat_interleave(heads // kv_heads, dim=1)
    mask = torch.ones(args.batch, 1, 1, keys, device=device, dtype=torch.bool)
    names = {int(b): name for name, b in torch.nn.attention.SDPBackend.__members__.items()}
    try:
        mha = torch._fused_sdp_choice(query, repeated, repeated, mask, 0.0, False)
        gqa = torch._fused_sdp_choice(query, kv, kv, mask, 0.0, False, enable_gqa=True)
    except (AttributeError, TypeError, RuntimeError) as error:
        return {variant: f"unknown ({error})" for variant in VARIANTS}
    return {"sdpa": names.get(mha, mha), "sdpa_gqa": names.get(gqa, gqa), "dispatch": f"{names.get(gqa, gqa)} (if sdpa_default)"}


def generation(args):
    return dict(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, pad_token_id=0,
                eos_token_id=None, cache_implementation="static")


def graph_ops(models, args, prompt):
    from transformers.generation.configuration_utils import CompileConfig

    found = {}
    for variant, model in models.items():
        catcher = GraphCatcher()
        config = CompileConfig(backend=catcher, mode=None)
        config._compile_all_devices = True
        torch._dynamo.reset()
        with torch.no_grad():
            model.generate(prompt, compile_config=config, **{**generation(args), "max_new_tokens": 2,
                                                              "min_new_tokens": 2})
        found[variant] = catcher.ops()
        del model._compiled_call  # the timed runs compile afresh with transformers' default config
    torch._dynamo.reset()
    return found


def timed_generate(model, prompt, args, device) -> tuple[float, list[float]]:
    """Decode tokens/s of one `generate()` (first token excluded: prefill), and the time of each
    decode step (ms: one compiled step's replay plus generate's own host work per token)."""
    from transformers import LogitsProcessorList

    clock = StepClock(device)
    if device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()
    with torch.no_grad():
        model.generate(prompt, logits_processor=LogitsProcessorList([clock]), compile_config=args.compile_config,
                       **generation(args))
    _sync(device)
    end = time.perf_counter()
    steps = [(b - a) * 1e3 for a, b in itertools.pairwise(clock.stamps)]
    return (len(clock.stamps) - 1) * args.batch / (end - clock.stamps[0]), steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved generate() rounds per variant")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: a tiny model, compiled on the CPU")
    args = parser.parse_args()
    from transformers import __version__ as transformers_version
    from transformers.generation.configuration_utils import CompileConfig

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="compiled-decode-ab-")  # hits: this run's
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.layers, args.prompt, args.tokens, args.dtype = 2, 16, 8, "float32"
    args.compile_config = CompileConfig()  # transformers' default: inductor, reduce-overhead
    if device.type != "cuda":
        args.compile_config._compile_all_devices = True
    cudnn = torch.backends.cudnn.version() if device.type == "cuda" else None
    print(f"conditions: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"cuDNN {cudnn}, transformers {transformers_version}; {args.layers} layers, {args.dtype}, batch {args.batch}, "
          f"prompt {args.prompt}, {args.tokens} new tokens, static cache, compile {args.compile_config.to_dict()}")
    models, ours, shape = build(args, device)
    prompt = torch.randint(0, shape["vocab_size"], (args.batch, args.prompt), device=device,
                           generator=torch.Generator(device=device).manual_seed(1))

    print("\n1. SDPA backend PyTorch picks for each variant's decode call:")
    for variant, backend in backend_choice(shape, args, device, getattr(torch, args.dtype)).items():
        print(f"   {variant:9s} {backend}")

    print("\n2. Compiled decode graph, ATen ops (a graph-catching compile; counts over all layers):")
    ops = graph_ops(models, args, prompt)
    for variant in VARIANTS:
        attention = {op: n for op, n in ops[variant].items() if "attention" in op}
        copies = sum(ops[variant][op] for op in COPY_OPS)
        print(f"   {variant:9s} {sum(ops[variant].values())} ops, attention {attention}, copies/expands {copies}")
        if variant != "sdpa":
            extra, missing = ops[variant] - ops["sdpa"], ops["sdpa"] - ops[variant]
            print(f"             more than sdpa: {dict(extra)}\n             fewer than sdpa: {dict(missing)}")
    print(f"   dispatcher: {ours.stats()}")

    print(f"\n3. Warm-up (compiles each variant: {args.compile_config.mode}), then generate() interleaved, "
          f"{args.rounds} rounds:")
    for variant, model in models.items():
        before = dict(torch._dynamo.utils.counters["inductor"])
        timed_generate(model, prompt, args, device)  # compiles and records CUDA graphs
        after = torch._dynamo.utils.counters["inductor"]
        new = {key: after[key] - before.get(key, 0) for key in ("cudagraph_skips", "fxgraph_cache_hit",
                                                                   "fxgraph_cache_miss")}
        print(f"   {variant:9s} compiled; CUDA graphs skipped {new['cudagraph_skips']} times (0 expected on a GPU); "
              f"Inductor cache hits {new['fxgraph_cache_hit']}, misses {new['fxgraph_cache_miss']}")
    print("   (a fresh Inductor cache: a hit means the same post-grad graph as a variant compiled before it)")
    rates = {variant: [] for variant in VARIANTS}
    steps = {variant: [] for variant in VARIANTS}
    for round_ in range(args.rounds):
        order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            rate, step_ms = timed_generate(models[variant], prompt, args, device)
            rates[variant].append(rate)
            steps[variant].extend(step_ms[1:])  # the first decode step of a generate() may re-record
    base_rate, base_step = statistics.median(rates["sdpa"]), statistics.median(steps["sdpa"])
    print("   decode tokens/s per generate() (median; time ratio to sdpa; per-round ratios), then the median "
          "time of one decode step over all rounds:")
    for variant in VARIANTS:
        median = statistics.median(rates[variant])
        per_round = [f"{s / r:.2f}" for s, r in zip(rates["sdpa"], rates[variant], strict=True)]
        step = statistics.median(steps[variant])
        quartiles = statistics.quantiles(steps[variant], n=4)
        print(f"   {variant:9s} {median:8.1f} tokens/s, ratio {base_rate / median:.3f} ({', '.join(per_round)}); "
              f"step {step:.3f} ms (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}), ratio {step / base_step:.3f}")
    print(f"\n   dispatcher after the runs: {ours.stats()}")
    print("   Read: ratio > 1 is slower than sdpa. If 'sdpa_gqa' matches 'dispatch', the dispatcher adds nothing "
          "and any gap to 'sdpa' is PyTorch's backend for GQA with a mask (section 1).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
