"""`attn-dispatch calibrate`: measure every kernel on this card, tune their parameters, fit the cost
model and write the card's threshold table (see `calibration`)."""

from __future__ import annotations

import argparse
import json

from attn_dispatch.dispatcher.commands._common import CommandError, one_line, resolve_device

NAME = "calibrate"
HELP = "measure every kernel on this card and write its threshold table"
# Seconds per minute, for --budget-minutes.
SECONDS_PER_MINUTE = 60.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description="Time every kernel over a seeded sweep of "
                                   "problem shapes on this card, tune chunk sizes, splits and the Triton "
                                   "kernels' blocks, warps and stages with optuna, fit the cost model and "
                                   "write the card's threshold table. Resumable: a killed run continues "
                                   "where it stopped (same options, same journal). Files live under "
                                   "$ATTN_DISPATCH_HOME (default: the user cache directory).")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    where.add_argument("--devices", default=None, metavar="LIST",
                       help="comma-separated devices, one worker process each (e.g. cuda:0,cuda:1)")
    parser.add_argument("--quick", action="store_true", help="a small sweep with fewer repetitions; measuring stops after 100 s. On a 2-core "
                        "CPU: 30 s quiet (36 problems); with both cores busy with other processes it stops after 4-14 s as too "
                        "busy (93 s for 39 problems with --allow-busy)")
    parser.add_argument("--budget-minutes", type=float, default=None, metavar="N",
                        help="wall time for measuring (default: 100 s with --quick, 8 min otherwise); the fit comes after")
    parser.add_argument("--storage", default=None, metavar="URL",
                        help="optuna storage shared by workers and hosts: sqlite:///..., postgresql://... or a "
                        "journal file path (default: a journal in the cache directory)")
    parser.add_argument("--out", default=None, metavar="PATH", help="also write the threshold table here")
    parser.add_argument("--results", default=None, metavar="PATH", help="results file (JSON Lines; default: cache directory)")
    parser.add_argument("--kernels", default="all", metavar="SET",
                        help="'all' (default), 'portable' (math, chunked, small_q, the Triton kernels where Triton compiles for the card, convert: what gfx906 has) or kernel names")
    parser.add_argument("--memory-budget", default=None, metavar="SIZE",
                        help="emulate a smaller card, e.g. 16GiB (G = GiB, as in bench and check): points over it are infeasible")
    parser.add_argument("--allow-lossy", action="append", default=[], metavar="CONVERSION",
                        help="measure a lossy conversion (e.g. fp32->bf16) and record its error; 'any' for all")
    parser.add_argument("--problems", type=int, default=None, metavar="N", help="problems in the sweep (default: by profile)")
    parser.add_argument("--tune-trials", type=int, default=None, metavar="N", help="optuna trials per tuned kernel family and problem")
    parser.add_argument("--workload", default=None, metavar="PATH",
                        help="measure first the problems a real run recorded (ATTN_DISPATCH_RECORD=PATH or "
                        "attn_dispatch.record(PATH)), as recorded, then the sweep")
    parser.add_argument("--allow-busy", action="store_true",
                        help="calibrate even when a reference point timed first shows the machine too busy to time "
                        "kernels reliably (its timings spread too wide, or this process gets too small a share of "
                        "the CPU); the samples are widened, the summary warns, and the table stored keeps "
                        "PyTorch's default outside the buckets measured (its model is not used)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the problem sample and the samplers")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (CPU calibration); the table records the count, and a process "
                        "running another count is warned once that its timings may not hold")
    parser.add_argument("--measure-only", action="store_true", help="stop after measuring (no fit, no table)")
    parser.add_argument("--summary-json", default=None, metavar="PATH", help="also write the summary as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--training", action="store_true",
                        help="then time forward+backward of the kernels with a backward on the first device and write "
                        "the training profile the training route reads (calibration/training_profile.py)")
    parser.set_defaults(run=run)


def _config(args: argparse.Namespace):
    """The `CalibrationConfig` of the options; ValueError naming a bad one (an unknown kernel
    among them, before anything is measured)."""
    from attn_dispatch.calibration.candidates import kernel_set
    from attn_dispatch.calibration.config import CalibrationConfig
    from attn_dispatch.dispatcher.decision import parse_memory_size
    from attn_dispatch.kernels import AccuracyPolicy

    if args.devices:
        devices = tuple(str(resolve_device(d.strip())) for d in args.devices.split(",") if d.strip())
    else:
        devices = (str(resolve_device(args.device)),)
    kernel_set(args.kernels, policy=AccuracyPolicy.allowing(*args.allow_lossy) if args.allow_lossy else AccuracyPolicy())
    return CalibrationConfig(
        devices=devices, quick=args.quick,
        budget_s=None if args.budget_minutes is None else args.budget_minutes * SECONDS_PER_MINUTE,
        storage=args.storage, results=args.results, kernels=args.kernels,
        memory_budget=None if args.memory_budget is None else parse_memory_size(args.memory_budget, name="--memory-budget"),
        allow_lossy=tuple(args.allow_lossy), problems=args.problems, tune_trials=args.tune_trials,
        seed=args.seed, threads=args.threads, workload=args.workload,
        allow_busy=args.allow_busy,
    )


def _fast_path_hint(error: ValueError) -> str:
    """For a calibration refused as too busy, where the fast path is not built (calibrate builds it at
    its end): that building it needs no quiet machine, and the command that does."""
    from attn_dispatch.calibration.noise import MachineBusy
    from attn_dispatch.dispatcher import fast_path
    from attn_dispatch.dispatcher.commands.build_fast_path import NAME

    if not isinstance(error, MachineBusy) or not fast_path.fast_path_enabled() or fast_path.load() is not None:
        return ""
    return f". The fast path is not built either; building it needs no quiet machine: `attn-dispatch {NAME}`"


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.calibration.session import calibrate

    try:
        config = _config(args)
        summary = calibrate(config, out=args.out, show_progress=not args.quiet, fit=not args.measure_only)
    except ValueError as error:
        raise CommandError(one_line(error) + _fast_path_hint(error)) from None
    for line in summary.lines():
        print(line)
    from attn_dispatch.dispatcher.commands.build_fast_path import build_after_calibration

    note = build_after_calibration()
    if note:
        print(note)
    if args.training:
        from attn_dispatch.calibration.training_profile import write_profile

        kernel_set = args.kernels if args.kernels in ("all", "portable") else "all"
        print(write_profile(config.devices[0], kernel_set=kernel_set, budget=config.memory_budget, quick=config.quick))
    if args.summary_json:
        statuses = dict(summary.statuses)
        with open(args.summary_json, "w") as handle:
            json.dump({
                "calibration_id": summary.calibration_id, "identity": summary.identity.to_dict(),
                "devices": list(summary.devices), "wall_s": summary.wall_s, "measuring_s": summary.measuring_s,
                "statuses": statuses, "problems": len({m.problem for m in summary.measurements}),
                "timed_now": summary.timed_now, "resumed_points": summary.resumed_points,
                "workers": [r.to_dict() for r in summary.reports],
                "tables": [str(p) for p in summary.fit.table_paths], "quality": summary.fit.quality,
                "excluded": summary.fit.excluded, "note": summary.fit.note,
                "workload_measured": list(summary.workload_measured()),
                "noise_start": None if summary.noise_start is None else summary.noise_start.spread,
                "noise_end": None if summary.noise_end is None else summary.noise_end.spread,
                "noise_verdicts": [n.describe() for n in (summary.noise_start, summary.noise_end) if n is not None],
                "cpu_share_start": None if summary.noise_start is None else summary.noise_start.cpu_share,
                "cpu_share_end": None if summary.noise_end is None else summary.noise_end.cpu_share,
            }, handle, indent=1)
    return 0
