"""`attn-dispatch bench`: the dispatcher against PyTorch's default, the math path and every single
kernel (the oracle) on prefill, fill, decode and video shapes, interleaved in one run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attn_dispatch.dispatcher.commands._common import CommandError, check_folder, one_line, resolve_device

NAME = "bench"
HELP = "time the dispatcher against PyTorch's default, math and every kernel on prefill/fill/decode/video shapes"
SCENARIO_CHOICES = ("prefill", "fill", "decode", "video", "heldout", "all")
SIZE_CHOICES = ("auto", "small", "full")
# Harness defaults per device kind (calibration.scenario_bench.BenchSettings; run times: docs/COMMANDS.md)
GPU_ROUNDS, GPU_SHAPE_BUDGET_S = 10, 2.5
CPU_ROUNDS, CPU_SHAPE_BUDGET_S = 5, 1.0
# Shape budgets a shape's first pass may take before its predicted-slowest kernels are skipped
FIRST_PASS_SHARE = 3.0


def register(subparsers: argparse._SubParsersAction) -> None:
    from attn_dispatch.dispatcher.core import KERNEL_SETS

    parser = subparsers.add_parser(NAME, help=HELP, description="For each scenario's shapes, time the "
                                   "dispatcher (a fresh one), PyTorch's default SDPA, the math path and "
                                   "every single kernel, interleaved round-robin, and report medians, "
                                   "spreads, the kernel the dispatcher chose, its ratio to the best single "
                                   "kernel and to PyTorch's default, and failures (out of memory, over "
                                   "budget) per path, with every condition in the header (whether the "
                                   "machine was busy while timing among them), and end with a verdict: gain "
                                   "or no gain on this machine, and why. Markdown on stdout.")
    parser.add_argument("--scenario", default="all", choices=SCENARIO_CHOICES,
                        help="prefill (Lq = Lk, causal), fill (chunk against a long cache, masked), decode (Lq 1-16 "
                        "against 4k-128k), video (8k-128k tokens, non-causal), all (those four; default) or heldout (shapes "
                        "no calibration measures: odd lengths, GQA 5/7, batches 2-8, fp32 among them)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--memory-budget", default=None, metavar="SIZE",
                        help="cap each call's memory, e.g. 16GiB (emulates a smaller card); paths over it are skipped")
    parser.add_argument("--size", default="auto", choices=SIZE_CHOICES,
                        help="shape sizes: full (GPU), small (CPU, seconds) or auto (small on the CPU, full otherwise)")
    parser.add_argument("--small-dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                        help="dtype of every shape with --size small (default float32)")
    parser.add_argument("--kernels", default="all", choices=KERNEL_SETS,
                        help="the dispatcher's kernel set: every kernel, or those that run without PyTorch's fused backends, as on gfx906 (default: all)")
    parser.add_argument("--allow-lossy", action="append", default=[], metavar="CONVERSION",
                        help="let the dispatcher use a lossy conversion, e.g. fp32->bf16 (repeatable)")
    parser.add_argument("--no-measure", action="store_true",
                        help="the dispatcher does not measure a bucket's candidates on its calls (ATTN_DISPATCH_MEASURE=0; "
                        "see dispatcher/measuring.py); by default it does, on each shape's first call, before the timed rounds")
    parser.add_argument("--rounds", type=int, default=None, metavar="N", help="interleaved rounds per shape (default: 10 GPU, 5 CPU)")
    parser.add_argument("--shape-budget", type=float, default=None, metavar="SECONDS",
                        help="no new round after this many seconds on a shape (default: 2.5 GPU, 1 CPU)")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads for torch (CPU runs)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the full results as JSON")
    parser.add_argument("--md", default=None, metavar="PATH", help="also write the Markdown report to a file")
    parser.add_argument("--quiet", action="store_true", help="no per-shape progress on stderr")
    parser.set_defaults(run=run)


def _settings(args: argparse.Namespace, device):
    from attn_dispatch.calibration.scenario_bench import BenchSettings

    gpu = device.type != "cpu"
    rounds = args.rounds if args.rounds is not None else (GPU_ROUNDS if gpu else CPU_ROUNDS)
    budget = args.shape_budget if args.shape_budget is not None else (GPU_SHAPE_BUDGET_S if gpu else CPU_SHAPE_BUDGET_S)
    if rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {rounds}")
    if budget <= 0:
        raise ValueError(f"--shape-budget must be a positive number of seconds, got {budget}")
    return BenchSettings(rounds=rounds, min_rounds=min(BenchSettings.min_rounds, rounds), shape_budget_s=budget,
                         first_pass_budget_s=FIRST_PASS_SHARE * budget)


def _progress(result) -> None:
    ratio = result.ratio("oracle")
    to_pytorch = result.ratio("pytorch")
    print(f"{result.shape.label}: chose {result.chosen}, "
          f"x best kernel {'-' if ratio is None else f'{ratio:.2f}'}, x PyTorch {'-' if to_pytorch is None else f'{to_pytorch:.2f}'} "
          f"({result.wall_s:.1f} s)", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    import torch

    from attn_dispatch.calibration.scenario_bench import default_size, scenario_shapes
    from attn_dispatch.dispatcher.commands._bench_run import run_bench
    from attn_dispatch.dispatcher.decision import parse_memory_size
    from attn_dispatch.kernels import AccuracyPolicy

    for argument, path in (("--json", args.json), ("--md", args.md)):
        if path:
            check_folder(path, argument, "bench")
    try:
        device = resolve_device(args.device)
        size = default_size(device.type) if args.size == "auto" else args.size
        shapes = scenario_shapes(args.scenario, size=size, device_type=device.type, small_dtype=args.small_dtype)
        budget = None if args.memory_budget is None else parse_memory_size(args.memory_budget, name="--memory-budget")
        policy = AccuracyPolicy.allowing(*args.allow_lossy) if args.allow_lossy else AccuracyPolicy()
        settings = _settings(args, device)
        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"--threads must be at least 1, got {args.threads}")
            torch.set_num_threads(args.threads)
    except (ValueError, RuntimeError) as error:
        raise CommandError(one_line(error)) from None
    report = run_bench(shapes, device, kernels=args.kernels, policy=policy, memory_budget=budget, settings=settings,
                       size=size, progress=None if args.quiet else _progress, measure=not args.no_measure)
    text = report.markdown()
    print(text, end="")
    if args.md:
        Path(args.md).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    return 0
