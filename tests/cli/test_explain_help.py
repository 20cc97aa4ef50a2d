"""New-user trial: `attn-dispatch explain --help` shows every option's default where it has one."""

from __future__ import annotations

import argparse

from attn_dispatch.dispatcher.cli import build_parser


def explain_parser() -> argparse.ArgumentParser:
    subparsers = next(a for a in build_parser(full=["explain"])._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["explain"]


def test_every_optional_option_of_explain_says_its_default():
    for action in explain_parser()._actions:
        if action.required or isinstance(action, argparse._HelpAction):
            continue
        name = action.option_strings[0]
        assert action.help and "default:" in action.help, f"{name}: no default in its help: {action.help!r}"
        if action.default not in (None, False, []):
            assert f"default: {action.default})" in action.help, f"{name}: the help does not name {action.default!r}"
    assert "batch size (default: 1)" in explain_parser().format_help()


def test_explain_s_dtype_follows_the_device_unless_given():
    from attn_dispatch.dispatcher.commands.explain import problem_from_args

    args = explain_parser().parse_args(["--lq", "4"])
    assert problem_from_args(args, "cpu").dtype == "float32"  # what CPU tensors are made of
    assert problem_from_args(args, "cuda").dtype == "float16"
    given = explain_parser().parse_args(["--lq", "4", "--dtype", "bfloat16"])
    assert problem_from_args(given, "cpu").dtype == "bfloat16"


def test_explain_takes_dtypes_as_pytorch_users_write_them():
    from attn_dispatch.dispatcher.commands.explain import problem_from_args

    for text, name in (("half", "float16"), ("torch.float16", "float16"), ("Float16", "float16"), ("bf16", "bfloat16"),
                       ("torch.bfloat16", "bfloat16"), ("float", "float32"), ("double", "float64")):
        args = explain_parser().parse_args(["--lq", "4", "--dtype", text])
        assert problem_from_args(args, "cpu").dtype == name, text
