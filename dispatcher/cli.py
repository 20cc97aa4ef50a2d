"""`attn-dispatch` command line: one module per command under `dispatcher/commands/` (``NAME``, ``HELP``,
``register(subparsers)`` setting ``run``). Only the command being run gets its whole parser, so ``--help`` and
``--version`` import no torch. Errors are one line on stderr with exit 2 (`check` keeps 1 for "a decision changed")."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import sys
from collections.abc import Iterable
from importlib import metadata

COMMAND_MODULES = ("kernels", "explain", "calibrate", "bench", "show", "check", "export", "import_table", "merge", "devices",
                   "build_fast_path")
# The exit status of every command error (argparse's own usage errors exit 2 too).
ERROR_EXIT = 2
# Unix convention for a process ended by SIGINT (128 + 2).
INTERRUPTED_EXIT = 130


def _version() -> str:
    try:
        return metadata.version("attn-dispatch")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _module(name: str):
    return importlib.import_module(f"attn_dispatch.dispatcher.commands.{name}")


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors as one line and no usage block (subcommand parsers too)."""

    def error(self, message: str):
        self.exit(ERROR_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(full: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The parser; `full`: commands that get their whole parser (default: every one), the others a help-only one."""
    parser = OneLineParser(prog="attn-dispatch",
                           description="Adaptive attention dispatcher: calibrate a card, inspect and share its tables.")
    parser.add_argument("--version", action="version", version=f"attn-dispatch {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.commands = subparsers.choices  # name -> the command's parser
    wanted = None if full is None else set(full)
    for name in COMMAND_MODULES:
        module = _module(name)
        if wanted is None or module.NAME in wanted:
            module.register(subparsers)
        else:
            subparsers.add_parser(module.NAME, help=module.HELP, add_help=False)
    return parser


def _unrecognized(command: argparse.ArgumentParser, words: list[str]) -> None:
    """Exit with one line naming `words` and, for an option that is a misspelling of one of the command's, that one."""
    options = [option for action in command._actions for option in action.option_strings]
    meant = [match for word in words if word.startswith("-") and word != "--"
             for match in difflib.get_close_matches(word.split("=")[0], options, n=1)]
    hint = f" (did you mean {' '.join(meant)}?)" if meant else ""
    command.error(f"unrecognized arguments: {' '.join(words)}{hint}")


def _stdout_to_devnull() -> None:
    """After a broken pipe, point stdout at /dev/null (the exit flush would raise again)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no file descriptor (a test's capture)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((word for word in argv if not word.startswith("-")), None)  # the first non-option
    parser = build_parser(full=[command] if command else [])
    meant = difflib.get_close_matches(command, parser.commands, n=1) if command not in (None, *parser.commands) else []
    if meant:  # argparse alone lists every command
        parser.error(f"unknown command {command!r} (did you mean {meant[0]}?)")
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own parser says it, naming the command and the option meant
        _unrecognized(parser.commands[args.command], unknown)
    from attn_dispatch.dispatcher.commands._common import CommandError, check_devices, one_line

    try:
        check_devices(args)
        return int(args.run(args) or 0)
    except BrokenPipeError:  # `attn-dispatch show | head`: the reader left; nothing more to say to it
        _stdout_to_devnull()
        return 0
    except (CommandError, OSError) as error:  # OSError: a file the user named cannot be read or written
        print(f"attn-dispatch {args.command}: error: {one_line(error)}", file=sys.stderr)
        return ERROR_EXIT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT


if __name__ == "__main__":
    sys.exit(main())
