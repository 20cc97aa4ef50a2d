"""The Triton kernels' prior (`models.triton_costs`) against measured times on this GPU: the numbers
that replace its placeholders.

    python -m bench.triton_prior_check --out bench/results/triton_prior_check_h200.json

For each of issue 32's shapes (fp16 and bf16), times PyTorch's flash backend, PyTorch's default and
the Triton kernels' default configurations with calibration's trusted timer
(`calibration.measure`: warm-up, rotated inputs, numerics gate; a config that fails is recorded
with its error), and prints beside each the prior's prediction (without the factor that keeps
PyTorch's own choice: `models.priors.FORCED_BACKEND_FACTOR`). The last lines give what the
placeholders should be on this card: the median of triton_flash's time over flash's (for
`TRITON_FLASH_TIME_VS_FLASH`), and triton_decode's streaming rate as a fraction of the card's
datasheet bandwidth (for its decode efficiency).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

import torch

from attn_dispatch.calibration.measure import measure
from attn_dispatch.calibration.timer import QUICK
from attn_dispatch.kernels import Problem, kernel_from_name
from attn_dispatch.kernels.registry import DEFAULT_TRITON_DECODE, DEFAULT_TRITON_FLASH
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.priors import spec_for
from attn_dispatch.models.triton_costs import triton_decode_seconds, triton_flash_seconds

PREFILL = {  # issue 32's prefill and DiT shapes (batch 1)
    "wan_480p": (40, 40, 32760, 32760, 128, False),
    "cogvideox": (48, 48, 17776, 17776, 64, False),
    "prefill_32k_causal_gqa": (32, 4, 32768, 32768, 128, True),
    "fill_2k_on_100k": (32, 8, 2048, 100000, 128, False),
}
DECODE = {  # issue 32's decode shapes: GQA 32/8, D128
    "decode_b1_8k": (1, 8192), "decode_b1_32k": (1, 32768), "decode_b1_131k": (1, 131072),
    "decode_b8_8k": (8, 8192), "decode_b8_32k": (8, 32768), "decode_b8_131k": (8, 131072),
}


def problems(dtype: str) -> dict[str, Problem]:
    out = {name: Problem(1, hq, hkv, lq, lk, d, d, dtype, causal=causal, device_type="cuda")
           for name, (hq, hkv, lq, lk, d, causal) in PREFILL.items()}
    out.update({name: Problem(b, 32, 8, 1, lk, 128, 128, dtype, device_type="cuda") for name, (b, lk) in DECODE.items()})
    return out


def predicted(problem: Problem, name: str, spec) -> float | None:
    kernel = kernel_from_name(name)
    if name.startswith("triton_flash"):
        return triton_flash_seconds(problem, kernel, spec)
    if name.startswith("triton_decode"):
        return triton_decode_seconds(problem, kernel, spec)
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="JSON file for every row")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    spec = spec_for(DeviceIdentity.detect(device))
    names = ["sdpa_flash", "sdpa_default", *(k.name for k in DEFAULT_TRITON_FLASH), *(k.name for k in DEFAULT_TRITON_DECODE)]
    rows, flash_ratios, stream_fractions = [], [], []
    for dtype in ("float16", "bfloat16"):
        for label, problem in problems(dtype).items():
            timed = {}
            for name in names:
                kernel = kernel_from_name(name)
                if kernel.reasons(problem):
                    continue
                point = measure(kernel, problem, device, settings=replace(QUICK, budget_s=2.0), device_key=spec.name)
                guess = predicted(problem, name, spec)
                timed[name] = point.median_s if point.ok else None
                rows.append({"shape": label, "dtype": dtype, "kernel": name, "status": point.status,
                             "reason": point.reason, "measured_s": timed[name], "predicted_s": guess})
                shown = f"{point.median_s * 1e3:9.3f} ms" if point.ok else f"{point.status}: {point.reason[:60]}"
                print(f"{label:24} {dtype:9} {name:40} {shown}" + (f"  prior {guess * 1e3:9.3f} ms" if guess else ""))
            flash = timed.get("sdpa_flash")
            ours = [timed.get(k.name) for k in DEFAULT_TRITON_FLASH]
            if flash and any(ours) and problem.q_len > 1:
                flash_ratios.append(min(t for t in ours if t) / flash)
            decode = [timed.get(k.name) for k in DEFAULT_TRITON_DECODE]
            if problem.q_len == 1 and any(decode):
                stream_fractions.append(problem.kv_bytes / min(t for t in decode if t) / spec.bandwidth)
    if flash_ratios:
        print(f"triton_flash time / flash time: median {statistics.median(flash_ratios):.3f} over {len(flash_ratios)} "
              "shapes (models.triton_costs.TRITON_FLASH_TIME_VS_FLASH)")
    if stream_fractions:
        print(f"triton_decode K/V bytes per second / datasheet bandwidth: median {statistics.median(stream_fractions):.3f} "
              f"over {len(stream_fractions)} shapes")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"card": spec.name, "rows": rows, "flash_ratios": flash_ratios,
                       "stream_fractions": stream_fractions}, handle, indent=1)


if __name__ == "__main__":
    main()
