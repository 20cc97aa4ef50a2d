"""Kernel benchmark on a GPU: the kernel-library issue's suites, every kernel side by side.

    python -m bench.kernels --device cuda --out bench/results/kernels_h200.jsonl --md bench/results/kernels_h200.md

Suites (`h200_suites`): decode (Lq=1, Lk 4k-128k, 32 heads, 8 KV heads,
D=128), small-Q (Lq 4-64, Lk 32k), prefill (Lq=Lk 512-16k, causal), long non-causal (32k x 32k,
16 heads, D=64), each in fp16, bf16 and fp32. Lossy conversions are allowed so their speed and
error are on record. Also measures the device-to-device copy bandwidth, the floor for decode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence

import torch

from attn_dispatch.calibration.measure import NamedShape, format_table, named_shape, run_kernel_table
from attn_dispatch.calibration.timer import TimerSettings

COPY_BYTES = 2 * 2**30  # large enough to dwarf the 60 MB L2 of an H200
COPY_REPS = 20


def h200_suites(dtypes: Sequence[str] = ("float16", "bfloat16", "float32")) -> list[NamedShape]:
    """The shapes of the kernel-library issue: decode (Lq=1, Lk 4k-128k, 32 heads, 8 KV heads,
    D=128), small-Q (Lq 4-64, Lk 32k), prefill (Lq=Lk 512-16k, causal), long non-causal
    (32k x 32k, 16 heads, D=64)."""
    shapes = []
    for dtype in dtypes:
        for kv_len in (4096, 16384, 32768, 131072):
            shapes.append(named_shape("decode", 1, 32, 8, 1, kv_len, 128, dtype, device_type="cuda"))
        for q_len in (4, 16, 64):
            shapes.append(named_shape("small-q", 1, 32, 8, q_len, 32768, 128, dtype, device_type="cuda"))
        for length in (512, 4096, 16384):
            shapes.append(named_shape("prefill", 1, 32, 8, length, length, 128, dtype, causal=True, device_type="cuda"))
        shapes.append(named_shape("long", 1, 16, 16, 32768, 32768, 64, dtype, device_type="cuda"))
    return shapes


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read plus bytes written."""
    source = torch.empty(COPY_BYTES // 2, dtype=torch.float16, device=device).normal_()
    target = torch.empty_like(source)
    target.copy_(source)
    samples = []
    for _ in range(COPY_REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return 2 * source.numel() * source.element_size() / statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True, help="JSON Lines of every measurement")
    parser.add_argument("--md", required=True, help="markdown table")
    parser.add_argument("--dtypes", default="float16,bfloat16,float32")
    parser.add_argument("--suites", default="decode,small-q,prefill,long")
    args = parser.parse_args()
    device = torch.device(args.device)
    bandwidth = copy_bandwidth(device)
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s (read + write)", flush=True)
    free = torch.cuda.mem_get_info(device)[0]
    shapes = [s for s in h200_suites(args.dtypes.split(",")) if s.suite in args.suites.split(",")]
    started = time.time()
    with open(args.out, "w") as sink:
        sink.write(json.dumps({"copy_bandwidth_Bps": bandwidth, "torch": torch.__version__,
                               "device": torch.cuda.get_device_name(device)}) + "\n")

        def progress(record):
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            print(f"[{time.time() - started:6.0f}s] {record['shape']} {record['kernel']} {record['status']} "
                  f"{record['median_s'] if record['median_s'] is None else round(record['median_s'] * 1e3, 4)} ms", flush=True)

        _, records = run_kernel_table(device, shapes, settings=TimerSettings(budget_s=0.5), memory_budget=int(free * 0.9), progress=progress)
    with open(args.md, "w") as handle:
        handle.write(f"Copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)\n\n")
        handle.write(format_table(records, device) + "\n")


if __name__ == "__main__":
    main()
