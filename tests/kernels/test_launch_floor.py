"""`python -m bench.triton_kernels --launch-floor` on a CPU: every path timed with the Triton launches
stubbed out (our own Python up to the launcher), and the launches restored afterwards."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from attn_dispatch.kernels import _triton_decode_launch as decode  # noqa: E402
from attn_dispatch.kernels import _triton_flash_forward as forward  # noqa: E402
from bench.triton_kernels import launch_floor_record  # noqa: E402

PATHS = {"sdpa", "triton_flash_operator", "triton_flash_direct", "triton_flash[bm=64,bn=32,w=4,s=2]",
         "triton_decode[splits=16,bn=64,w=4,s=2]"}


def test_every_path_is_timed_on_a_cpu_and_the_launches_are_restored():
    kernels = (forward.flash_forward_kernel, decode.split_kernel, decode.merge_kernel)
    record = launch_floor_record(torch.device("cpu"), calls=2, rounds=2)
    assert set(record) == PATHS
    assert all(row["median_us"] > 0 and len(row["q1_q3_us"]) == 2 for row in record.values())
    assert (forward.flash_forward_kernel, decode.split_kernel, decode.merge_kernel) == kernels
