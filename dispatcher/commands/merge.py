"""`attn-dispatch merge`: pool the tables of several cards of one model or family into one."""

from __future__ import annotations

import argparse
from pathlib import Path

from attn_dispatch.dispatcher.commands._common import CommandError, check_folder, one_line, what_is_stored
from attn_dispatch.dispatcher.commands.export import describe

NAME = "merge"
HELP = "pool several tables of one card model or family into one"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help=HELP, description="Merge table files of one card model or one "
                                   "family (e.g. MI50, MI60 and Radeon VII: gfx906): per bucket, each "
                                   "kernel's time is the median across cards (carried to the first file's "
                                   "card), the spread across cards is kept, and each card's cost model is "
                                   "kept. A table given twice (the same file, or the same calibration under "
                                   "another name) is refused: its points would count twice. Writes OUT, or "
                                   "stores the result where the dispatcher's lookup finds it without --out; "
                                   "a stored table already there (e.g. one imported before) is replaced "
                                   "only with --force.")
    parser.add_argument("files", nargs="+", metavar="FILE", help="two or more table files")
    parser.add_argument("--out", "-o", default=None, metavar="PATH", help="write the merged table here (default: store it)")
    parser.add_argument("--force", action="store_true", help="without --out: replace a stored table at the same place")
    parser.set_defaults(run=run)


def calibration_of(table) -> tuple:
    """What makes two table files the same calibration: card fingerprints, date and points."""
    p = table.provenance
    return (tuple(sorted(card.key for card in p.identities)), p.created, p.points_measured)


def _refuse_repeats(paths: list[str], tables: list) -> None:
    """CommandError when a file is given twice, or two files hold the same calibration."""
    seen: dict = {}
    for path, table in zip(paths, tables, strict=True):
        for key in (("path", Path(path).resolve()), ("calibration", calibration_of(table))):
            if key in seen:
                what = "is the same file as" if key[0] == "path" else "holds the same calibration as"
                raise CommandError(f"{path} {what} {seen[key]}: merging a table with itself would count its points "
                                   f"twice; give each table once")
            seen[key] = path


def run(args: argparse.Namespace) -> int:
    from attn_dispatch.models import TableError, load_table, merge_tables, save_table
    from attn_dispatch.models.sharing import stored_path

    if len(args.files) < 2:
        raise CommandError("give at least two table files to merge")
    if args.out:
        check_folder(args.out, "--out", "merge")
    try:
        tables = [load_table(path) for path in args.files]
        _refuse_repeats(args.files, tables)
        merged = merge_tables(tables)
        replaced = None
        if args.out:
            written = save_table(merged, args.out)
        else:
            target = stored_path(merged)
            _stored, replaced = what_is_stored(target)
            if replaced is not None and not args.force:
                raise CommandError(f"a stored table is already at {target}: {replaced}; pass --out PATH to write the "
                                   f"merged table elsewhere, or --force to replace it")
            written = save_table(merged, target)
    except (TableError, ValueError, OSError) as error:
        raise CommandError(one_line(error)) from None
    for path, table in zip(args.files, tables, strict=True):
        print(f"input {path}: {describe(table)}")
    print(f"merged: {describe(merged)}")
    for note in merged.provenance.notes:
        print(f"  note: {note}")
    print(f"  written to {written}")
    if replaced is not None:
        print(f"  replaced {replaced}")
    return 0
