"""`attn-dispatch check`: re-measure a sample of the table's buckets on this card and report drift;
exit 1 (and recommend recalibrating) when a decision changed; ``--fix`` refits the table with the
new points (whether or not a decision changed) and stores it for this device."""

from __future__ import annotations

import argparse
import time

from attn_dispatch.dispatcher.commands._common import CommandError, one_line, resolve_device

NAME = "check"
HELP = "re-measure a sample of the table's buckets and report drift (exit 1 when decisions changed)"
DEFAULT_POINTS = 12
MS = 1e3


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description="Re-measure N buckets of the table this "
                                   "device uses (or TABLE) with every kernel each bucket ranks, and compare "
                                   "with the table's predicted times: per kernel, the median measured / "
                                   "predicted ratio; per bucket, whether the table's first choice is still "
                                   "the fastest (within 10%). Exits 1 and recommends `attn-dispatch "
                                   "calibrate` when a decision changed; --fix instead refits the table with "
                                   "the new points and stores it for this device (exit 0 once stored).")
    parser.add_argument("table", nargs="?", default=None, metavar="TABLE", help="a table file (default: this device's)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--points", type=int, default=DEFAULT_POINTS, metavar="N", help=f"buckets to re-measure (default {DEFAULT_POINTS})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bucket sample and the inputs")
    parser.add_argument("--memory-budget", default=None, metavar="SIZE", help="cap each point's memory, e.g. 16GiB")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads for torch (CPU checks)")
    parser.add_argument("--fix", action="store_true", help="refit with the new points and store the table for this device")
    parser.set_defaults(run=run)


def _print_report(report) -> None:
    print("kernel drift (measured / predicted, median over the buckets re-measured):")
    for name, row in report.per_kernel().items():
        flag = "  DRIFTED" if row["drifted"] else ""
        print(f"  {name}: x{row['median_ratio']:.2f} (x{row['min_ratio']:.2f} .. x{row['max_ratio']:.2f}, "
              f"{row['points']} points){flag}")
    print("buckets:")
    for point in report.points:
        winner = point.measured_winner
        mine = point.measured.get(point.table_winner)
        verdict = "CHANGED" if point.changed else "same"
        measured = f"{mine * MS:.3f} ms" if mine is not None else point.statuses.get(point.table_winner, "not run")
        best = f"{winner} {point.measured[winner] * MS:.3f} ms" if winner else "nothing ran"
        print(f"  {point.key.describe()} Lq<={2 ** point.bucket[0]} Lk<={2 ** point.bucket[1]}: table picks "
              f"{point.table_winner} (predicted {point.predicted[point.table_winner] * MS:.3f} ms, measured {measured}); "
              f"fastest measured: {best} -> {verdict}")


def refit_threads(table, device) -> int | None:
    """The torch threads a ``--fix`` refit records (`models.table.Provenance.timing_threads`): this
    process's, where the new points and the table's own were both timed with them (a CPU table
    recording the same count); None otherwise (a GPU, an older table, or points of two counts)."""
    import torch

    threads = torch.get_num_threads()
    return threads if device.type == "cpu" and table.provenance.timing_threads == threads else None


def run(args: argparse.Namespace) -> int:
    import torch

    from attn_dispatch.calibration.drift import base_points, check_table
    from attn_dispatch.calibration.finish import fit_and_write
    from attn_dispatch.calibration.results import merge
    from attn_dispatch.dispatcher.commands.show import resolve_table
    from attn_dispatch.dispatcher.decision import parse_memory_size
    from attn_dispatch.models import DeviceIdentity, TableError
    from attn_dispatch.models.identity import torch_threads

    try:
        if args.points < 1:
            raise ValueError(f"--points must be at least 1, got {args.points}")
        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"--threads must be at least 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        table, source = resolve_table(args.table, args.device, "check")
        device = resolve_device(args.device)
        budget = None if args.memory_budget is None else parse_memory_size(args.memory_budget, name="--memory-budget")
        identity = DeviceIdentity.detect(device)
        started = time.perf_counter()
        report = check_table(table, device, points=args.points, seed=args.seed, memory_budget=budget,
                             device_key=identity.key)
    except (TableError, LookupError, ValueError) as error:
        raise CommandError(one_line(error)) from None
    print(f"table: {source}")
    print(f"re-measured {len(report.points)} buckets ({len(report.measurements)} points) on {device} "
          f"({identity.software_key}) in {time.perf_counter() - started:.1f} s")
    if not report.points:
        print("no bucket of this table is quick enough to re-measure here; nothing to compare")
        return 0
    _print_report(report)
    changed = report.changed
    if changed:
        print(f"decisions: {len(changed)} of {len(report.points)} re-measured buckets changed their fastest kernel")
    else:
        print(f"decisions: all {len(report.points)} re-measured buckets keep their choice; the table is current")
    if not args.fix:
        if changed:
            print("recommendation: recalibrate this card (`attn-dispatch calibrate`), or refit now with these points "
                  "(`attn-dispatch check --fix`)")
        return 1 if changed else 0
    base, where = base_points(table)
    threads = refit_threads(table, device)
    outcome = fit_and_write(merge(report.measurements, base), identity, out=None, seed=args.seed,
                            wall_s=time.perf_counter() - started, timing_thread_count=threads,
                            timing_threads="" if threads is None else f"{torch_threads(threads)} of its "
                            f"{identity.compute_units} logical CPUs")
    if not outcome.table_paths:
        raise CommandError(f"the refit built no table: {outcome.note}")
    print(f"refit on the new points and {where}")
    print(f"held-out quality: {outcome.quality}")
    print(f"stored: {outcome.table_paths[0]}")
    return 0
