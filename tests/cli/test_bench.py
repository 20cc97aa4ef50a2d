"""`attn-dispatch bench` on the CPU: small shapes, one round, output parsed (Markdown and JSON),
whether the machine was busy and the closing verdict; `attn-dispatch kernels` says a busy machine too."""

from __future__ import annotations

import json
import math
import re

import pytest

from attn_dispatch.calibration import noise as noise_module
from attn_dispatch.calibration.bench_report import geometric_mean
from attn_dispatch.calibration.noise import BUSY_CPU_SHARE, Noise
from attn_dispatch.calibration.scenario_bench import SCENARIOS, scenario_shapes
from attn_dispatch.models.environment import COMMIT

FAST = ("--size", "small", "--rounds", "1", "--shape-budget", "0.2", "--quiet")
# Every reason `bench` gives for not running a path: over the budget and predicted hopeless are
# decided before timing; the first-pass guard depends on how busy the machine is.
SKIP_REASONS = ("skipped: over budget", "skipped: predicted hopeless", "skipped: the shape's first pass took")


def test_scenario_shapes_have_the_issue_structure():
    full = scenario_shapes("all", size="full", device_type="cuda")
    assert {s.suite for s in full} == set(SCENARIOS)
    llm = [s.problem for s in full if s.suite != "video"]
    assert all((p.q_heads, p.kv_heads, p.head_dim) == (32, 8, 128) for p in llm)
    assert all(p.causal and p.q_len == p.kv_len for s in full if s.suite == "prefill" for p in [s.problem])
    assert all(p.mask_kind == "bool" and p.q_len < p.kv_len for s in full if s.suite == "fill" for p in [s.problem])
    decode = [s.problem for s in full if s.suite == "decode"]
    assert {p.q_len for p in decode} == {1, 4, 16} and max(p.kv_len for p in decode) == 131072
    video = [s.problem for s in full if s.suite == "video"]
    assert all(p.head_dim == 64 and not p.causal and 16 <= p.q_heads <= 24 for p in video)
    assert min(p.q_len for p in video) == 8192 and max(p.q_len for p in video) == 131072
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        scenario_shapes("nope", size="small", device_type="cpu")


def test_geometric_mean():
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([None, math.inf]) is None


def test_bench_decode_markdown_and_json(cli, tmp_path):
    json_path, md_path = tmp_path / "bench.json", tmp_path / "bench.md"
    code, out, _ = cli("bench", "--scenario", "decode", *FAST, "--json", json_path, "--md", md_path)
    assert code == 0
    assert md_path.read_text() == out
    for condition in ("- device: cpu", "- fingerprint:", "- dtypes: decode: float32", "- table used:", "- timing:",
                      "- memory budget: none"):
        assert condition in out
    rows = [line for line in out.splitlines() if line.startswith("| decode B1 ")]
    assert len(rows) == 4 and all(line.count("|") == 11 for line in rows)
    report = json.loads(json_path.read_text())
    assert report["kind"] == "attn-dispatch bench" and set(report["summary"]) == {"decode", "all"}
    summary = report["summary"]["decode"]
    assert summary["shapes"] == 4 and summary["oracle_geomean"] > 0 and summary["pytorch_geomean"] > 0
    for shape in report["shapes"]:
        paths = {p["path"]: p for p in shape["paths"]}
        assert {"dispatcher", "pytorch_default", "math"} <= set(paths)
        assert paths["dispatcher"]["status"] == "ok" and paths["dispatcher"]["reps"] >= 1
        assert shape["chosen"] and shape["oracle"] in paths
        _assert_ratios_consistent(shape, paths)


def _assert_ratios_consistent(shape: dict, paths: dict) -> None:
    """The report's oracle and ratios follow from its own medians. Speed itself is never asserted:
    on a busy machine any path can be preempted (ratios belong in benchmarks, not in tests)."""
    timed = {label: p["median_s"] for label, p in paths.items() if p["status"] == "ok"}
    assert all(math.isfinite(t) and t > 0 for t in timed.values())
    singles = {label: t for label, t in timed.items() if paths[label]["role"] != "dispatcher"}
    assert shape["oracle"] == min(singles, key=singles.get)
    mine = timed["dispatcher"]
    assert shape["ratio_to_oracle"] == pytest.approx(mine / singles[shape["oracle"]])
    assert shape["ratio_to_pytorch"] == pytest.approx(mine / timed["pytorch_default"])


def test_bench_memory_budget_skips_and_records(cli, tmp_path):
    json_path = tmp_path / "bench.json"
    code, out, _ = cli("bench", "--scenario", "video", *FAST, "--memory-budget", "12MiB", "--json", json_path)
    assert code == 0
    report = json.loads(json_path.read_text())
    assert report["conditions"]["memory budget"] == "12.0 MiB"
    statuses = {(p["path"], p["status"]) for s in report["shapes"] for p in s["paths"]}
    assert ("math", "skipped") in statuses  # its 1024 x 1024 x 4 heads score matrix is over 12 MiB
    skipped = [p for s in report["shapes"] for p in s["paths"] if p["status"] == "skipped"]
    assert all(p["reason"].startswith(SKIP_REASONS) for p in skipped), [p["reason"] for p in skipped]
    # over the budget is decided from declared sizes before anything runs, the same on any machine,
    # and the first-pass time guard never skips math (a baseline)
    maths = {p["status"]: p["reason"] for s in report["shapes"] for p in s["paths"] if p["path"] == "math"}
    assert set(maths) <= {"ok", "skipped"} and maths["skipped"].startswith("skipped: over budget")
    for p in skipped:
        if p["reason"].startswith("skipped: over budget"):
            inputs, workspace, limit = map(int, re.findall(r"(\d+) B", p["reason"]))
            assert inputs + workspace > limit == 12 * 2**20 and workspace == p["workspace_bytes"]
    assert "math: skipped" in out


def test_bench_rejects_bad_options(cli):
    code, _, err = cli("bench", "--rounds", "0", "--size", "small")
    assert code == 2 and "--rounds must be at least 1" in err
    code, _, err = cli("bench", "--memory-budget", "lots", "--size", "small")
    assert code == 2 and "--memory-budget='lots' is not a memory size" in err


def test_first_pass_budget_skips_the_slowest_kernels_but_never_the_baselines():
    from attn_dispatch.calibration.scenario_bench import BenchPath, BenchSettings, PytorchDefault, bench_shape
    from attn_dispatch.kernels import kernel_from_name

    (shape,) = scenario_shapes("decode", size="small", device_type="cpu")[:1]
    paths = [BenchPath("pytorch_default", PytorchDefault(), "pytorch"),
             BenchPath("small_q[splits=8]", kernel_from_name("small_q[splits=8]"), "kernel", 1e-4),
             BenchPath("math", kernel_from_name("math"), "kernel", 1e-3)]
    result = bench_shape(shape, "cpu", paths, settings=BenchSettings(rounds=1, min_rounds=1, first_pass_budget_s=0.0))
    statuses = {p.label: (p.status, p.reason) for p in result.paths}
    assert statuses["pytorch_default"][0] == "ok" and statuses["math"][0] == "ok"
    assert statuses["small_q[splits=8]"][0] == "skipped" and "first pass took" in statuses["small_q[splits=8]"][1]
    assert result.oracle.label in {"pytorch_default", "math"} and result.rounds == 1


@pytest.mark.parametrize("git", ["no .git", "no git"])
def test_bench_commit_without_git_comes_from_the_environment(monkeypatch, git):
    import subprocess

    from attn_dispatch.dispatcher.commands import _bench_run

    def fake_run(command, **kwargs):
        if git == "no git":
            raise FileNotFoundError("git")
        return subprocess.CompletedProcess(command, 128, stdout="", stderr="fatal: not a git repository")

    monkeypatch.setattr(_bench_run.subprocess, "run", fake_run)
    monkeypatch.delenv(COMMIT.name, raising=False)
    assert _bench_run._git_commit() == "unknown"
    monkeypatch.setenv(COMMIT.name, "f646ba7")
    assert _bench_run._git_commit() == "f646ba7"


STARVED = Noise(median_s=2e-3, spread=0.05, cpu_share=BUSY_CPU_SHARE / 2, cores=2)


def test_bench_says_a_busy_machine_and_ends_with_a_verdict(cli, monkeypatch):
    monkeypatch.setattr(noise_module, "probe_noise", lambda device: STARVED)  # both probes starved
    code, out, _ = cli("bench", "--scenario", "decode", *FAST)
    assert code == 0 and "- machine: busy before and after timing (reference point 2.00 ms" in out
    last = out.rstrip().splitlines()[-1]
    assert re.match(r"\*\*Verdict:\*\* ((no )?gain on this machine|no verdict while this machine is busy): ", last)
    assert last.endswith("the machine was busy before and after timing, so these ratios carry its noise: run it "
                         "again when it is quieter")


def test_kernels_says_a_busy_machine(cli, monkeypatch, tmp_path):
    from attn_dispatch.calibration import measure

    record = {"suite": "decode", "shape": "decode B1", "kernel": "math", "status": "ok", "median_s": 1e-3,
              "iqr_s": 1e-4, "peak_bytes": None, "rel_error": 1e-7, "reason": ""}
    monkeypatch.setattr(measure, "run_kernel_table", lambda device, shapes: ("| table |", [record]))
    monkeypatch.setattr(noise_module, "probe_noise", lambda device: STARVED)
    code, out, _ = cli("kernels", "--device", "cpu", "--json", tmp_path / "k.json")
    assert code == 0 and "Machine: busy before and after timing (" in out
    assert "note: the machine was busy before and after timing (" in out and "run it again when the machine is quieter" in out
    saved = json.loads((tmp_path / "k.json").read_text())
    assert saved["machine"]["busy"] is True and saved["kernels"] == [record]
    quiet = Noise(median_s=2e-3, spread=0.05, cpu_share=1.0, cores=2)
    monkeypatch.setattr(noise_module, "probe_noise", lambda device: quiet)
    code, out, _ = cli("kernels", "--device", "cpu")
    assert code == 0 and "Machine: quiet before and after timing" in out and "note:" not in out
