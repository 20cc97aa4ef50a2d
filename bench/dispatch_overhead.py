"""Per-call overhead of `Dispatcher.attention` over calling the kernel it chose directly.

For each shape: warm the dispatcher, look up the kernel and `Problem` it chose, then time rounds
of calls of (a) ``dispatcher.attention(...)``, (b) ``kernel.run(...)`` (no validation, what the
dispatcher itself calls), (c) ``kernel(...)`` (validating), (d) PyTorch's
``F.scaled_dot_product_attention`` and (e) ``F.scaled_dot_product_attention`` looked up at call
time under ``patched(dispatcher)`` (how transformers and diffusers reach it: the fast path,
`dispatcher.fast_path`, where it is built), (e') ``dispatcher.fast_attention(...)`` (the fast path's
C++ entry point called directly; `dispatcher.attention` where none is built), (e'') ``plan.run``
(the runner the plan holds: a fused backend's bare operator call, what the fast path makes in C++ for
a plan forced onto that backend, rows per `FORCED_BACKENDS`) and (f) a second
dispatcher with its hot path off (`dispatcher.hot_path`: the key tuple and dict lookup every call
took before it), and the floor any Python dispatcher pays on this host (`floor_calls`): (g) a
pure-Python pass-through to SDPA and (h) the same plus one guard check of the tensors, as the hot
path makes; interleaved so drift hits all alike. Reports the median per-call time of each and the
median extra of (a) over (b), (c) and (d), and of (e), (e'), (f), (g) and (h) over (d), and of (e') over (e''). The fast path is
built first when it is not (``attn-dispatch build-fast-path``; ~25 s on a 2-core CPU), so one run
shows the C++ path (e, e') beside the Python hot path (a) and the floors (g, h).
On CUDA it reports host time (enqueue, what the dispatcher adds) and synchronised time. The first
row of each run uses a kernel that does no work (`NullKernel`), so the extra is the dispatcher's
own cost without the kernel's timing noise.

Usage (from the repository root, as a module so bench/ does not shadow packages):
    python -m bench.dispatch_overhead [--device cpu|cuda] [--rounds 200] [--calls 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from attn_dispatch.calibration.inputs import make_inputs
from attn_dispatch.dispatcher import Dispatcher, fast_path, patched
from attn_dispatch.dispatcher.decision import NoKernelError
from attn_dispatch.dispatcher.hot_path import tensor_guard
from attn_dispatch.dispatcher.plans import cache_key
from attn_dispatch.kernels import MathKernel, Problem


class NullKernel(MathKernel):
    """Does no work (returns the query): isolates what the dispatcher adds around a kernel."""

    family = "null"

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem):
        return query


def _shape(name: str, batch: int, q_heads: int, kv_heads: int, q_len: int, kv_len: int, head_dim: int, dtype: str,
           device_type: str, *, mask: str = "none", strided: bool = False) -> tuple[str, Problem]:
    mask_shape = (1, 1, q_len, kv_len) if mask != "none" else ()  # one mask for every batch and head
    return name, Problem(batch, q_heads, kv_heads, q_len, kv_len, head_dim, head_dim, dtype, mask_kind=mask,
                         mask_shape=mask_shape, device_type=device_type, strided=strided)


CPU_SHAPES = [
    _shape("decode gqa4 Lk=128 fp32", 1, 8, 2, 1, 128, 64, "float32", "cpu"),
    _shape("tiny prefill 16x16 fp32", 1, 4, 4, 16, 16, 32, "float32", "cpu"),
    _shape("tiny prefill bool-mask", 1, 4, 4, 16, 16, 32, "float32", "cpu", mask="bool"),
    _shape("transformers layout (strided)", 2, 4, 4, 8, 8, 32, "float32", "cpu", strided=True),
]
CUDA_SHAPES = [
    _shape("H200 decode gqa4 Lk=4096 bf16", 1, 32, 8, 1, 4096, 128, "bfloat16", "cuda"),
    _shape("H200 decode gqa4 Lk=32768 bf16", 1, 32, 8, 1, 32768, 128, "bfloat16", "cuda"),
    _shape("H200 decode batch 8 Lk=4096 fp16", 8, 32, 8, 1, 4096, 128, "float16", "cuda"),
]


FORCED_BACKENDS = {"cuda": ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"), "cpu": ("sdpa_flash",)}
"""Per device type, the fused backends whose plans a row forces (their bare operator call: the fast
path serves it in C++ where it is built)."""


def floor_calls(sdpa, tensors: tuple[torch.Tensor, ...]) -> tuple:
    """``(pass_through, guarded)``: SDPA's signature in pure Python, passing every argument on to
    `sdpa`, and the same after one `hot_path.tensor_guard` check of the call's tensors (query, key,
    value and the mask when given; built from `tensors` under the caller's inference/grad state).
    What any Python dispatcher with a per-call guard pays over calling `sdpa` directly."""
    check = tensor_guard(tensors)
    if check is None:
        raise RuntimeError("this torch has no usable TensorGuards: no guarded floor to time")

    def pass_through(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                     enable_gqa=False):
        return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    def guarded(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                enable_gqa=False):
        if check(query, key, value) if attn_mask is None else check(query, key, value, attn_mask):
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        raise RuntimeError("the floor's guard missed: the timed tensors changed")

    return pass_through, guarded


def time_round(call, calls: int, sync) -> tuple[float, float]:
    """(host seconds per call, synchronised seconds per call) over `calls` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        call()
    host = time.perf_counter()
    sync()
    end = time.perf_counter()
    return (host - start) / calls, (end - start) / calls


def bench_shape(shape: tuple[str, Problem], device, rounds: int, calls: int, *, null: bool = False,
                kernels: str | list[str] = "all") -> dict:
    inputs = make_inputs(shape[1], device)
    q, k, v, mask, gqa = inputs.query, inputs.key, inputs.value, inputs.attn_mask, inputs.enable_gqa
    ours = Dispatcher(kernels=[NullKernel()]) if null else Dispatcher(kernels=kernels)
    ours.attention(q, k, v, mask, enable_gqa=gqa)
    dict_path = Dispatcher(kernels=[NullKernel()]) if null else Dispatcher(kernels=kernels)
    dict_path._hot_path.make_hot = lambda *args: None  # the warm path before `hot_path`: key tuple and dict lookup
    dict_path.attention(q, k, v, mask, enable_gqa=gqa)
    plan = ours._plans.get(cache_key(q, k, v, mask, False, gqa))
    kernel, problem = plan.kernel, plan.problem
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    functional = torch.nn.functional
    sdpa = functional.scaled_dot_product_attention  # PyTorch's, bound before patching
    methods = {
        "dispatcher.attention": lambda: ours.attention(q, k, v, mask, enable_gqa=gqa),
        "dict path": lambda: dict_path.attention(q, k, v, mask, enable_gqa=gqa),
        "kernel.run": lambda: kernel.run(q, k, v, mask, None, gqa, problem),
        "plan.run": lambda: plan.run(q, k, v, mask, None, gqa, problem),  # the runner a plan holds (a bare call)
        "kernel(...)": lambda: kernel(q, k, v, attn_mask=mask, enable_gqa=gqa),
        "F.sdpa": lambda: sdpa(q, k, v, mask, enable_gqa=gqa),
        "patched F.sdpa": lambda: functional.scaled_dot_product_attention(q, k, v, mask, enable_gqa=gqa),
    }
    fast = ours.fast_attention
    methods["fast_attention"] = lambda: fast(q, k, v, mask, enable_gqa=gqa)
    with torch.inference_mode(), patched(ours):
        pass_through, guarded = floor_calls(sdpa, (q, k, v) if mask is None else (q, k, v, mask))
        methods["floor: pass-through"] = lambda: pass_through(q, k, v, mask, enable_gqa=gqa)
        methods["floor: pass-through + guard"] = lambda: guarded(q, k, v, mask, enable_gqa=gqa)
        samples = {name: [] for name in methods}
        for call in methods.values():  # warm-up
            time_round(call, calls, sync)
        order = list(methods)
        for round_index in range(rounds):
            shift = round_index % len(order)  # rotate: no method always follows the same one
            for name in order[shift:] + order[:shift]:
                samples[name].append(time_round(methods[name], calls, sync))
    result = {"fast_path": fast is not ours.attention, "shape": shape[0], "kernel": kernel.name, "kernel_set": "null" if null else str(kernels), "calls_per_round": calls, "rounds": rounds, "null": null}
    for index, clock in ((0, "host"), (1, "sync")):
        med = {name: statistics.median(s[index] for s in values) * 1e6 for name, values in samples.items()}
        extra_run = statistics.median((a[index] - b[index]) * 1e6 for a, b in
                                      zip(samples["dispatcher.attention"], samples["kernel.run"], strict=True))
        extra_call = statistics.median((a[index] - b[index]) * 1e6 for a, b in
                                       zip(samples["dispatcher.attention"], samples["kernel(...)"], strict=True))
        extra_sdpa = statistics.median((a[index] - b[index]) * 1e6 for a, b in
                                       zip(samples["dispatcher.attention"], samples["F.sdpa"], strict=True))
        extra_dict = statistics.median((a[index] - b[index]) * 1e6 for a, b in
                                       zip(samples["dict path"], samples["F.sdpa"], strict=True))
        extra_patched = statistics.median((a[index] - b[index]) * 1e6 for a, b in
                                          zip(samples["patched F.sdpa"], samples["F.sdpa"], strict=True))
        extra_fast = statistics.median((a[index] - b[index]) * 1e6 for a, b in
                                       zip(samples["fast_attention"], samples["F.sdpa"], strict=True))
        extra_fast_plan_run = statistics.median((a[index] - b[index]) * 1e6 for a, b in
                                                zip(samples["fast_attention"], samples["plan.run"], strict=True))
        floors = {label: statistics.median((a[index] - b[index]) * 1e6 for a, b in
                                           zip(samples[name], samples["F.sdpa"], strict=True))
                  for label, name in (("pass_through", "floor: pass-through"), ("guarded", "floor: pass-through + guard"))}
        result[clock] = {"median_us": med, "extra_us_vs_run": extra_run, "extra_us_vs_call": extra_call,
                         "extra_us_vs_sdpa": extra_sdpa, "dict_path_extra_us_vs_sdpa": extra_dict,
                         "patched_extra_us_vs_sdpa": extra_patched, "fast_extra_us_vs_sdpa": extra_fast,
                         "fast_extra_us_vs_plan_run": extra_fast_plan_run,
                         "floor_extra_us_vs_sdpa": floors}
    return result


def conditions(device: torch.device) -> dict:
    info = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": str(device),
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "cpu_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo") as handle:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if fast_path.fast_path_enabled() and fast_path.load() is None:
        started = time.perf_counter()
        print(f"building the fast path ... {fast_path.build()} ({time.perf_counter() - started:.0f} s)")
    shapes = CUDA_SHAPES if device.type == "cuda" else CPU_SHAPES
    rows = [bench_shape(s, device, args.rounds, args.calls, null=True) for s in shapes[:1]]
    rows += [bench_shape(s, device, args.rounds, args.calls) for s in shapes]
    rows += [bench_shape(s, device, args.rounds, args.calls, kernels=["sdpa_default"]) for s in shapes]
    for backend in FORCED_BACKENDS.get(device.type, ()):  # plans that run a fused operator bare
        for s in shapes:
            try:
                rows.append(bench_shape(s, device, args.rounds, args.calls, kernels=[backend]))
            except NoKernelError as error:
                print(f"{s[0]}: {backend} does not run it ({str(error).splitlines()[0][:120]})")
    results = {"conditions": conditions(device), "shapes": rows}
    for r in results["shapes"]:
        host = r["host"]
        print(f"{r['shape'][:36]:<36} {r['kernel']:<24} dispatcher {host['median_us']['dispatcher.attention']:8.2f} us  "
              f"run {host['median_us']['kernel.run']:8.2f} us  call {host['median_us']['kernel(...)']:8.2f} us  "
              f"F.sdpa {host['median_us']['F.sdpa']:8.2f} us  extra vs run {host['extra_us_vs_run']:+6.2f} us  "
              f"vs call {host['extra_us_vs_call']:+6.2f} us  vs F.sdpa {host['extra_us_vs_sdpa']:+6.2f} us  "
              f"dict path vs F.sdpa {host['dict_path_extra_us_vs_sdpa']:+6.2f} us  "
              f"patched vs F.sdpa {host['patched_extra_us_vs_sdpa']:+6.2f} us  "
              f"fast_attention vs F.sdpa {host['fast_extra_us_vs_sdpa']:+6.2f} us{'' if r['fast_path'] else ' (no fast path)'}  "
              f"vs plan.run {host['fast_extra_us_vs_plan_run']:+6.2f} us  "
              f"floor vs F.sdpa: pass-through {host['floor_extra_us_vs_sdpa']['pass_through']:+6.2f} us, "
              f"+ guard {host['floor_extra_us_vs_sdpa']['guarded']:+6.2f} us")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"dispatch_overhead_{device.type}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
