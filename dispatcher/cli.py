"""`attn-dispatch` command line: one module per command under `dispatcher/commands/`.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``run=<function(args) -> int>`` as the parser default.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata

COMMAND_MODULES = ("kernels", "explain", "calibrate", "bench", "show", "check", "export", "import_table", "merge", "devices")


def _version() -> str:
    try:
        return metadata.version("attn-dispatch")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attn-dispatch",
        description="Adaptive attention dispatcher: calibrate a card, inspect and share its tables.",
    )
    parser.add_argument("--version", action="version", version=f"attn-dispatch {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"attn_dispatch.dispatcher.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
