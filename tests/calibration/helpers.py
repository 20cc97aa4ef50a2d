"""Shared pieces of the calibration tests: tiny configs and deliberately broken kernels."""

from __future__ import annotations

import torch

from attn_dispatch.calibration.config import CalibrationConfig
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.kernels.problem import Problem

# A kernel set small enough for a CPU test: the reference path, one chunked and one split-KV.
TINY_KERNELS = "math,chunked[q=128,kv=1024],small_q[splits=8]"


def small_config(tmp_path, **changes) -> CalibrationConfig:
    """A CPU calibration of a few problems with the QUICK timer, files under `tmp_path`."""
    options = dict(
        devices=("cpu",), quick=True, kernels=TINY_KERNELS, problems=6, tune_trials=0,
        threads=1, storage=str(tmp_path / "calibration.journal"), results=str(tmp_path / "results.jsonl"),
        budget_s=120.0, allow_busy=True,  # test machines are shared: noise must not stop a functional test
    )
    options.update(changes)
    return CalibrationConfig(**options)


def problem(q_len: int = 8, kv_len: int = 64, dtype: str = "float32", **changes) -> Problem:
    fields = dict(batch=1, q_heads=4, kv_heads=2, q_len=q_len, kv_len=kv_len, head_dim=64, value_dim=64, dtype=dtype)
    fields.update(changes)
    return Problem(**fields)


class WrongKernel(MathKernel):
    """The math path with its output 10% off (outside every dtype's tolerance): runs fine, silently wrong."""

    family = "wrong_math"

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem):
        return super().run(query, key, value, attn_mask, scale, enable_gqa, problem) * 1.1


class OutOfMemoryKernel(MathKernel):
    """Raises what the CUDA caching allocator raises when the card is full."""

    family = "oom_math"

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")


class CpuOutOfMemoryKernel(MathKernel):
    """Raises what PyTorch's CPU allocator raises when RAM runs out."""

    family = "cpu_oom_math"

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")


class RefusingKernel(MathKernel):
    """Declares every problem unsupported; running it anyway is a test failure."""

    family = "refusing"

    def _own_reasons(self, problem):
        return ["refuses everything (test kernel)"]

    def run(self, *args, **kwargs):
        raise AssertionError("an unsupported kernel must never be run")


class BrokenKernel(MathKernel):
    """Raises an ordinary error (a backend bug)."""

    family = "broken"

    def run(self, *args, **kwargs):
        raise ValueError("backend bug")
