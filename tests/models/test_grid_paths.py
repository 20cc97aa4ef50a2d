"""The grid's path selection (`bench.llm_grid.make_paths`): extra kernels named on the command line
become ``kernel:<name>`` paths, the ``triton`` group keeps only the Triton kernels' paths, and kernel
paths come before the dispatchers (a Triton variant a kernel path compiled is compiled for them)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

from attn_dispatch.kernels import Problem, kernel_from_name
from attn_dispatch.kernels.triton_flash import TritonFlashKernel
from bench.llm_grid import _path_names, make_paths

PROBLEM = Problem(1, 4, 2, 3, 40, 16, 16, "float32", device_type="cpu")


class Interpretable(TritonFlashKernel):
    """A Triton kernel that says it runs on this CPU (the grid only asks its reasons and runner)."""

    def reasons(self, problem):
        return []


def inputs():
    query = torch.randn(1, 4, 3, 16)
    key, value = torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 16)
    return SimpleNamespace(query=query, key=key, value=value, enable_gqa=True)


def dispatchers():
    table = SimpleNamespace(kernels=[kernel_from_name("sdpa_math"), kernel_from_name("small_q[splits=2]")],
                            fast_attention=lambda *a, **k: None)
    return {"table": table, "shipped": SimpleNamespace(fast_attention=lambda *a, **k: None)}


def test_extra_kernels_become_kernel_paths_before_the_dispatchers():
    extra = (kernel_from_name("small_q[splits=4]"),)
    labels = list(make_paths(PROBLEM, inputs(), dispatchers(), extra_kernels=extra))
    assert labels.index("kernel:small_q[splits=4]") < labels.index("shipped")
    assert "kernel:small_q[splits=2]" in labels


def test_the_triton_group_keeps_only_triton_kernels():
    extra = (Interpretable(bm=16, bn=16, w=1, s=1),)
    labels = set(make_paths(PROBLEM, inputs(), dispatchers(), frozenset({"pytorch", "triton"}), extra))
    assert labels == {"pytorch", "kernel:triton_flash[bm=16,bn=16,w=1,s=1]"}


def test_path_names_know_the_triton_group():
    assert _path_names("pytorch,triton,shipped") == frozenset({"pytorch", "triton", "shipped"})
    with pytest.raises(argparse.ArgumentTypeError, match="triton"):
        _path_names("tritons")
