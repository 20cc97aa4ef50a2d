"""`attn-dispatch show`: a threshold table in words (card, provenance, model quality, where each
kernel wins) and, with --plot, its decision map as a PNG."""

from __future__ import annotations

import argparse
import sys

import torch


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "show",
        help="summarise a threshold table (card, provenance, quality, thresholds) and plot its decision map",
        description="Print a threshold table's card, provenance, model quality and thresholds in words. Without "
        "TABLE, show the table the dispatcher uses on --device. --plot draws one heat map per class (x: KV length, "
        "y: query length, colour: predicted fastest kernel, contours: predicted speed-up over PyTorch's default).",
    )
    parser.add_argument("table", nargs="?", default=None, metavar="TABLE", help="a table file (default: this device's)")
    parser.add_argument("--device", default=None, help="whose table to show without TABLE (default: cuda if available, else cpu)")
    parser.add_argument("--plot", default=None, metavar="PATH.png", help="write the decision map to this PNG")
    parser.set_defaults(run=run)


def resolve_table(path: str | None, device: str | None, command: str):
    """(table, where it came from) for a command that takes an optional TABLE argument.

    Raises
    ------
    models.TableError: the file is not a valid table.
    LookupError: no TABLE given and no table serves this device (message says what to run).
    """
    from attn_dispatch.models import DeviceIdentity, load_table, lookup_table

    if path is not None:
        return load_table(path), path
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    identity = DeviceIdentity.detect(device)
    found = lookup_table(identity, warn=False)
    if found.table is None:
        raise LookupError(
            f"no threshold table serves {device} ({identity.model_key}, {identity.software_key}): the analytic prior "
            f"decides there. Run `attn-dispatch calibrate` on it, `attn-dispatch import FILE` a shared table, or pass "
            f"`attn-dispatch {command} TABLE`"
        )
    notes = "".join(f"\n  note: {w}" for w in found.warnings)
    return found.table, f"{found.path} ({found.level} match for {identity.model_key} on {device}){notes}"


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.models import TableError
    from attn_dispatch.models.table_summary import summary_lines

    try:
        table, source = resolve_table(args.table, args.device, "show")
    except (TableError, LookupError) as error:
        print(f"attn-dispatch show: error: {error}", file=sys.stderr)
        return 2
    print(f"table: {source}")
    for line in summary_lines(table):
        print(line)
    if args.plot:
        from attn_dispatch.models.decision_plot import plot_decision_map

        try:
            written = plot_decision_map(table, args.plot)
        except (ImportError, ValueError, OSError) as error:
            print(f"attn-dispatch show: error: --plot {args.plot}: {error}", file=sys.stderr)
            return 2
        print(f"decision map: {written}")
    return 0
