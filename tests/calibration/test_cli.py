"""`attn-dispatch calibrate --quick` end to end, CI-sized: the console script in a fresh process
under a private ATTN_DISPATCH_HOME, then a resumed run that measures nothing again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from attn_dispatch.dispatcher.cli import main

SCRIPT = Path(sys.executable).with_name("attn-dispatch")
CI_ARGS = ["--device", "cpu", "--quick", "--problems", "4", "--kernels", "portable", "--threads", "1",
           "--tune-trials", "2", "--budget-minutes", "1.5", "--allow-busy"]


def test_quick_calibration_end_to_end(tmp_path, private_home, capsys):
    table, summary = tmp_path / "table.json", tmp_path / "summary.json"
    command = [str(SCRIPT), "calibrate", *CI_ARGS, "--quiet", "--out", str(table), "--summary-json", str(summary)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=170)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "points:" in done.stdout and "table:" in done.stdout
    report = json.loads(summary.read_text())
    assert report["statuses"]["ok"] > 0 and report["problems"] >= 4 and report["tables"]
    assert json.loads(table.read_text())["format_version"]
    assert all(Path(p).is_relative_to(private_home) for p in report["tables"][:1])  # the lookup copy
    assert list((private_home / "journals").glob("*.journal")) and list((private_home / "journals").glob("*.jsonl"))

    assert main(["calibrate", *CI_ARGS, "--quiet", "--measure-only"]) == 0
    assert "(0 timed now," in capsys.readouterr().out


def test_bad_options_are_errors(capsys):
    assert main(["calibrate", "--device", "cpu", "--memory-budget", "lots"]) == 2
    assert "--memory-budget='lots' is not a memory size" in capsys.readouterr().err
