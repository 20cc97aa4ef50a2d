"""Where `small_q`'s decode time goes, and which formulation of each stage is fastest on a GPU.

    python -m bench.small_q_variants --device cuda:0 --out small_q_variants.json

Times, side by side in one process on the issue's decode shape (B=1, 32 query heads, 8 KV heads,
D=128, fp16, Lk 32k and 128k, Lq 1/4/16):
- the whole kernels: `small_q[splits=P]` for every P, `sdpa_flash`, `sdpa_cudnn`, PyTorch's default;
- each stage of the current formulation (scaling the query, QK^T, softmax, the value product with
  and without splits, the split sum);
- alternative formulations of the two products: scores produced key-major (``K @ q^T``, so the
  per-split value product reads the probabilities through a free transpose instead of a copy),
  the scale folded into the product (`baddbmm`), and a one-launch split sum.

Each number is the median of `SAMPLES` samples of `CALLS` back-to-back calls between CUDA events
(K and V are hundreds of MB, far above the 60 MB L2, so no input rotation is needed), after a
warm-up; the spread is IQR / median. Exploratory: the chosen formulation lives in
`kernels/_single_pass.py`, this script is the evidence for it.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import kernel_from_name

SAMPLES, CALLS, WARMUP = 15, 10, 5
SPLITS = (1, 2, 4, 8, 16, 32, 64)


def time_ms(fn, device: torch.device) -> dict:
    """Median and relative IQR of `fn()` in ms, `CALLS` back-to-back calls per sample."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize(device)
    samples = []
    for _ in range(SAMPLES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALLS):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / CALLS)
    samples.sort()
    median = statistics.median(samples)
    iqr = samples[3 * len(samples) // 4] - samples[len(samples) // 4]
    return {"ms": median, "spread": iqr / median}


def stage_variants(q, k, v, splits_list) -> dict:
    """Callables for each stage and each end-to-end alternative, on ``q [1, Hq, L, D]``,
    ``k, v [1, Hkv, S, D]``."""
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = D ** -0.5
    q3 = q.reshape(B * Hkv, G * L, D)  # rows grouped by KV head (contiguous query)
    k3, v3 = k.reshape(B * Hkv, S, D), v.reshape(B * Hkv, S, D)
    rows = q3 * scale
    scores = torch.bmm(rows, k3.transpose(1, 2))  # [BH, R, S]
    probs = torch.softmax(scores, dim=-1)
    scores_km = torch.bmm(k3, rows.transpose(1, 2))  # [BH, S, R]
    probs_km = torch.softmax(scores_km, dim=1)
    out = {}
    out["stage.scale_query"] = lambda: q3 * scale
    out["stage.qk_bmm"] = lambda: torch.bmm(rows, k3.transpose(1, 2))
    out["stage.qk_baddbmm_scaled"] = lambda: torch.baddbmm(scores, q3, k3.transpose(1, 2), beta=0.0, alpha=scale)
    out["stage.qk_keymajor"] = lambda: torch.bmm(k3, rows.transpose(1, 2))
    out["stage.softmax_last"] = lambda: torch.softmax(scores, dim=-1)
    out["stage.safe_softmax_last"] = lambda: torch.ops.aten._safe_softmax(scores, -1)
    out["stage.softmax_keymajor_dim1"] = lambda: torch.softmax(scores_km, dim=1)
    out["stage.pv_bmm"] = lambda: torch.bmm(probs, v3)
    out["stage.pv_keymajor_bmm"] = lambda: torch.bmm(probs_km.transpose(1, 2), v3)
    for P in splits_list:
        if P == 1 or S % P:
            continue
        C = S // P
        per_split = probs.view(-1, G * L, P, C).transpose(1, 2)  # [BH, P, R, C], strided
        v4 = v3.view(-1, P, C, D)
        out[f"stage.pv_split{P}_copy"] = lambda ps=per_split, v4=v4: torch.matmul(ps, v4)
        per_split_km = probs_km.view(-1, P, C, G * L).transpose(2, 3)  # [BH, P, R, C], free
        out[f"stage.pv_split{P}_keymajor"] = lambda ps=per_split_km, v4=v4: torch.matmul(ps, v4)
        partial = torch.matmul(per_split_km, v4)
        out[f"stage.sum{P}_fp32_cast"] = lambda p=partial: p.sum(dim=1, dtype=torch.float32).to(p.dtype)
        out[f"stage.sum{P}_native"] = lambda p=partial: p.sum(dim=1)

        def keymajor(P=P, C=C, v4=v4):
            r = q3 * scale
            s = torch.bmm(k3, r.transpose(1, 2))
            p = torch.softmax(s, dim=1)
            return torch.matmul(p.view(-1, P, C, G * L).transpose(2, 3), v4).sum(dim=1)

        def rowmajor_native_sum(P=P, C=C, v4=v4):
            r = q3 * scale
            s = torch.bmm(r, k3.transpose(1, 2))
            p = torch.softmax(s, dim=-1)
            return torch.matmul(p.view(-1, G * L, P, C).transpose(1, 2), v4).sum(dim=1)

        out[f"e2e.keymajor_split{P}"] = keymajor
        out[f"e2e.rowmajor_split{P}_native_sum"] = rowmajor_native_sum

    def keymajor_nosplit():
        s = torch.bmm(k3, (q3 * scale).transpose(1, 2))
        return torch.bmm(torch.softmax(s, dim=1).transpose(1, 2), v3)

    def baddbmm_nosplit():
        s = torch.baddbmm(q3.new_zeros(()), q3, k3.transpose(1, 2), beta=0.0, alpha=scale)
        return torch.bmm(torch.softmax(s, dim=-1), v3)

    out["e2e.keymajor_nosplit"] = keymajor_nosplit
    out["e2e.baddbmm_nosplit"] = baddbmm_nosplit
    return out


def measure_shape(L: int, S: int, kernels: list[str], device: torch.device) -> dict:
    """Every kernel and stage variant on the decode shape with `L` queries and `S` keys."""
    q = torch.randn(1, 32, L, 128, device=device, dtype=torch.float16)
    k = torch.randn(1, 8, S, 128, device=device, dtype=torch.float16)
    v = torch.randn(1, 8, S, 128, device=device, dtype=torch.float16)
    problem = Problem.from_tensors(q, k, v, enable_gqa=True)
    row = {"q_len": L, "kv_len": S, "kv_bytes": 2 * k.numel() * k.element_size(), "times": {}}
    for name in kernels:
        kernel = kernel_from_name(name)
        try:
            kernel(q, k, v, enable_gqa=True)  # validates and probes once
            row["times"][name] = time_ms(lambda kernel=kernel: kernel.run(q, k, v, None, None, True, problem), device)
        except Exception as error:  # noqa: BLE001 - an exploratory table records every failure
            row["times"][name] = {"error": f"{type(error).__name__}: {error}"[:200]}
    for name, fn in stage_variants(q, k, v, SPLITS).items():
        row["times"][name] = time_ms(fn, device)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", required=True)
    parser.add_argument("--kv-lens", default="32768,131072")
    parser.add_argument("--q-lens", default="1,4,16")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    results = {"conditions": {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                              "samples": SAMPLES, "calls_per_sample": CALLS, "warmup": WARMUP}, "shapes": []}
    kernels = [f"small_q[splits={p}]" for p in SPLITS] + ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_default"]
    for S in (int(x) for x in args.kv_lens.split(",")):
        for L in (int(x) for x in args.q_lens.split(",")):
            row = measure_shape(L, S, kernels, device)
            results["shapes"].append(row)
            best = sorted((t["ms"], n) for n, t in row["times"].items() if "ms" in t and not n.startswith("stage."))
            print(f"L={L} S={S}: " + ", ".join(f"{n} {ms:.4f}" for ms, n in best[:8]), flush=True)
            torch.cuda.empty_cache()
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
