"""Why is the dispatcher slower than PyTorch's SDPA on grid shapes where it makes PyTorch's own call?

Session 12's paired grid run (`llm_grid --paths pytorch,shipped --rounds 15`) kept PyTorch's call on
207 of 580 shapes, median 1.0105x PyTorch's time, but 62 of them more than 3% slower, with +2-4 us
on some 30-40 us calls where the C++ fast path costs +0.3-0.5 us. For the worst such shapes of a
recorded run this remakes the shipped dispatcher's plan and reports: the plan (kernel, SDPA flags,
settle point, recheck, unguardable), whether a hot entry with a C++ entry serves it, the share of
calls served in C++, and paired per-round ratios to PyTorch's call of `fast_attention` (what users
get) and of `attention` (the Python path).

    python -m bench.diagnostics.kept_default_overhead grid_parity.jsonl --shapes 12 --rounds 21
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

from attn_dispatch.calibration.inputs import make_inputs
from attn_dispatch.calibration.timer import calls_per_sample, time_batch
from attn_dispatch.dispatcher._plan import cache_key
from attn_dispatch.kernels import Problem
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from bench.llm_grid import paired_ratios

SERVED_CALLS = 100  # calls counted for the C++ share


def worst_kept(path: str, count: int) -> list[tuple[float, Problem]]:
    """The `count` shapes of a recorded run where `shipped` kept PyTorch's call and lost the most."""
    rows = [json.loads(line) for line in open(path)]
    kept = [(ratio, Problem.from_dict(row["problem"])) for row in rows if "problem" in row
            and row["chosen"].get("shipped") == "sdpa_default"
            and (ratio := paired_ratios(row, "shipped")) is not None]
    return sorted(kept, key=lambda item: -item[0])[:count]


def paired(calls: dict, rounds: int, device: torch.device) -> dict[str, float]:
    """Median over rounds of each call's time / ``pytorch``'s in the same round (order alternating)."""
    estimate = {}
    for name, call in calls.items():
        call()
        estimate[name] = time_batch(lambda _i, call=call: call(), 0, 3, device)
    samples = {name: [] for name in calls}
    names = list(calls)
    batch = calls_per_sample(min(estimate.values()))  # one batch size for all: `bench.llm_grid.measure_shape`
    for index in range(rounds):
        for name in names[index % len(names):] + names[: index % len(names)]:
            samples[name].append(time_batch(lambda _i, c=calls[name]: c(), 0, batch, device))
    base = samples["pytorch"]
    return {name: statistics.median(s / b for s, b in zip(values, base, strict=True))
            for name, values in samples.items() if name != "pytorch"} | {"pytorch_us": statistics.median(base) * 1e6}


def diagnose(recorded: float, problem: Problem, device: torch.device, rounds: int) -> str:
    import attn_dispatch as ad

    ours = ad.Dispatcher(measure=False)
    inputs = make_inputs(problem, device)
    q, k, v = inputs.query, inputs.key, inputs.value
    extra = {"enable_gqa": True} if inputs.enable_gqa else {}
    fast = ours.fast_attention
    calls = {"pytorch": lambda: pytorch_sdpa(q, k, v, is_causal=problem.causal, **extra),
             "fast_attention": lambda: fast(q, k, v, is_causal=problem.causal, **extra),
             "attention": lambda: ours.attention(q, k, v, is_causal=problem.causal, **extra)}
    for _ in range(3):
        calls["fast_attention"]()
    plan = ours._plans.get(cache_key(q, k, v, None, problem.causal, inputs.enable_gqa))
    hot = [entry for entry in ours._hot if entry.plan is plan]
    before = ours._fast.hits if ours._fast is not None else 0
    for _ in range(SERVED_CALLS):
        calls["fast_attention"]()
    served = (ours._fast.hits - before) if ours._fast is not None else 0
    ratios = paired(calls, rounds, device)
    described = (f"{plan.kernel.name} flags={plan.sdpa_flags} settle_at={plan.settle_at} recheck={plan.recheck} "
                 f"unguardable={plan.unguardable}" if plan is not None else "no plan")
    entry = (f"hot, C++ entry {'yes' if hot[0].fast is not None else 'no'}, pytorch_call={hot[0].pytorch_call}"
             if hot else "not hot")
    return (f"B{problem.batch} {problem.q_heads}/{problem.kv_heads} Lq{problem.q_len} Lk{problem.kv_len} "
            f"D{problem.head_dim} {problem.dtype}{' causal' if problem.causal else ''}: recorded {recorded:.3f}x; "
            f"now pytorch {ratios['pytorch_us']:.1f} us, fast_attention {ratios['fast_attention']:.3f}x, attention "
            f"{ratios['attention']:.3f}x; {described}; {entry}; served in C++ {served}/{SERVED_CALLS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", help="a recorded `bench.llm_grid --paths pytorch,shipped` run")
    parser.add_argument("--shapes", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    from attn_dispatch.dispatcher import fast_path

    print(f"fast path: {fast_path.status()}; torch {torch.__version__}")
    for recorded, problem in worst_kept(args.grid, args.shapes):
        print(diagnose(recorded, dataclasses.replace(problem, device_type=device.type), device, args.rounds), flush=True)


if __name__ == "__main__":
    main()
