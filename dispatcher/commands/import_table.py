"""`attn-dispatch import`: validate shared table files and store them where lookups find them."""

from __future__ import annotations

import argparse
import sys

from attn_dispatch.dispatcher.commands._common import one_line
from attn_dispatch.dispatcher.commands.export import describe

NAME = "import"
HELP = "validate shared table files and store them under their card model"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        NAME,
        help=HELP,
        description="Validate each FILE (strict JSON schema; nothing in it is ever executed) and store it under its "
        "card model in the tables directory ($ATTN_DISPATCH_HOME/tables), where the dispatcher's lookup finds it: "
        "exact card and stack first, then the same card on another stack, then the same family (e.g. gfx906).",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="table files to import")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.models import TableError, import_table, load_table

    failed = 0
    for path in args.files:
        try:
            table = load_table(path)
            stored = import_table(path)
        except (TableError, OSError) as error:
            print(f"attn-dispatch import: error: {one_line(error)}", file=sys.stderr)
            failed += 1
            continue
        print(f"imported {describe(table)}")
        print(f"  from {path}")
        print(f"  stored as {stored}")
        print(f"  serves: {table.identity.model_key} (any stack; stale-stack warning on others) and, scaled, the "
              f"other cards of family {table.identity.family_key}")
    if failed and len(args.files) > 1:
        print(f"attn-dispatch import: {failed} of {len(args.files)} files were not imported", file=sys.stderr)
    if failed:
        return 2
    return 0
