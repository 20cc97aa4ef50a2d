"""`attn-dispatch show`: a threshold table in words (card, provenance, model quality, where each
kernel wins) and, with --plot, its decision map as a PNG."""

from __future__ import annotations

import argparse

from attn_dispatch.dispatcher.commands._common import CommandError, one_line, resolve_device

NAME = "show"
HELP = "summarise a threshold table (card, provenance, quality, thresholds) and plot its winning kernel per size bucket"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description="Print a threshold table's card, "
                                   "provenance, model quality and thresholds in words. Without TABLE, show "
                                   "the table the dispatcher uses on --device. --plot draws one heat map "
                                   "per class (x: KV length, y: query length, colour: predicted fastest "
                                   "kernel, contours: predicted speed-up over PyTorch's default).")
    parser.add_argument("table", nargs="?", default=None, metavar="TABLE", help="a table file (default: this device's)")
    parser.add_argument("--device", default=None, help="whose table to show without TABLE (default: cuda if available, else cpu)")
    parser.add_argument("--plot", default=None, metavar="PATH.png", help="write a PNG of the winning kernel per (Lq, Lk) bucket, one panel per kind of problem")
    parser.set_defaults(run=run)


def resolve_table(path: str | None, device: str | None, command: str):
    """(table, where it came from) for a command with an optional TABLE; `CommandError` (naming the file, skipped
    corrupt tables and what to run) when TABLE is invalid or no table serves this device."""
    from attn_dispatch.models import DeviceIdentity, TableError, load_table, lookup_table

    if path is not None:
        try:
            return load_table(path), path
        except (TableError, OSError) as error:
            raise CommandError(one_line(error)) from None
    device = resolve_device(device)
    identity = DeviceIdentity.detect(device)
    found = lookup_table(identity, warn=False)
    if found.table is None:
        skipped = "".join(f" (skipped a damaged table file: {note.split(': ', 1)[1]})"
                          for note in found.warnings if note.startswith("skipped table "))
        raise CommandError(
            f"no threshold table serves {device} ({identity.model_key}, {identity.software_key}){skipped}: the "
            f"analytic prior decides there. Run `attn-dispatch calibrate` on it, `attn-dispatch import FILE` a "
            f"shared table, or pass `attn-dispatch {'export OUT --table PATH' if command == 'export' else command + ' TABLE'}`"
        )
    notes = "".join(f"\n  note: {w}" for w in found.warnings)
    return found.table, f"{found.path} ({found.level} match for {identity.model_key} on {device}){notes}"


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.models.table_summary import summary_lines

    table, source = resolve_table(args.table, args.device, "show")
    print(f"table: {source}")
    for line in summary_lines(table):
        print(line)
    if args.plot:
        from attn_dispatch.models.decision_plot import plot_decision_map

        try:
            written = plot_decision_map(table, args.plot)
        except (ImportError, ValueError, OSError) as error:
            raise CommandError(f"--plot {args.plot}: {one_line(error)}") from None
        print(f"plot of the winning kernels: {written}")
    return 0
