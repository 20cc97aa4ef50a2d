"""Every command error is one line on stderr with exit 2, and no traceback; read-only commands
write nothing; `--help` and `--version` import no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from attn_dispatch.dispatcher.cli import ERROR_EXIT
from attn_dispatch.models import save_table, store_table
from tests.cli.tables import honest_table

# Every command that takes --device, with its other required arguments.
DEVICE_COMMANDS = [
    ["explain", "--lq", "4"], ["show"], ["export", "out.json"], ["kernels"], ["bench"], ["check"], ["calibrate"],
]


def assert_one_line_error(code: int, out: str, err: str, command: str, *fragments: str) -> None:
    assert code == ERROR_EXIT, (code, err)
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"attn-dispatch {command}: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where PyTorch sees no GPU")
@pytest.mark.parametrize("args", DEVICE_COMMANDS, ids=lambda args: args[0])
def test_a_gpu_asked_of_a_cpu_build_is_one_line(cli, args, tmp_path):
    code, out, err = cli(*args, "--device", "cuda")
    assert_one_line_error(code, out, err, args[0], "--device cuda:", "sees no GPU", "--device cpu")


@pytest.mark.parametrize("device", ["cuda:banana", "warp"])
def test_a_device_torch_does_not_know_is_one_line(cli, device):
    code, out, err = cli("show", "--device", device)
    assert_one_line_error(code, out, err, "show", f"--device {device!r}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where PyTorch sees no GPU")
def test_calibrate_checks_every_device_of_devices(cli):
    code, out, err = cli("calibrate", "--devices", "cpu,cuda:1")
    assert_one_line_error(code, out, err, "calibrate", "--device cuda:1")


def test_calibrate_refuses_unknown_kernels_before_measuring(cli, tmp_path):
    code, out, err = cli("calibrate", "--device", "cpu", "--quick", "--kernels", "flashy_attention")
    assert_one_line_error(code, out, err, "calibrate", "unknown kernel 'flashy_attention'")
    assert not (tmp_path / "attn-dispatch-home" / "journals").exists()


@pytest.mark.parametrize("command", ["show", "check", "export"])
def test_a_damaged_stored_table_is_named(cli, tmp_path, command):
    stored = store_table(honest_table())
    stored.write_text("{ not json")
    args = ["export", tmp_path / "out.json"] if command == "export" else [command]
    code, out, err = cli(*args)
    assert_one_line_error(code, out, err, command, str(stored), "skipped a damaged table file")
    if command == "export":
        assert "attn-dispatch export OUT --table PATH" in err


@pytest.mark.parametrize("command", ["show", "check"])
def test_a_damaged_table_argument_is_named(cli, tmp_path, command):
    path = tmp_path / "broken.json"
    path.write_text("[1, 2")
    code, out, err = cli(command, path)
    assert_one_line_error(code, out, err, command, str(path))


def test_importing_a_foreign_json_says_it_is_not_a_table(cli, tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"a": 1}))
    code, out, err = cli("import", path)
    assert_one_line_error(code, out, err, "import", str(path), "not an attn-dispatch table")
    assert "upgrade" not in err and "format_version" not in err


def test_merge_refuses_a_file_given_twice(cli, tmp_path):
    path = save_table(honest_table(), tmp_path / "mine.json")
    code, out, err = cli("merge", path, path, "--out", tmp_path / "merged.json")
    assert_one_line_error(code, out, err, "merge", "is the same file as", "count its points twice")
    copy = tmp_path / "copy.json"
    copy.write_bytes(path.read_bytes())
    code, out, err = cli("merge", path, copy, "--out", tmp_path / "merged.json")
    assert_one_line_error(code, out, err, "merge", "holds the same calibration as")
    assert not (tmp_path / "merged.json").exists()


def test_merge_replaces_a_stored_table_only_with_force(cli, tmp_path):
    stored = store_table(honest_table())
    before = stored.read_bytes()
    first = save_table(honest_table(created="2026-11-01T00:00:00Z"), tmp_path / "first.json")
    second = save_table(honest_table(created="2026-11-02T00:00:00Z"), tmp_path / "second.json")
    code, out, err = cli("merge", first, second)
    assert_one_line_error(code, out, err, "merge", f"a stored table is already at {stored}", "--out PATH", "--force")
    assert stored.read_bytes() == before
    code, out, _ = cli("merge", first, second, "--force")
    assert code == 0 and f"written to {stored}" in out and stored.read_bytes() != before


def test_devices_writes_nothing(cli, tmp_path):
    home = tmp_path / "attn-dispatch-home"
    code, out, _ = cli("devices")
    assert code == 0 and out.startswith("cpu: ")
    assert not home.exists()


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_import_no_torch(flag):
    probe = (f"import sys\nfrom attn_dispatch.dispatcher.cli import main\ntry:\n    main([{flag!r}])\nexcept SystemExit:\n"
             "    pass\nprint('heavy:', sorted(m for m in ('torch', 'sklearn', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.stdout.splitlines()[-1] == "heavy: []"
    assert "attn-dispatch" in done.stdout


def test_an_unwritable_output_file_is_one_line(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = cli("show", save_table(honest_table(), tmp_path / "t.json"), "--plot", blocker / "map.png")
    assert code == ERROR_EXIT and "Traceback" not in err and len(err.splitlines()) == 1
