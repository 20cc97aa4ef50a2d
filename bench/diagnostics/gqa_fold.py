"""Why is PyTorch's default SDPA 1.5-1.9x slower than our `sdpa_cudnn` on batch-4 GQA shapes with few
query rows (40 query / 8 K/V heads, Lq 4-34, non-causal, no mask)?

Hypothesis: our kernel folds a group's query heads into rows (q [B, Hkv*G, L, D] -> [B, Hkv, G*L, D]:
`SdpaBackendKernel._gqa_mode` 'fold'), reading K/V once per K/V head; PyTorch's choice reads them once
per query head. Per shape: `torch._fused_sdp_choice`, the default's time, paired per-round ratios to it
of the forced backends with native GQA, the fold by hand, K/V repeated (before the timing: the cost of
40 full K/V heads, not of the copy) and our kernel as the dispatcher runs it; the CUDA kernels launched.

    python -m bench.diagnostics.gqa_fold --device cuda --rounds 15 [--out gqa_fold.json]
    python -m bench.diagnostics.gqa_fold --device cpu --small --rounds 3   # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from attn_dispatch.calibration.timer import calls_per_sample, time_batch
from attn_dispatch.kernels import Problem
from attn_dispatch.kernels.sdpa_backends import SdpaCudnnKernel, pytorch_sdpa
from attn_dispatch.kernels.sdpa_probe import SDP_BACKEND_FAMILIES
from attn_dispatch.kernels.tolerances import TOLERANCES

# (batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype). The first five: B4 40/8 shapes where
# bench/results/h200_session14/run2_heldout_seed4.jsonl had `pytorch` 1.54-1.90x `kernel:sdpa_cudnn`.
WORST = [(4, 40, 8, 4, 13113, 256, "float16"), (4, 40, 8, 10, 15824, 256, "float16"),
         (4, 40, 8, 7, 34417, 128, "bfloat16"), (4, 40, 8, 4, 41772, 96, "float16"),
         (4, 40, 8, 30, 2957, 64, "bfloat16")]
# Controls: the same at batch 1; GQA 4 instead of 5; many query rows (1.14x in the same run).
SHAPES = WORST + [(1, *shape[1:]) for shape in WORST] + [
    (4, 32, 8, 7, 34417, 128, "bfloat16"), (4, 40, 8, 549, 37411, 64, "float16")]
SMALL_KV_DIVISOR = 64  # --small: Lk / 64, so that the CPU smoke run takes seconds
ESTIMATE_CALLS = 3  # calls of the per-path estimate that sizes the batch (as kept_default_overhead)
KERNEL_NAMES, NAME_CHARS = 2, 80  # CUDA kernels listed per profiled call, characters kept of each
FORCED = {"cudnn_native": SDPBackend.CUDNN_ATTENTION, "flash_native": SDPBackend.FLASH_ATTENTION,
          "efficient_native": SDPBackend.EFFICIENT_ATTENTION}


def make_calls(q, k, v, problem: Problem) -> tuple[dict, dict, str]:
    """label -> ``() -> tensor`` for every path; failures of the paths' first calls; our GQA mode."""
    b, hkv, g, length, d = problem.batch, problem.kv_heads, problem.gqa_ratio, problem.q_len, problem.head_dim
    k_rep, v_rep = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    calls = {"default": lambda: pytorch_sdpa(q, k, v, enable_gqa=True),
             "default_folded": lambda: pytorch_sdpa(q.reshape(b, hkv, g * length, d), k, v).reshape(q.shape),
             "default_repeated": lambda: pytorch_sdpa(q, k_rep, v_rep)}

    def forced(backend):
        with sdpa_kernel(backend):  # per call: its host time (tens of us) shows only on shorter calls
            return pytorch_sdpa(q, k, v, enable_gqa=True)

    calls |= {label: lambda backend=backend: forced(backend) for label, backend in FORCED.items()}
    ours, failed = SdpaCudnnKernel(), {}
    if reasons := ours.reasons(problem):
        failed["ours_cudnn"] = "refused: " + "; ".join(reasons)
    else:
        run = ours.runner(problem)  # as bench/llm_grid.py's `kernel:sdpa_cudnn` path
        calls["ours_cudnn"] = lambda: run(q, k, v, None, None, True, problem)
    for label, call in list(calls.items()):
        try:
            call()
        except Exception as error:  # noqa: BLE001 - a refused path is recorded, not fatal
            failed[label] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
            del calls[label]
    return calls, failed, ours._gqa_mode(problem)


def paired(calls: dict, rounds: int, device: torch.device) -> dict:
    """`kept_default_overhead.paired` with quartiles: per path the median and quartiles over rounds of
    its time / ``default``'s in the same round (order rotated each round, one batch size for all)."""
    estimate = {name: time_batch(lambda _i, c=call: c(), 0, ESTIMATE_CALLS, device) for name, call in calls.items()}
    batch = calls_per_sample(min(estimate.values()))
    names, samples = list(calls), {name: [] for name in calls}
    for index in range(rounds):
        for name in names[index % len(names):] + names[: index % len(names)]:
            samples[name].append(time_batch(lambda _i, c=calls[name]: c(), 0, batch, device))
    base = samples["default"]
    ratios = {}
    for name, values in samples.items():
        per_round = [s / b for s, b in zip(values, base, strict=True)]
        q1, _, q3 = statistics.quantiles(per_round, n=4, method="inclusive") if rounds > 1 else per_round * 3
        ratios[name] = {"median": statistics.median(per_round), "q1": q1, "q3": q3}
    return {"default_us": statistics.median(base) * 1e6, "batch": batch, "ratios": ratios}


def cuda_kernels(call) -> list[str]:
    """The first CUDA kernels one call launches, in launch order."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    return [e.name[:NAME_CHARS] for e in events[:KERNEL_NAMES]]


def random_inputs(shape: tuple, device: torch.device, small: bool):
    """Seeded q, k, v for `shape` (batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype; Lk /
    `SMALL_KV_DIVISOR` when `small`) and their `Problem` (GQA, no mask, not causal)."""
    b, hq, hkv, length, kv_len, d, dtype = shape
    kv_len = max(1, kv_len // SMALL_KV_DIVISOR) if small else kv_len
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=getattr(torch, dtype))
               for h, n in ((hq, length), (hkv, kv_len), (hkv, kv_len)))
    return q, k, v, Problem.from_tensors(q, k, v, None, False, enable_gqa=True)


def diagnose(shape: tuple, device: torch.device, rounds: int, small: bool) -> dict:
    """One shape's JSON row: PyTorch's choice, our GQA mode, the fold's check, timings, kernel names."""
    q, k, v, problem = random_inputs(shape, device, small)
    b, hq, hkv, length, kv_len, d, dtype = (*shape[:4], problem.kv_len, *shape[5:])
    try:
        choice = SDP_BACKEND_FAMILIES.get(int(torch._fused_sdp_choice(q, k, v, None, 0.0, False, enable_gqa=True)))
    except Exception as error:  # noqa: BLE001
        choice = f"{type(error).__name__}"
    calls, failed, mode = make_calls(q, k, v, problem)
    reference = calls["default"]().float()
    diff = (calls["default_folded"]().float() - reference).abs().max().item()
    limit = TOLERANCES[dtype].relative_max * reference.abs().max().item()  # as the backend probes judge
    if not diff <= limit:
        raise AssertionError(f"{shape}: the folded call differs from the default by {diff:.3g} > {limit:.3g}")
    row = {"shape": dict(zip(("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype"),
                             (b, hq, hkv, length, kv_len, d, dtype), strict=True)),
           "fused_sdp_choice": choice, "ours_gqa_mode": mode, "folded_max_abs_diff": diff, "failed": failed}
    row |= paired(calls, rounds, device)
    if device.type == "cuda":  # the profiler's names are CUDA kernels: none on CPU
        try:
            row["cuda_kernels"] = {label: cuda_kernels(calls[label]) for label in ("default", "default_folded")}
        except Exception as error:  # noqa: BLE001 - no CUPTI: the timings still stand
            row["failed"]["cuda_kernels"] = f"{type(error).__name__}: {error}"[:200]
    return row


def show(row: dict) -> None:
    """Print one shape's row as a readable block."""
    s = row["shape"]
    print(f"B{s['batch']} {s['q_heads']}/{s['kv_heads']} Lq{s['q_len']} Lk{s['kv_len']} D{s['head_dim']} {s['dtype']}: "
          f"choice {row['fused_sdp_choice']}, default {row['default_us']:.1f} us (batch {row['batch']}), "
          f"ours_cudnn mode {row['ours_gqa_mode']}, folded max |diff| {row['folded_max_abs_diff']:.2e}")
    for label, r in row["ratios"].items():
        if label != "default":
            print(f"    {label:<17} {r['median']:6.3f}x  [{r['q1']:.3f} - {r['q3']:.3f}]")
    for label, error in row["failed"].items():
        print(f"    {label:<17} failed: {error}")
    for label, names in row.get("cuda_kernels", {}).items():
        print(f"    kernels of {label}: {names}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--small", action="store_true", help=f"Lk / {SMALL_KV_DIVISOR} (smoke runs)")
    parser.add_argument("--out", help="JSON file for all numbers")
    args = parser.parse_args()
    device = torch.device(args.device)
    info = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "rounds": args.rounds, "small": args.small}
    print(f"device {info['device']}; torch {info['torch']}; rounds {args.rounds}; ratios: paired median "
          f"[quartiles] of path / default per round{f'; Lk / {SMALL_KV_DIVISOR}' if args.small else ''}")
    rows = []
    for shape in SHAPES:
        rows.append(diagnose(shape, device, args.rounds, args.small))
        show(rows[-1])
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"conditions": info, "shapes": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
