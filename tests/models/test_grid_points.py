"""Grid runs as calibration points (`bench.grid_measurements`) and the held-out shape draw
(`bench.llm_grid.heldout_problems`)."""

from __future__ import annotations

import gzip
import json

import pytest

from bench.grid_measurements import grid_measurements, grid_times, kernel_of_path, read_grid
from bench.llm_grid import GRID_KV_LENS, GRID_Q_LENS, HELDOUT_KV_BYTES, heldout_problems, summarize

PROBLEM = {"batch": 1, "q_heads": 32, "kv_heads": 8, "q_len": 1, "kv_len": 2048, "head_dim": 128, "value_dim": 128,
           "dtype": "bfloat16", "causal": False, "mask_kind": "none", "mask_shape": [], "device_type": "cuda",
           "strided": False, "broadcast_inputs": False}


def write_grid(tmp_path, rows, name="grid.jsonl"):
    """A grid file as `bench.llm_grid` writes it (gzipped where `name` ends in .gz, as the recorded ones are)."""
    path = tmp_path / name
    lines = [{"conditions": {"device": "cuda"}, "shapes": len(rows)}, *rows]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return str(path)


def test_paths_map_to_kernel_names():
    assert kernel_of_path("pytorch") == "sdpa_default"
    assert kernel_of_path("kernel:small_q[splits=8]") == "small_q[splits=8]"
    assert kernel_of_path("shipped") is None and kernel_of_path("table") is None


def test_a_row_becomes_points_per_kernel(tmp_path):
    row = {"problem": PROBLEM, "chosen": {}, "failed": {"kernel:small_q[splits=1]": "OutOfMemoryError: CUDA out of memory"},
           "paths": {"pytorch": {"cold_s": 0.06, "median_s": 3e-5, "iqr_s": 1e-6, "samples": 5},
                     "kernel:sdpa_flash": {"cold_s": 0.001, "median_s": 4e-5, "iqr_s": 2e-6, "samples": 5},
                     "kernel:math": {"cold_s": 0.01, "median_s": None, "once_s": 2e-3},
                     "shipped": {"cold_s": 0.2, "median_s": 3.1e-5, "iqr_s": 1e-6, "samples": 5}}}
    points = {m.kernel: m for m in grid_measurements([write_grid(tmp_path, [row])], device_key="card")}
    assert set(points) == {"sdpa_default", "sdpa_flash", "math", "small_q[splits=1]"}  # no dispatcher column
    assert points["sdpa_default"].ok and points["sdpa_default"].median_s == 3e-5 and points["sdpa_default"].reps == 5
    assert points["math"].ok and points["math"].median_s == 2e-3 and points["math"].reps == 1  # a loser timed once
    assert points["small_q[splits=1]"].status == "infeasible" and not points["small_q[splits=1]"].ok
    assert all(m.device_key == "card" and m.problem.kv_len == 2048 for m in points.values())


def test_grid_times_keep_shapes_with_two_timed_kernels(tmp_path):
    alone = {"problem": {**PROBLEM, "kv_len": 512}, "failed": {},
             "paths": {"pytorch": {"median_s": 3e-5, "iqr_s": 0.0, "samples": 5}}}
    pair = {"problem": PROBLEM, "failed": {},
            "paths": {"pytorch": {"median_s": 3e-5, "iqr_s": 0.0, "samples": 5},
                      "kernel:sdpa_flash": {"median_s": 2e-5, "iqr_s": 0.0, "samples": 5}}}
    shapes = grid_times(write_grid(tmp_path, [alone, pair]))
    assert [(p.kv_len, times) for p, times in shapes] == [(2048, {"sdpa_default": 3e-5, "sdpa_flash": 2e-5})]


@pytest.mark.parametrize("name", ["grid.jsonl", "grid.jsonl.gz"])
def test_a_gzipped_grid_reads_as_the_plain_one(tmp_path, name, capsys):
    pair = {"problem": PROBLEM, "failed": {},
            "paths": {"pytorch": {"median_s": 3e-5, "iqr_s": 0.0, "samples": 5},
                      "kernel:sdpa_flash": {"median_s": 2e-5, "iqr_s": 0.0, "samples": 5},
                      "shipped": {"median_s": 2.1e-5, "iqr_s": 0.0, "samples": 5}}}
    path = write_grid(tmp_path, [pair], name)
    assert read_grid(path) == [pair]  # the conditions line left out
    assert [times for _, times in grid_times(path)] == [{"sdpa_default": 3e-5, "sdpa_flash": 2e-5}]
    summarize(path)
    assert "1 shapes of 1" in capsys.readouterr().out


def test_heldout_shapes_are_off_the_grid_and_drawn_the_same_each_time():
    problems = heldout_problems(120, seed=1)
    assert problems == heldout_problems(120, seed=1) and problems != heldout_problems(120, seed=2)
    assert len(problems) == 120
    assert not any(p.q_len in GRID_Q_LENS and p.kv_len in GRID_KV_LENS for p in problems)
    assert all(2 * p.batch * p.kv_heads * p.kv_len * p.head_dim * 2 <= HELDOUT_KV_BYTES for p in problems)
    assert all(p.q_len <= p.kv_len for p in problems)
    assert all(p.q_len == p.kv_len for p in problems if p.causal)
    assert {p.q_len == 1 for p in problems} == {True, False}


def test_paired_ratio_is_the_median_of_per_round_ratios():
    from bench.llm_grid import paired_lines, paired_ratios

    def row(chosen, mine, theirs):
        return {"problem": PROBLEM, "chosen": {"shipped": chosen},
                "paths": {"pytorch": {"samples_s": theirs}, "shipped": {"samples_s": mine}}}

    # round 2's host drift slows both paths alike: per-round ratios are 1.0, 1.0, 1.1
    kept = row("sdpa_default", [10e-6, 20e-6, 11e-6], [10e-6, 20e-6, 10e-6])
    assert paired_ratios(kept, "shipped") == 1.0
    assert paired_ratios({"paths": {"pytorch": {"median_s": 1.0}}}, "shipped") is None  # no per-round samples
    slow_pick = row("sdpa_flash", [13e-6] * 3, [10e-6] * 3)
    lines = paired_lines([kept, slow_pick])
    assert "kept PyTorch's call on 1" in lines[0] and "0 >3% slower); another kernel on 1 (1 >3% slower)" in lines[0]
    assert lines[1].startswith("  1.300x sdpa_flash: B1 32/8 Lq1 Lk2048 D128 bfloat16")


def test_the_a_a_control_counts_the_shapes_noise_alone_puts_over_the_margin():
    from bench.llm_grid import CONTROL, paired_lines

    def row(again):
        return {"problem": PROBLEM, "chosen": {},
                "paths": {"pytorch": {"samples_s": [10e-6] * 3}, CONTROL: {"samples_s": again}}}

    lines = paired_lines([row([10e-6] * 3), row([10.5e-6] * 3), row([9e-6] * 3)])
    assert lines == [f"{CONTROL} (A/A control), paired per round: 3 shapes, median 1.0000, quartiles 0.900-1.050, "
                     "1 >3% slower, 1 >3% faster"]


def test_path_names_name_the_bad_label():
    import argparse

    import pytest

    from bench.llm_grid import _path_names

    assert _path_names("pytorch, shipped") == {"pytorch", "shipped"}
    assert _path_names("pytorch,pytorch_again") == {"pytorch", "pytorch_again"}
    with pytest.raises(argparse.ArgumentTypeError, match="unknown \\['flash'\\]"):
        _path_names("pytorch,flash")
