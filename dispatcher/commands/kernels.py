"""`attn-dispatch kernels`: every kernel, whether it runs here, and its time on a few shapes."""

from __future__ import annotations

import argparse
import json

from attn_dispatch.dispatcher.commands._common import check_folder, resolve_device

NAME = "kernels"
HELP = "list every kernel, whether it supports this device, and its time on a few shapes"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description="Self-check every kernel against the "
                                   "float64 reference and time it on a few small shapes on this device, and "
                                   "say whether the machine was busy while timing.")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.calibration.measure import SELF_CHECK_SHAPES, run_kernel_table
    from attn_dispatch.calibration.noise import MachineWatch

    if args.json:
        check_folder(args.json, "--json", "kernels")
    device = resolve_device(args.device)
    with MachineWatch(device) as watch:  # the reference probe before and after: was the machine busy?
        table, records = run_kernel_table(device, SELF_CHECK_SHAPES)
    print(table)
    print(f"\nMachine: {watch.state.words()}")
    if watch.state.note() is not None:
        print(watch.state.note())
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": watch.state.to_dict(), "kernels": records}, handle, indent=1)
    failed = [r for r in records if r["status"] in ("inaccurate", "failed")]
    return 1 if failed else 0
