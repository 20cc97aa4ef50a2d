"""Command-line usage errors are one line naming the argument (no usage block), exit status 2."""

from __future__ import annotations

import pytest

from attn_dispatch.dispatcher.cli import ERROR_EXIT, main


@pytest.mark.parametrize(("argv", "names"), [
    (["explain", "--lq", "1", "--dtype", "foo"], "argument --dtype: 'foo' is not a dtype attention takes: use float16"),
    (["explain", "--lq", "-1"], "argument --lq: must be 0 or more, got -1"),
    (["explain", "--lq", "x"], "argument --lq: expected a whole number, got 'x'"),
    ([], "the following arguments are required: COMMAND"),
    (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
    (["explian", "--lq", "1"], "attn-dispatch: error: unknown command 'explian' (did you mean explain?)"),
    (["calibrate", "--quikc"],
     "attn-dispatch calibrate: error: unrecognized arguments: --quikc (did you mean --quick?) (see attn-dispatch calibrate "
     "--help)"),
    (["devices", "stray"], "attn-dispatch devices: error: unrecognized arguments: stray (see attn-dispatch devices --help)"),
])
def test_usage_errors_are_one_line(capsys, argv, names):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == ERROR_EXIT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and names in err and "usage:" not in err


@pytest.mark.parametrize(("budget", "names"), [
    ("100B", "raise --memory-budget to at least that"),
    ("lots", "--memory-budget='lots' is not a memory size"),
])
def test_a_memory_budget_error_names_the_flag(capsys, budget, names):
    code = main(["explain", "--lq", "1", "--lk", "4096", "--device", "cpu", "--memory-budget", budget])
    err = capsys.readouterr().err
    assert code == ERROR_EXIT and err.count("\n") == 1 and names in err and "Dispatcher(" not in err


def test_a_device_that_is_no_torch_device_names_the_ones_to_use(capsys):
    code = main(["explain", "--lq", "1", "--device", "gpu"])
    err = capsys.readouterr().err
    assert code == ERROR_EXIT and err.count("\n") == 1
    assert "--device 'gpu' is not a torch device: use cpu, or cuda" in err and "privateuseone" not in err


def test_a_reader_that_leaves_the_pipe_is_no_error(monkeypatch, capsys):
    """`attn-dispatch show | head`: the pipe breaks while printing; exit 0, nothing on stderr."""
    import attn_dispatch.dispatcher.commands.explain as explain_command
    from attn_dispatch.dispatcher import cli

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    quieted = []
    monkeypatch.setattr(explain_command, "run", closed_pipe)
    monkeypatch.setattr(cli, "_stdout_to_devnull", lambda: quieted.append(True))
    assert main(["explain", "--lq", "1", "--lk", "64", "--device", "cpu"]) == 0
    assert quieted == [True] and capsys.readouterr().err == ""
