"""New-user trial: the calibrate summary and warnings, `show`, `explain`, `devices`, every command's
``--help`` and the user docs speak plain words: none of the project's own jargon ("quality guard",
"decision map", "oracle", ...) appears there unexplained."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from pathlib import Path

from attn_dispatch.calibration.finish import TOO_BUSY_SCORES, fit_and_write
from attn_dispatch.calibration.session import too_busy_stored
from attn_dispatch.dispatcher.cli import build_parser
from attn_dispatch.models import store_table
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.quality import Guard
from tests.cli.tables import honest_table
from tests.models.synthetic import synthetic_measurements

JARGON = ("ski-rental", "ski rental", "A/A", "oracle", "guard verdict", "portable set", "decision map",
          "region default", "quality guard")
ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = ("README.md", "docs/USAGE.md", "docs/CONFIG.md", "docs/GFX906.md", "docs/TABLE_FORMAT.md",
             "docs/ARCHITECTURE.md", "models/tables/README.md")


def jargon_in(text: str, allowed: tuple[str, ...] = ()) -> list[str]:
    return [term for term in JARGON if term not in allowed and term.lower() in text.lower()]


def test_the_calibrate_summary_and_its_warnings_speak_plain_words(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(tmp_path))
    for too_busy in (False, True):
        outcome = fit_and_write(synthetic_measurements(8, seed=7), DeviceIdentity.cpu(), out=None, seed=0, wall_s=1.0,
                                too_busy=too_busy)
        assert "outside measured buckets: " in outcome.quality
        assert jargon_in(outcome.quality) == [], outcome.quality
    assert jargon_in(too_busy_stored("the machine was busy") + TOO_BUSY_SCORES) == []


def test_table_commands_and_every_help_speak_plain_words(cli, tmp_path):
    busy = Guard("default", "measured on a machine too busy to time kernels (calibrate --allow-busy)")
    store_table(replace(honest_table(), guard=busy))
    for args in (("show",), ("devices",), ("explain", "--lq", "64", "--lk", "256", "--heads", "4", "--head-dim", "32",
                                           "--dtype", "float32", "--device", "cpu")):
        code, out, err = cli(*args)
        assert code == 0 and jargon_in(out + err) == [], (args, jargon_in(out + err))
        assert "outside measured buckets: PyTorch's default serves" in out
    code, out, err = cli("export", tmp_path / "shared.json")
    assert code == 0 and jargon_in(out + err) == [] and "outside measured buckets PyTorch's default serves" in out
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in [("attn-dispatch", parser), *subparsers.choices.items()]:
        assert jargon_in(command.format_help()) == [], name


def test_the_user_docs_speak_plain_words():
    for name in USER_DOCS:
        assert jargon_in((ROOT / name).read_text()) == [], name
    # COMMANDS.md: its prose (the generated blocks are the commands' output, above); it defines "oracle"
    commands = re.sub(r"<!-- generated: .*?<!-- end generated: [^>]*-->", "", (ROOT / "docs/COMMANDS.md").read_text(),
                      flags=re.S)
    assert "The best single kernel is the *oracle*" in commands
    assert jargon_in(commands, allowed=("oracle",)) == []
