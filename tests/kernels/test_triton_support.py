"""`kernels._triton_support`: why Triton can or cannot run our kernels, with the GPU faked."""

from __future__ import annotations

import subprocess
import sys

from attn_dispatch.kernels import _triton_support as support
from attn_dispatch.kernels import base


def fake_gpu(monkeypatch, arch: str, capability: tuple[int, int], triton: tuple[int, int] | None, *,
             hip: bool) -> None:
    """Answer `triton_reasons` as a machine with this GPU and Triton would."""
    monkeypatch.setattr(support, "gpu_architecture", lambda device_index=None: (arch, capability))
    monkeypatch.setattr(support, "triton_version", lambda: triton)
    monkeypatch.setattr(support.torch.version, "hip", "6.2" if hip else None)


def test_gfx906_needs_triton_3_8(monkeypatch):
    fake_gpu(monkeypatch, "gfx906", (9, 0), (3, 6), hip=True)
    [reason] = support.triton_reasons("cuda", "float16")
    assert "gfx906" in reason and ">= 3.8" in reason
    fake_gpu(monkeypatch, "gfx906", (9, 0), (3, 8), hip=True)
    assert support.triton_reasons("cuda", "float16") == []


def test_hopper_runs_every_half_and_fp32(monkeypatch):
    fake_gpu(monkeypatch, "sm_90", (9, 0), (3, 6), hip=False)
    for dtype in ("float16", "bfloat16", "float32"):
        assert support.triton_reasons("cuda", dtype) == []
    assert "float64" in support.triton_reasons("cuda", "float64")[0]


def test_old_nvidia_cards(monkeypatch):
    fake_gpu(monkeypatch, "sm_70", (7, 0), (3, 6), hip=False)
    assert "compute capability >= 7.5" in support.triton_reasons("cuda", "float16")[0]
    fake_gpu(monkeypatch, "sm_75", (7, 5), (3, 6), hip=False)
    assert support.triton_reasons("cuda", "float16") == []
    assert "bf16" in support.triton_reasons("cuda", "bfloat16")[0]


def test_missing_or_too_old_triton(monkeypatch):
    fake_gpu(monkeypatch, "sm_90", (9, 0), None, hip=False)
    assert "not installed" in support.triton_reasons("cuda", "float16")[0]
    fake_gpu(monkeypatch, "sm_90", (9, 0), (2, 3), hip=False)
    assert "too old" in support.triton_reasons("cuda", "float16")[0]


def test_unreadable_gpu_is_a_reason(monkeypatch):
    def no_gpu(device_index=None):
        raise RuntimeError("no CUDA GPUs are available")

    monkeypatch.setattr(support, "gpu_architecture", no_gpu)
    monkeypatch.setattr(support, "triton_version", lambda: (3, 6))
    assert "no CUDA GPUs" in support.triton_reasons("cuda", "float16")[0]


def test_cpu_only_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(support, "triton_version", lambda: (3, 9))
    monkeypatch.setenv(base.INTERPRETER_VARIABLE, "0")
    assert not base.interpreting()
    assert "TRITON_INTERPRET=1" in support.triton_reasons("cpu", "float32")[0]
    monkeypatch.setenv(base.INTERPRETER_VARIABLE, "1")
    assert base.interpreting()
    assert support.triton_reasons("cpu", "float32") == []
    assert support.triton_reasons("cpu", "float16") == []
    assert support.triton_reasons("cpu", "bfloat16") == [support.INTERPRETER_BF16_REASON]
    assert "not on mps" in support.triton_reasons("mps", "float16")[0]


def test_shared_memory_limit_reads_the_opt_in_carve_out(monkeypatch):
    class Properties:
        shared_memory_per_block = 48 * 1024
        shared_memory_per_block_optin = 227 * 1024

    monkeypatch.setattr(support.torch.cuda, "get_device_properties", lambda index: Properties())
    assert support.shared_memory_limit(0) == 227 * 1024
    Properties.shared_memory_per_block_optin = 0  # a build that reports none: the plain limit
    assert support.shared_memory_limit(0) == 48 * 1024


def test_asking_does_not_import_triton_on_a_plain_cpu():
    """A CPU process without the interpreter learns why not without paying Triton's import."""
    code = ("import os, sys; os.environ['TRITON_INTERPRET'] = '0'\n"
            "from attn_dispatch.kernels._triton_support import triton_reasons\n"
            "assert triton_reasons('cpu', 'float16')\n"
            "print('triton' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"


def test_a_compiled_variant_is_the_kernels_variant_key(monkeypatch):
    """What the compile wait and the measuring's first-run exemption share: `Kernel.variant_key`; a
    Triton kernel's also fixes the lengths' divisibility (a new one compiles), a chunked kernel's not."""
    from attn_dispatch.kernels import ChunkedKernel, Problem, TritonFlashKernel

    monkeypatch.setattr(support, "_compiled", set())
    monkeypatch.setattr(support, "interpreting", lambda: False)
    even, odd = (Problem(1, 8, 8, 64, kv, 64, 64, "float16", device_type="cuda") for kv in (1024, 1023))
    flash, chunked = TritonFlashKernel(), ChunkedKernel()
    assert chunked.variant_key(even) == chunked.variant_key(odd)
    assert flash.variant_key(even) != flash.variant_key(odd)
    assert flash.variant_key(even)[:len(chunked.variant_key(even))][1:] == chunked.variant_key(even)[1:]
    assert support.compile_seconds(flash, even) == support.COMPILE_PRIOR_S
    support.mark_compiled(flash, even)
    assert support.compile_seconds(flash, even) == 0.0
    assert support.compile_seconds(flash, odd) == support.COMPILE_PRIOR_S


def test_a_first_run_costs_what_its_dtype_and_head_dims_compile(monkeypatch):
    """fp32 configurations and head dims over 128 compile longer (`COMPILE_SECONDS`, measured on the
    H200); a conversion's inner Triton kernel compiles for the converted dtype."""
    from attn_dispatch.kernels import Problem, TritonFlashKernel, kernel_from_name
    from attn_dispatch.kernels.base import compile_seconds

    monkeypatch.setattr(support, "_compiled", set())
    monkeypatch.setattr(support, "interpreting", lambda: False)
    flash = TritonFlashKernel()

    def first_run(dtype, head_dim=64, kernel=flash):
        problem = Problem(1, 8, 8, 64, 1024, head_dim, head_dim, dtype, device_type="cuda")
        return compile_seconds(kernel, problem)

    assert first_run("float16") == support.COMPILE_PRIOR_S
    half, half_wide = first_run("float16"), first_run("float16", head_dim=256)
    assert half < half_wide < first_run("float32") < first_run("float32", head_dim=256)
    converted = kernel_from_name("convert[bf16->fp32]+" + flash.name)
    assert first_run("bfloat16", kernel=converted) == first_run("float32")
    support.mark_compiled(flash, Problem(1, 8, 8, 64, 1024, 64, 64, "float32", device_type="cuda"))
    assert first_run("bfloat16", kernel=converted) == 0.0
