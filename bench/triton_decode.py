"""Decode kernels against PyTorch's flash backend: `triton_decode` configs, `small_q`, PyTorch's default.

    python -m bench.triton_decode --out triton_decode_h200.json             # GPU, ~3-4 min on an H200
    python -m bench.triton_decode --quick --out triton_decode_quick.json    # B1 8k and B8 32k only
    python -m bench.triton_decode --fold                                    # sdpa_gqa_fold on the CPU

GPU: decode (Lq 1) at B1 and B8, 8k/32k/131k keys, 32 query / 8 K/V heads, D128, fp16 and bf16.
Per shape: PyTorch's flash backend (inside ``sdpa_kernel(FLASH_ATTENTION)``, ``enable_gqa``),
PyTorch's default, `small_q`, the registry's `triton_decode` defaults and a sweep of configs (splits
x key block at 4 warps and 2 stages, then warps x stages around the best pair). Each path is timed
as GPU time per call: calls captured in a CUDA graph and replayed, with inputs rotated through
enough copies of K/V to leave the L2 cache cold (these calls are too short for eager timing to
show anything but host overhead); the eager time per call (host included) is recorded too for
flash, the default and the best config. Outputs are checked against flash (relative L2). The
table gives each path's time over flash's and over the time to read K and V once at the measured
device-to-device copy bandwidth (bytes read plus written). A config that fails to compile or run
is recorded with its error.

CPU (``--fold``): `sdpa_gqa_fold` against PyTorch's own ``enable_gqa=True`` call at B1, 8 query /
2 K/V heads, Lq 1, 1700 keys, D64, fp32 (issue 32's shape): median and quartiles over interleaved
rounds of calls, each path's ratio to PyTorch's paired per round; the fold as its runner and through
a dispatcher limited to it (its Python path and its C++ fast path, where built), PyTorch's call
timed twice (an A/A control), one SDPA call on rows folded ahead of time (the floor: what any
fold pays) and SDPA on rows folded per call (the runner before it called the CPU kernel's operator),
with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F

from attn_dispatch.kernels import Problem, SmallQKernel, TritonDecodeKernel, relative_errors
from attn_dispatch.kernels.accuracy import TOLERANCES
from attn_dispatch.kernels.registry import DEFAULT_TRITON_DECODE

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
SHAPES = [(batch, kv_len) for batch in (1, 8) for kv_len in (8192, 32768, 131072)]
QUICK_SHAPES = [(1, 8192), (8, 32768)]
DTYPES = ("float16", "bfloat16")
SPLITS = (8, 16, 32, 64, 128)
BLOCK_KEYS = (32, 64, 128)
WARPS = (2, 4, 8)
STAGES = (1, 2, 3)
FIRST_WARPS, FIRST_STAGES = 4, 2  # the splits x key-block sweep runs at these
SMALL_Q_SPLITS = 16
COLD_BYTES = 512 * 2**20
"""K/V bytes the rotated copies add up to at least: 10x an H200's 50 MiB L2, so no call finds its
K/V in cache from an earlier one."""
MAX_COPY_BYTES = 24 * 2**30  # never more K/V copies than this
GRAPH_SECONDS = 0.004  # GPU time one graph replay aims at: long against the replay's own launch
REPLAYS = 7
EAGER_REPS = 50
COPY_BYTES = 2 * 2**30
TARGET_FLASH_RATIO, TARGET_READ_RATIO = 1.3, 1.5  # issue 32's decode targets

FOLD_SHAPE = (1, 8, 2, 1, 1700, 64)  # batch, query heads, K/V heads, Lq, keys, head dim (issue 32)
FOLD_CALLS, FOLD_ROUNDS, FOLD_WARMUP = 200, 40, 200


# ---------------------------------------------------------------------- timing
def graph_seconds(call, copies: int, estimate: float) -> float:
    """GPU seconds per call of ``call(i)`` (``i`` picks the input copy): as many calls as fill
    `GRAPH_SECONDS` (at least one per copy) captured in one CUDA graph, median of replays."""
    calls = max(copies, math.ceil(GRAPH_SECONDS / max(estimate, 1e-7)))
    calls = min(calls, 4000)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for index in range(min(calls, copies)):
            call(index)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for index in range(calls):
            call(index % copies)
    graph.replay()
    samples = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / calls)
    del graph
    return statistics.median(samples)


def eager_seconds(call, copies: int) -> float:
    """Seconds per call of eager calls back to back (host time included), median of batches."""
    samples = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for index in range(EAGER_REPS):
            call(index % copies)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / EAGER_REPS)
    return statistics.median(samples)


def copy_bandwidth() -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read plus bytes written."""
    source = torch.empty(COPY_BYTES // 2, dtype=torch.float16, device="cuda").normal_()
    target = torch.empty_like(source)
    seconds = graph_seconds(lambda _i: target.copy_(source), 1, 1e-3)
    return 2 * source.numel() * source.element_size() / seconds


# ---------------------------------------------------------------------- one shape
def make_inputs(batch: int, kv_len: int, dtype: torch.dtype) -> tuple[list, Problem, int]:
    """Copies of (query, key, value) rotated through to keep the L2 cold, their `Problem`, and the
    K/V bytes of one copy."""
    kv_bytes = 2 * batch * KV_HEADS * kv_len * HEAD_DIM * torch.tensor([], dtype=dtype).element_size()
    copies = max(1, min(math.ceil(COLD_BYTES / kv_bytes), MAX_COPY_BYTES // kv_bytes))
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [tuple(torch.randn(batch, heads, length, HEAD_DIM, device="cuda", dtype=dtype, generator=generator)
                    for heads, length in ((HEADS, 1), (KV_HEADS, kv_len), (KV_HEADS, kv_len)))
              for _ in range(copies)]
    return inputs, Problem.from_tensors(*inputs[0], enable_gqa=True), kv_bytes


def sweep_configs() -> list[TritonDecodeKernel]:
    """The registry's defaults and splits x key block at `FIRST_WARPS`, `FIRST_STAGES`."""
    kernels = list(DEFAULT_TRITON_DECODE)
    kernels += [TritonDecodeKernel(splits=splits, bn=bn, w=FIRST_WARPS, s=FIRST_STAGES)
                for splits in SPLITS for bn in BLOCK_KEYS]
    return list(dict.fromkeys(kernels))


def time_path(label: str, call, inputs, reference, dtype: str, results: dict, *, eager: bool = False) -> None:
    """Time one path into ``results[label]``: GPU seconds per call, its error against flash, or the
    error that stopped it."""
    copies = len(inputs)
    try:
        out = call(0)
        torch.cuda.synchronize()
        rel_l2, _ = relative_errors(out, reference) if reference is not None else (0.0, 0.0)
        start = time.perf_counter()
        call(0)
        torch.cuda.synchronize()
        row = {"seconds": graph_seconds(call, copies, time.perf_counter() - start), "rel_l2_vs_flash": rel_l2,
               "accurate": rel_l2 <= TOLERANCES[dtype].relative_l2}
        if eager:
            row["eager_seconds"] = eager_seconds(call, copies)
        results[label] = row
    except Exception as error:  # noqa: BLE001 - a config that cannot compile or run is a result
        results[label] = {"failed": f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"}
        torch.cuda.synchronize()


def kernel_call(kernel, inputs, problem):
    if kernel.reasons(problem):
        reasons = "; ".join(kernel.reasons(problem))

        def refused(_index):
            raise RuntimeError(f"refused: {reasons}")

        return refused
    run = kernel.runner(problem)
    return lambda index: run(*inputs[index], None, None, True, problem)


def bench_shape(batch: int, kv_len: int, dtype_name: str, bandwidth: float) -> dict:
    """Every path on one shape, with the sweep's best config and the ratios of the table."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = getattr(torch, dtype_name)
    inputs, problem, kv_bytes = make_inputs(batch, kv_len, dtype)
    results: dict[str, dict] = {}
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = lambda i: F.scaled_dot_product_attention(*inputs[i], enable_gqa=True)  # noqa: E731
        reference = flash(0).float()
        time_path("flash", flash, inputs, reference, dtype_name, results, eager=True)
    default = lambda i: F.scaled_dot_product_attention(*inputs[i], enable_gqa=True)  # noqa: E731
    time_path("pytorch_default", default, inputs, reference, dtype_name, results, eager=True)
    small_q = SmallQKernel(splits=SMALL_Q_SPLITS)
    time_path(small_q.name, kernel_call(small_q, inputs, problem), inputs, reference, dtype_name, results)
    for kernel in sweep_configs():
        time_path(kernel.name, kernel_call(kernel, inputs, problem), inputs, reference, dtype_name, results)
    best = _best_triton(results)
    if best is not None:  # warps x stages around the best splits x key block
        for warps in WARPS:
            for stages in STAGES:
                kernel = TritonDecodeKernel(splits=best.splits, bn=best.block_n, w=warps, s=stages)
                if kernel.name not in results:
                    time_path(kernel.name, kernel_call(kernel, inputs, problem), inputs, reference, dtype_name, results)
        best = _best_triton(results)
        time_path(best.name, kernel_call(best, inputs, problem), inputs, reference, dtype_name, results, eager=True)
    read_seconds = kv_bytes / (bandwidth / 2)  # the copy's bandwidth counts bytes read and written
    flash_seconds = results["flash"].get("seconds")
    for row in results.values():
        if "seconds" in row:
            row["vs_flash"] = row["seconds"] / flash_seconds if flash_seconds else math.nan
            row["vs_kv_read"] = row["seconds"] / read_seconds
    inputs.clear()  # the copies go before the next shape allocates its own
    torch.cuda.empty_cache()
    return {"batch": batch, "q_heads": HEADS, "kv_heads": KV_HEADS, "q_len": 1, "kv_len": kv_len, "head_dim": HEAD_DIM,
            "dtype": dtype_name, "kv_bytes": kv_bytes, "kv_read_seconds": read_seconds,
            "best_triton": best.name if best else None, "paths": results}


def _best_triton(results: dict) -> TritonDecodeKernel | None:
    from attn_dispatch.kernels import kernel_from_name

    timed = [(row["seconds"], name) for name, row in results.items()
             if name.startswith("triton_decode") and "seconds" in row and row["accurate"]]
    return kernel_from_name(min(timed)[1]) if timed else None


def show_shape(row: dict) -> None:
    paths = row["paths"]
    best = row["best_triton"]
    print(f"B{row['batch']} {row['q_heads']}/{row['kv_heads']} Lk{row['kv_len']} D{row['head_dim']} {row['dtype']}: "
          f"K/V read {row['kv_read_seconds'] * 1e6:.1f} us")
    shown = ["flash", "pytorch_default", f"small_q[splits={SMALL_Q_SPLITS}]", *(k.name for k in DEFAULT_TRITON_DECODE)]
    for name in dict.fromkeys([*shown, best] if best else shown):
        path = paths.get(name, {})
        if "seconds" in path:
            eager = f", eager {path['eager_seconds'] * 1e6:7.1f} us" if "eager_seconds" in path else ""
            print(f"    {name:42s} {path['seconds'] * 1e6:8.1f} us  {path['vs_flash']:5.2f}x flash  "
                  f"{path['vs_kv_read']:5.2f}x K/V read  rel L2 {path['rel_l2_vs_flash']:.1e}{eager}")
        else:
            print(f"    {name:42s} failed: {path.get('failed', 'not run')}")
    failed = [name for name, path in paths.items() if "failed" in path]
    if failed:
        print(f"    {len(failed)} paths failed: {', '.join(failed[:6])}{' ...' if len(failed) > 6 else ''}")


def summary(rows: list[dict]) -> list[str]:
    """One line per shape: best config, its ratios, and whether issue 32's targets are met."""
    lines = [f"{'shape':34s} {'best triton_decode':42s} {'x flash':>8s} {'x K/V read':>10s}  targets"]
    for row in rows:
        shape = f"B{row['batch']} Lk{row['kv_len']} {row['dtype']}"
        best = row["best_triton"]
        if best is None:
            lines.append(f"{shape:34s} {'(every config failed)':42s}")
            continue
        path = row["paths"][best]
        met = path["vs_flash"] <= TARGET_FLASH_RATIO and path["vs_kv_read"] <= TARGET_READ_RATIO
        lines.append(f"{shape:34s} {best:42s} {path['vs_flash']:8.2f} {path['vs_kv_read']:10.2f}  "
                     f"{'met' if met else 'missed'} (<= {TARGET_FLASH_RATIO} / {TARGET_READ_RATIO})")
    return lines


def run_gpu(args) -> dict:
    import triton

    bandwidth = copy_bandwidth()
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "copy_bandwidth_bytes_per_s": bandwidth, "timing": "CUDA graph replay, GPU seconds per call"}
    print(f"{info['device']}; torch {info['torch']}; Triton {info['triton']}; copy bandwidth "
          f"{bandwidth / 1e12:.2f} TB/s (read + written); times: GPU per call from CUDA graphs, L2 cold")
    rows = []
    for dtype_name in args.dtypes.split(","):
        for batch, kv_len in (QUICK_SHAPES if args.quick else SHAPES):
            started = time.perf_counter()
            rows.append(bench_shape(batch, kv_len, dtype_name, bandwidth))
            rows[-1]["bench_seconds"] = time.perf_counter() - started
            show_shape(rows[-1])
    print("\n".join(summary(rows)))
    return {"conditions": info, "shapes": rows}


# ---------------------------------------------------------------------- CPU fold
def run_fold(args) -> dict:
    """`sdpa_gqa_fold` against PyTorch's ``enable_gqa=True`` call on the CPU (see module docstring)."""
    from attn_dispatch.dispatcher import Dispatcher
    from attn_dispatch.kernels import SdpaGqaFoldKernel
    from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa

    batch, heads, kv_heads, q_len, kv_len, dim = FOLD_SHAPE
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(batch, h, n, dim, generator=generator)
                         for h, n in ((heads, q_len), (kv_heads, kv_len), (kv_heads, kv_len)))
    problem = Problem.from_tensors(query, key, value, enable_gqa=True)
    runner = SdpaGqaFoldKernel().runner(problem)
    rows = query.reshape(batch, kv_heads, heads // kv_heads * q_len, dim)  # folded once, outside the timing
    expected_shape = query.shape
    dispatcher = Dispatcher(kernels=["sdpa_gqa_fold"])
    fast = dispatcher.fast_attention
    paths = {"pytorch_enable_gqa": lambda: pytorch_sdpa(query, key, value, enable_gqa=True),
             "pytorch_again": lambda: pytorch_sdpa(query, key, value, enable_gqa=True),  # A/A control
             "folded_sdpa_floor": lambda: pytorch_sdpa(rows, key, value),  # one SDPA call on pre-folded rows
             "fold_sdpa_runner": lambda: pytorch_sdpa(query.reshape(rows.shape), key, value).reshape(expected_shape),
             "fold_runner": lambda: runner(query, key, value, None, None, True, problem),
             "dispatcher_python": lambda: dispatcher.attention(query, key, value, enable_gqa=True),
             "dispatcher_fast": lambda: fast(query, key, value, enable_gqa=True)}
    expected = paths["pytorch_enable_gqa"]()
    floor = paths["folded_sdpa_floor"]().reshape(expected.shape)
    errors = {name: relative_errors(call().reshape(expected.shape), expected)[0] for name, call in paths.items()}
    same_as_floor = {name: torch.equal(call().reshape(expected.shape), floor) for name, call in paths.items()}
    for call in paths.values():
        for _ in range(FOLD_WARMUP):
            call()
    chosen = dispatcher.stats()
    load_before = os.getloadavg()
    samples: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for index in range(args.rounds):
        for name in names[index % len(names):] + names[: index % len(names)]:
            start = time.perf_counter()
            for _ in range(FOLD_CALLS):
                paths[name]()
            samples[name].append((time.perf_counter() - start) / FOLD_CALLS)
    load_after = os.getloadavg()
    base = samples["pytorch_enable_gqa"]
    rows_out = {}
    for name, values in samples.items():
        ratios = [b / v for b, v in zip(base, values, strict=True)]
        rows_out[name] = {"median_us": statistics.median(values) * 1e6, "min_us": min(values) * 1e6,
                          "q1_us": _quartiles(values)[0] * 1e6, "q3_us": _quartiles(values)[1] * 1e6,
                          "speedup_paired_median": statistics.median(ratios),
                          "speedup_paired_q1": _quartiles(ratios)[0], "speedup_paired_q3": _quartiles(ratios)[1],
                          "rel_l2_vs_pytorch": errors[name], "bitwise_equal_to_folded_sdpa": same_as_floor[name]}
    info = {"shape": dict(zip(("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim"), FOLD_SHAPE, strict=True)),
            "dtype": "float32", "threads": torch.get_num_threads(), "torch": torch.__version__,
            "calls_per_sample": FOLD_CALLS, "rounds": args.rounds, "load_before": load_before, "load_after": load_after,
            "dispatcher_calls": chosen, "fast_path": fast != dispatcher.attention}
    print(f"sdpa_gqa_fold, CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; B1 8/2 Lq1 Lk1700 D64 "
          f"fp32; {args.rounds} interleaved rounds of {FOLD_CALLS} calls; load {load_before[0]:.2f} -> {load_after[0]:.2f}; "
          f"dispatcher calls {chosen}; C++ fast path {'built' if info['fast_path'] else 'not built'}")
    print(f"    {'path':20s} {'median us [q1-q3]':>24s} {'min':>7s}  x PyTorch paired [q1-q3]  rel L2   = folded SDPA")
    for name, row in rows_out.items():
        print(f"    {name:20s} {row['median_us']:7.1f} [{row['q1_us']:6.1f}-{row['q3_us']:6.1f}] {row['min_us']:7.1f}  "
              f"{row['speedup_paired_median']:5.2f}x [{row['speedup_paired_q1']:.2f}-{row['speedup_paired_q3']:.2f}]  "
              f"{row['rel_l2_vs_pytorch']:.1e}  {row['bitwise_equal_to_folded_sdpa']}")
    return {"conditions": info, "paths": rows_out}


def _quartiles(values: list[float]) -> tuple[float, float]:
    """First and third quartiles."""
    cuts = statistics.quantiles(values, n=4)
    return cuts[0], cuts[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file for every number")
    parser.add_argument("--quick", action="store_true", help="two shapes per dtype")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--fold", action="store_true", help="the CPU GQA-fold measurement instead")
    parser.add_argument("--threads", type=int, help="--fold: torch.set_num_threads first")
    parser.add_argument("--rounds", type=int, default=FOLD_ROUNDS, help="--fold: interleaved rounds")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run_fold(args) if args.fold else run_gpu(args)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
