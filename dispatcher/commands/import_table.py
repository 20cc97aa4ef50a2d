"""`attn-dispatch import`: validate shared table files and store them where lookups find them. As `merge`, a stored
table of the same card and stack is replaced only with ``--force`` (saying what it replaced); importing the stored
table itself changes nothing."""

from __future__ import annotations

import argparse
import sys

from attn_dispatch.dispatcher.commands._common import CommandError, one_line, what_is_stored
from attn_dispatch.dispatcher.commands.export import describe

NAME = "import"
HELP = "validate shared table files and store them under their card model"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description="Validate each FILE (strict JSON schema; "
                                   "nothing in it is ever executed) and store it under its card model in "
                                   "the tables directory ($ATTN_DISPATCH_HOME/tables), where the "
                                   "dispatcher's lookup finds it: exact card and stack first, then the same "
                                   "card on another stack, then the same family (e.g. gfx906). A table "
                                   "already stored for the same card and stack is replaced only with "
                                   "--force.")
    parser.add_argument("files", nargs="+", metavar="FILE", help="table files to import")
    parser.add_argument("--force", action="store_true",
                        help="replace a table already stored for the same card and stack (the output names it)")
    parser.set_defaults(run=run)


def _import_one(path: str, force: bool) -> None:
    """Store the table at `path`, printing what happened; CommandError for a file not imported."""
    from attn_dispatch.models import TableError, load_table, save_table
    from attn_dispatch.models.sharing import stored_path
    from attn_dispatch.models.table_io import dumps_table

    try:
        table = load_table(path)
        target = stored_path(table)
        stored, replaced = what_is_stored(target)
        if stored is not None and dumps_table(stored) == dumps_table(table):
            print(f"already stored: {describe(table)}")
            print(f"  at {target} (unchanged)")
            return
        if replaced is not None and not force:
            raise CommandError(f"{path}: a table is already stored for this card and stack at {target}: {replaced}; "
                               f"pass --force to replace it (`attn-dispatch export FILE` keeps a copy first)")
        written = save_table(table, target)
    except (TableError, OSError) as error:
        raise CommandError(one_line(error)) from None
    print(f"imported {describe(table)}")
    print(f"  from {path}")
    print(f"  stored as {written}")
    if replaced is not None:
        print(f"  replaced {replaced}")
    print(f"  serves: {table.identity.model_key} (any stack; stale-stack warning on others) and, scaled, the "
          f"other cards of family {table.identity.family_key}")


def run(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            _import_one(path, args.force)
        except CommandError as error:
            print(f"attn-dispatch import: error: {error}", file=sys.stderr)
            failed += 1
    if failed and len(args.files) > 1:
        print(f"attn-dispatch import: {failed} of {len(args.files)} files were not imported", file=sys.stderr)
    return 2 if failed else 0
