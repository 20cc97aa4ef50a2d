"""`attn-dispatch export`: write the table a device uses to one JSON file to share."""

from __future__ import annotations

import argparse

from attn_dispatch.dispatcher.commands._common import CommandError, check_folder, one_line
from attn_dispatch.dispatcher.commands.show import resolve_table

NAME = "export"
HELP = "write this device's threshold table to one JSON file to share"
KIBI = 1024


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description="Validate the table the dispatcher uses on "
                                   "--device (or TABLE given with --table) and write it to OUT: one "
                                   "self-contained JSON file other owners of the same card model or family "
                                   "can import.")
    parser.add_argument("out", metavar="OUT", help="the JSON file to write, in a folder that exists")
    parser.add_argument("--device", default=None, help="whose table (default: cuda if available, else cpu)")
    parser.add_argument("--table", default=None, metavar="PATH", help="export this table file instead (validated)")
    parser.add_argument("--no-tunings", action="store_true",
                        help="leave out the first-call tunings remembered for the table's card (default: they go in as measured entries)")
    parser.set_defaults(run=run)


def describe(table) -> str:
    """One line: card, stack, date, points, classes, what ranks kernels outside measured buckets."""
    from attn_dispatch.models.quality import VERDICT_WORDS

    p = table.provenance
    merged = f", merged from {len(p.identities)} cards" if p.merged_from else ""
    return (f"{table.identity.model_key} ({table.identity.software_key}), created {p.created}, "
            f"{p.points_measured} points, {len(table.classes)} classes, {len(table.entries)} measured entries, "
            f"outside measured buckets {VERDICT_WORDS.get(table.verdict, table.verdict)}{merged}")


def with_remembered_tunings(table):
    """`table` with this machine's remembered tunings of its card as measured entries."""
    from attn_dispatch.dispatcher.measured_store import tuning_entries
    from attn_dispatch.models.paths import tunings_dir

    return table.with_entries(tuning_entries(tunings_dir(), table.identity.key))


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.models import TableError, export_table

    check_folder(args.out, "OUT", "export")
    table, source = resolve_table(args.table, args.device, "export")
    if args.table is None and "family match" in source:
        raise CommandError("the table serving this device is a stand-in of another card of its family, with "
                           f"scaled times: {source}. Share the original file instead (attn-dispatch export "
                           "OUT --table PATH)")
    try:
        if not args.no_tunings:
            table = with_remembered_tunings(table)
        written = export_table(table, args.out)
    except (TableError, OSError) as error:
        raise CommandError(one_line(error)) from None
    print(f"exported {describe(table)}")
    print(f"  from {source}")
    print(f"  to {written} ({written.stat().st_size / KIBI:.0f} KiB)")
    return 0
