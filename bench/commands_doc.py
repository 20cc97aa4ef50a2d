"""Write the example outputs of docs/COMMANDS.md from real runs of `attn-dispatch` on this
machine's CPU, and check that the deterministic ones are still current.

    python -m bench.commands_doc           # run every example, rewrite its block (about 2 minutes)
    python -m bench.commands_doc --check   # re-run the checked examples; exit 1 when one is stale

Each example's block in the Markdown sits between ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->``: the command line, then what it printed (stdout, then stderr,
then ``[exit N]`` when N is not 0). Commands run in this process, with ``ATTN_DISPATCH_HOME`` set
to a fresh folder of a fresh work directory, which the blocks show as `WORK`.

*Checked* examples depend only on files in the repository (the bundled H200 table), on files
the examples write and on the problem asked about, so their output is the same on any machine:
`--check` (and tests/cli/test_commands_doc.py) re-runs them and compares after `normalise`,
which masks dates and durations. The other examples (calibrate, check, bench, kernels, explain,
devices, show and export of this CPU's table) describe this machine and are only rewritten by a
full run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "COMMANDS.md"
H200_TABLE = "models/tables/nvidia-h200-140gb.json"
WORK = "WORK"  # how blocks name the work directory
# Fixed terminal width and no colours, so argparse's help text is the same in every run.
HELP_COLUMNS = "100"
GAP = "..."

BEGIN, END = "<!-- generated: {name} -->", "<!-- end generated: {name} -->"
_DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
_DURATION = re.compile(r"\b\d+(?:\.\d+)? ?(?:s|ms|us)\b")


@dataclass(frozen=True)
class Example:
    """One command run for the doc.

    name: the block's name in the Markdown; args: after ``attn-dispatch`` (``{work}`` is the
    work directory); checked: deterministic (see module docstring); keep: regexes of the lines
    to show (an empty tuple shows every line; left-out runs become ``...``); sections: regexes
    of lines that are shown with the indented lines under them.
    """

    name: str
    args: tuple[str, ...]
    checked: bool = False
    keep: tuple[str, ...] = ()
    sections: tuple[str, ...] = ()


EXAMPLES = (
    Example("help", ("--help",), checked=True),
    Example("show-h200", ("show", H200_TABLE), checked=True,
            keep=(r"^(table:|card:|software:|provenance:|built with:|note:|spec sheet|held-out quality|cost model:|"
                  r"outside measured buckets:|winning kernels:)", r"^  (the table |always PyTorch|the analytic prior|"
                  r"its cost model)"),
            sections=(r"^  (bfloat16, non-causal, mask none|float16, causal, mask none|float32, non-causal, "
                      r"mask none) ",)),
    Example("export-h200", ("export", "{work}/shared/h200.json", "--table", H200_TABLE), checked=True),
    Example("import-h200", ("import", "{work}/shared/h200.json"), checked=True),
    Example("import-again", ("import", "{work}/shared/h200.json"), checked=True),
    Example("import-not-a-table", ("import", "{work}/not-a-table.json"), checked=True),
    Example("merge-itself", ("merge", H200_TABLE, "{work}/shared/h200.json", "--out", "{work}/merged.json"),
            checked=True),
    Example("export-hint", ("export", "{work}/mine.json", "--device", "cpu")),
    Example("calibrate", ("calibrate", "--device", "cpu", "--quick", "--budget-minutes", "0.5", "--threads", "1",
                          "--quiet")),
    Example("calibrate-unknown-kernel", ("calibrate", "--device", "cpu", "--kernels", "flashy_attention"),
            checked=True),
    Example("devices", ("devices",)),
    Example("build-fast-path", ("build-fast-path", "--home", "{work}/home")),
    Example("explain", ("explain", "--lq", "1", "--lk", "4096", "--heads", "8", "--kv-heads", "2", "--head-dim", "64",
                        "--dtype", "float32", "--device", "cpu")),
    Example("explain-table", ("explain", "--lq", "1", "--lk", "23000", "--batch", "3", "--heads", "40", "--kv-heads",
                              "8", "--dtype", "bfloat16", "--device", "cpu", "--table", H200_TABLE),
            keep=(r"^(attention on|  ranked by|  table:|  note:)", r"^     [1-3]\. ")),
    Example("explain-budget", ("explain", "--lq", "1", "--lk", "4096", "--device", "cpu", "--memory-budget", "100B"),
            checked=True),
    Example("show-cpu", ("show", "--device", "cpu"),
            keep=(r"^(table:|card:|provenance:|note:|held-out quality|outside measured buckets:|winning kernels:)",
                  r"^  (the table as stored|always PyTorch|the analytic prior)"),
            sections=(r"^  float32, non-causal, mask none ",)),
    Example("check", ("check", "--device", "cpu", "--points", "4", "--threads", "1")),
    Example("kernels", ("kernels", "--device", "cpu")),
    Example("bench", ("bench", "--scenario", "decode", "--device", "cpu", "--threads", "1", "--rounds", "3",
                      "--shape-budget", "0.3", "--quiet")),
)


def prepare(work: Path) -> None:
    """The files the examples read: a JSON file that is not a table."""
    (work / "shared").mkdir(parents=True, exist_ok=True)
    (work / "not-a-table.json").write_text(json.dumps({"a": 1}) + "\n")


@contextlib.contextmanager
def _environment(work: Path):
    """Run from the repository root with the doc's environment; both restored after, and torch's threads."""
    import torch

    saved, cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    os.chdir(REPO)
    os.environ.update({"ATTN_DISPATCH_HOME": str(work / "home"), "COLUMNS": HELP_COLUMNS, "NO_COLOR": "1",
                       "PYTHON_COLORS": "0"})
    for name in ("ATTN_DISPATCH_MEMORY_BUDGET", "ATTN_DISPATCH_MEASURE", "ATTN_DISPATCH_LOG"):
        os.environ.pop(name, None)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)
        torch.set_num_threads(threads)  # `calibrate --threads 1` sets them: the next example runs as a fresh process


def run_example(example: Example, work: Path) -> str:
    """The block text of `example` run now (command line and output, work directory as `WORK`)."""
    from attn_dispatch.dispatcher.cli import main

    args = [arg.format(work=work) for arg in example.args]
    out, err = io.StringIO(), io.StringIO()
    with _environment(work), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as done:  # --help
            code = int(done.code or 0)
    lines = _select(out.getvalue().splitlines(), example) + err.getvalue().splitlines()
    if code:
        lines.append(f"[exit {code}]")
    text = "\n".join([f"$ attn-dispatch {' '.join(args)}", *lines])
    return text.replace(str(work), WORK)


def _select(lines: list[str], example: Example) -> list[str]:
    """The lines `example.keep` and `example.sections` choose, with ``...`` for each gap."""
    if not example.keep and not example.sections:
        return lines
    chosen, in_section = [], False
    for line in lines:
        starts = any(re.search(pattern, line) for pattern in example.sections)
        in_section = starts or (in_section and line.startswith("    "))
        chosen.append(in_section or any(re.search(pattern, line) for pattern in example.keep))
    shown: list[str] = []
    for line, keep in zip(lines, chosen, strict=True):
        if keep:
            shown.append(line)
        elif not shown or shown[-1] != GAP:
            shown.append(GAP)
    return shown


def normalise(text: str) -> str:
    """`text` with what changes from run to run masked: dates, durations, trailing spaces."""
    text = _DURATION.sub("<duration>", _DATE.sub("<date>", text))
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def blocks(markdown: str) -> dict[str, str]:
    """Block name -> its text (inside the code fence) in `markdown`."""
    found = {}
    for match in re.finditer(r"<!-- generated: (?P<name>[\w-]+) -->\n```\n(?P<body>.*?)\n```\n<!-- end generated: "
                             r"(?P=name) -->", markdown, flags=re.S):
        found[match["name"]] = match["body"]
    return found


def replace_block(markdown: str, name: str, body: str) -> str:
    """`markdown` with block `name` holding `body` (ValueError when the markers are missing)."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    if begin not in markdown or end not in markdown:
        raise ValueError(f"{DOC.name} has no markers for block {name!r}: add `{begin}` and `{end}` where it goes")
    head, rest = markdown.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n```\n{body}\n```\n{end}{tail}"


def stale_blocks(doc: Path = DOC) -> list[str]:
    """Names of the checked examples whose block in `doc` differs from a fresh run (normalised)."""
    current = blocks(doc.read_text())
    stale = []
    with tempfile.TemporaryDirectory(prefix="attn-dispatch-docs-") as tmp:
        work = Path(tmp)
        prepare(work)
        for example in (e for e in EXAMPLES if e.checked):
            if normalise(current.get(example.name, "")) != normalise(run_example(example, work)):
                stale.append(example.name)
    return stale


def write_all(doc: Path = DOC) -> None:
    """Run every example in order and rewrite its block in `doc`."""
    markdown = doc.read_text()
    with tempfile.TemporaryDirectory(prefix="attn-dispatch-docs-") as tmp:
        work = Path(tmp)
        prepare(work)
        for example in EXAMPLES:
            print(f"running {example.name} ...", file=sys.stderr, flush=True)
            markdown = replace_block(markdown, example.name, run_example(example, work))
    doc.write_text(markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only re-run the checked examples and compare")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_blocks()
        for name in stale:
            print(f"{DOC.name}: block {name!r} is stale: run `python -m bench.commands_doc`", file=sys.stderr)
        return 1 if stale else 0
    write_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
