"""`attn-dispatch merge`: pool the tables of several cards of one model or family into one."""

from __future__ import annotations

import argparse
import sys

from attn_dispatch.dispatcher.commands.export import describe


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "merge",
        help="pool several tables of one card model or family into one",
        description="Merge table files of one card model or one family (e.g. MI50, MI60 and Radeon VII: gfx906): per "
        "bucket, each kernel's time is the median across cards (carried to the first file's card), the spread "
        "across cards is kept, and each card's cost model is kept. Writes OUT, or stores the result where the "
        "dispatcher's lookup finds it without --out.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="two or more table files")
    parser.add_argument("--out", "-o", default=None, metavar="PATH", help="write the merged table here (default: store it)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.models import TableError, load_table, merge_tables, save_table, store_table

    if len(args.files) < 2:
        print("attn-dispatch merge: error: give at least two table files to merge", file=sys.stderr)
        return 2
    try:
        tables = [load_table(path) for path in args.files]
        merged = merge_tables(tables)
        written = save_table(merged, args.out) if args.out else store_table(merged)
    except (TableError, ValueError, OSError) as error:
        print(f"attn-dispatch merge: error: {error}", file=sys.stderr)
        return 2
    for path, table in zip(args.files, tables, strict=True):
        print(f"input {path}: {describe(table)}")
    print(f"merged: {describe(merged)}")
    for note in merged.provenance.notes:
        print(f"  note: {note}")
    print(f"  written to {written}")
    return 0
