"""The commands that take a named kernel set offer exactly the dispatcher's (`KERNEL_SETS`)."""

from __future__ import annotations

import pytest

from attn_dispatch.dispatcher.cli import build_parser
from attn_dispatch.dispatcher.core import KERNEL_SETS


def _kernels_choices(command: str) -> tuple[str, ...]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    option = next(a for a in subparsers.choices[command]._actions if a.dest == "kernels")
    return tuple(option.choices)


@pytest.mark.parametrize("command", ["bench", "explain"])
def test_kernel_set_choices_are_the_dispatchers(command):
    assert _kernels_choices(command) == KERNEL_SETS
