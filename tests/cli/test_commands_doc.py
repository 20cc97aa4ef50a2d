"""docs/COMMANDS.md: every command has a generated example, and the deterministic ones still
match what the commands print (`bench.commands_doc`; regenerate with `python -m bench.commands_doc`)."""

from __future__ import annotations

from attn_dispatch.dispatcher.cli import COMMAND_MODULES, _module
from bench.commands_doc import DOC, EXAMPLES, blocks, normalise, replace_block, stale_blocks


def test_every_command_has_an_example_in_the_doc():
    commands = {_module(name).NAME for name in COMMAND_MODULES}
    assert commands <= {example.args[0] for example in EXAMPLES}
    assert set(blocks(DOC.read_text())) == {example.name for example in EXAMPLES}


def test_the_checked_examples_are_current():
    assert stale_blocks() == [], "docs/COMMANDS.md is stale: run `python -m bench.commands_doc`"


def test_normalise_masks_dates_and_durations_only():
    text = "provenance: created 2026-11-30T04:32:09Z, 5267 points measured in 444 s  \nre-measured in 2.6 s; 0.681 ms"
    assert normalise(text) == ("provenance: created <date>, 5267 points measured in <duration>\n"
                               "re-measured in <duration>; <duration>")


def test_replace_block_keeps_the_text_around_it():
    markdown = "intro\n<!-- generated: x -->\n```\nold\n```\n<!-- end generated: x -->\nafter\n"
    replaced = replace_block(markdown, "x", "$ attn-dispatch x\nnew")
    assert replaced.startswith("intro\n") and replaced.endswith("after\n")
    assert blocks(replaced) == {"x": "$ attn-dispatch x\nnew"}


def test_the_command_table_names_every_option_of_every_command():
    """The table at the top of docs/COMMANDS.md lists each command's options as `--help` has them (a new user
    found `calibrate --allow-busy`, which the refusal line recommends, missing there)."""
    from attn_dispatch.dispatcher.cli import build_parser

    rows = {line.split("|")[1].strip().strip("`"): line for line in DOC.read_text().splitlines()
            if line.startswith("| `")}
    subparsers = next(action for action in build_parser()._actions if action.dest == "command")
    missing = {}
    for name, parser in subparsers.choices.items():
        options = {option for action in parser._actions for option in action.option_strings
                   if option.startswith("--") and option != "--help"}
        absent = sorted(option for option in options if f"`{option}" not in rows.get(name, ""))
        if absent:
            missing[name] = absent
    assert not missing, f"docs/COMMANDS.md's command table lacks these options: {missing}"
