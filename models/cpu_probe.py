"""Measuring this CPU's rates (`measure_cpu_spec`): matrix products per dtype, copy bandwidth, a
softmax's elementwise rate and the overhead of one tiny op, with torch's current thread count. The
home keeps them per machine and a process reads them (`models.probe_store.probe_cpu_spec`)."""

from __future__ import annotations

import statistics
import time
from types import MappingProxyType

import torch

from attn_dispatch.models.identity import CardSpec, torch_threads
from attn_dispatch.models.priors import SOFTMAX_FLOPS_PER_ELEMENT
from attn_dispatch.models.probe_store import FALLBACK_CPU_SPEC

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

# The elementwise (softmax) rate, on a 1024 x 1024 fp32 softmax (4 MiB, past per-core L2): a guess
# from the matrix rate was 10x off (docs/RESULTS.md#where-the-priors-constants-come-from).
SOFTMAX_N = 1024
SOFTMAX_REPEATS = 5


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
