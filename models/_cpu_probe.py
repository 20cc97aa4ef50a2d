"""A quick CPU probe: matrix-product FLOP/s per dtype, copy bandwidth, softmax rate and per-op
overhead, measured once per machine and kept in the home (`probe_store`).

The dispatcher never probes inside a call (`probe_cpu_spec` with ``now=False``): where this
machine's rates are not kept yet, its prior ranks with the probe-free constants and the probe runs
when the process exits, for the next process. Calibration probes at once (``now=True``).
"""

from __future__ import annotations

import atexit
import os
import statistics
import threading
import time
from dataclasses import replace
from types import MappingProxyType

import torch

from attn_dispatch.models.cards import CardSpec
from attn_dispatch.models.identity import DeviceIdentity, torch_threads
from attn_dispatch.models.paths import home
from attn_dispatch.models.probe_store import load_cpu_rates, save_cpu_rates

# Matrix sizes: 384^3 fp32 products take a few ms on one modern core (enough to reach MKL/oneDNN's
# steady rate); half-precision products can be 10-50x slower on CPUs without native support, so
# they use 192^3 to keep the probe short.
FP32_MATMUL_N = 384
HALF_MATMUL_N = 192
MATMUL_REPEATS = 3
# Copy bandwidth: 32 MiB is past most per-core L2 and shared L3 slices of CI-sized machines.
COPY_BYTES = 32 * 2**20
COPY_REPEATS = 5
# Per-op overhead: the median of many tiny adds.
OVERHEAD_REPEATS = 200

# The elementwise (softmax) rate is measured on a 1024 x 1024 fp32 softmax: 4 MiB, past per-core L2.
# It replaces a guess of half the matrix rate, which on the dev machine (2026-11-30) was 10x too
# fast: torch.softmax ran at 1.9 G elements/s (15 GFLOP/s at the prior's 8 FLOPs per element)
# against a 292 GFLOP/s fp32 matrix rate, and the prior ranked PyTorch's math path over its CPU
# flash kernel, which was 2.6x faster (8.4 vs 3.2 ms, 10 heads, 600 tokens, causal).
SOFTMAX_N = 1024
SOFTMAX_REPEATS = 5

# Probe-free fallback (tests, or a probe that failed): this probe on the project's 2-core dev
# machine on 2026-11-30 gave 214 GFLOP/s fp32, 280 bf16, 173 fp16, 131 fp64, 51 GB/s copy and
# 0.9 us per op; rounded down, marked as an estimate.
FALLBACK_CPU_SPEC = CardSpec(
    name="generic CPU",
    matrix_flops=MappingProxyType({"float16": 150e9, "bfloat16": 250e9, "float32": 200e9, "float64": 120e9}),
    vector_flops=100e9, bandwidth=50e9, memory_bytes=8 * 2**30, compute_units=os.cpu_count() or 1,
    launch_overhead_s=1e-6, source="probe-free fallback constants (the project's 2-core dev machine, rounded)",
    estimated=True,
)


def _best_seconds(run, repeats: int) -> float:
    run()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return min(samples)


def _matmul_rate(dtype: torch.dtype, n: int) -> float:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    return 2 * n**3 / _best_seconds(lambda: torch.matmul(a, b), MATMUL_REPEATS)


def _copy_bandwidth() -> float:
    src = torch.empty(COPY_BYTES // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / _best_seconds(lambda: dst.copy_(src), COPY_REPEATS)


def _softmax_rate() -> float:
    """FLOP/s of `torch.softmax` on fp32 rows, counted as the prior counts them."""
    from attn_dispatch.models.priors import (
        SOFTMAX_FLOPS_PER_ELEMENT,  # priors imports cards, which imports this lazily
    )

    scores = torch.randn(SOFTMAX_N, SOFTMAX_N)
    return SOFTMAX_N * SOFTMAX_N * SOFTMAX_FLOPS_PER_ELEMENT / _best_seconds(lambda: torch.softmax(scores, -1), SOFTMAX_REPEATS)


def _op_overhead() -> float:
    x = torch.ones(1)
    samples = []
    for _ in range(OVERHEAD_REPEATS):
        start = time.perf_counter()
        torch.add(x, x)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


PROBE_AT_EXIT = " (this machine's probe runs when the process exits and serves the next process)"
"""Added to the probe-free constants' source while this machine's probe waits for the exit (`explain` shows it)."""

_measured: dict[int, CardSpec] = {}  # torch threads -> this process's rates (kept or measured: one machine)
_waiting: set[tuple[str, int]] = set()  # (home, torch threads) of the probes registered to run at exit
_lock = threading.Lock()


def probe_cpu_spec(identity: DeviceIdentity | None = None, root: str | os.PathLike | None = None, *,
                   now: bool = True) -> CardSpec:
    """This CPU's rates with the threads torch runs now: the ones this process already has (read or
    measured: for any home), else kept for this machine in the home `root` (`probe_store`), else
    measured now and kept (`now`), else the probe-free constants (`FALLBACK_CPU_SPEC`) while the probe
    waits for the process's exit. Never raises for the home: a home that cannot be written only costs
    the next process its probe."""
    threads = torch.get_num_threads()
    spec = _measured.get(threads)  # a process runs on one machine, whichever home it reads
    if spec is not None:
        return spec
    identity = identity if identity is not None else DeviceIdentity.cpu()
    spec = load_cpu_rates(identity, threads, FALLBACK_CPU_SPEC, root)
    if spec is None and not now:
        waiting = (str(home(root, create=False)), threads)
        with _lock:
            if waiting not in _waiting:
                _waiting.add(waiting)
                atexit.register(_probe_and_keep, identity, threads, root)
        return replace(FALLBACK_CPU_SPEC, source=FALLBACK_CPU_SPEC.source + PROBE_AT_EXIT)
    if spec is None:
        spec = _probe_and_keep(identity, threads, root)
    _measured[threads] = spec
    return spec


def _probe_and_keep(identity: DeviceIdentity, threads: int, root: str | os.PathLike | None) -> CardSpec:
    """Measure this CPU (`measure_cpu_spec`) and keep the rates for this machine (not the constants
    a failed probe gives); torch's thread count is set to `threads` for the probe (an exit may come
    after the program changed it)."""
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        spec = measure_cpu_spec()
    finally:
        torch.set_num_threads(previous)
    if not spec.estimated:
        try:
            save_cpu_rates(identity, threads, spec, root)
        except OSError:
            pass
    return spec


def measure_cpu_spec() -> CardSpec:
    """This CPU's rates, measured now with torch's current thread count (the constants where a
    dtype cannot be multiplied)."""
    try:
        with torch.inference_mode():
            rates = {
                "float32": _matmul_rate(torch.float32, FP32_MATMUL_N),
                "float64": _matmul_rate(torch.float64, HALF_MATMUL_N),
                "bfloat16": _matmul_rate(torch.bfloat16, HALF_MATMUL_N),
                "float16": _matmul_rate(torch.float16, HALF_MATMUL_N),
            }
            bandwidth, overhead, vector = _copy_bandwidth(), _op_overhead(), _softmax_rate()
    except RuntimeError:  # a dtype this build cannot multiply: keep the constants
        return FALLBACK_CPU_SPEC
    threads = torch.get_num_threads()
    return CardSpec(
        name="CPU", matrix_flops=MappingProxyType(rates), vector_flops=vector,
        bandwidth=bandwidth, memory_bytes=FALLBACK_CPU_SPEC.memory_bytes,
        compute_units=threads, launch_overhead_s=overhead,
        source=f"measured by this machine's probe with {torch_threads(threads)}",
    )
