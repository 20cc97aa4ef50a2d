"""Whether Triton can compile and run our fused kernels for a problem's device, and why not.

Triton compiles for NVIDIA GPUs and for AMD GPUs under ROCm. gfx906 (MI50, MI60, Radeon VII) is
one of its targets from Triton 3.8 on (GCN5_1). On the CPU, Triton's interpreter
(``TRITON_INTERPRET=1``, read by Triton when a kernel is decorated, so set before this package is
imported) runs the same kernels on CPU tensors: that is how the test suite checks their numerics;
it is never fast enough to serve a call.

Nothing here imports Triton unless a problem's device could run it: a CPU process without the
interpreter never pays Triton's import.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util

import torch

from attn_dispatch.kernels.base import NO_TRITON_ON_CPU, Kernel, interpreting

MIN_TRITON = (3, 0)
"""The oldest Triton our kernels are written for (the language features they use)."""
MIN_TRITON_FOR_ARCH = {"gfx906": (3, 8)}
"""Architectures Triton learned late: the first release that compiles for each."""
MIN_CUDA_CAPABILITY = (7, 5)
"""Triton's oldest supported NVIDIA architecture (Turing)."""
MIN_CUDA_CAPABILITY_BF16 = (8, 0)
"""bf16 matrix products need Ampere or newer."""
INTERPRETER_BF16_REASON = (
    "Triton's interpreter multiplies bf16 blocks wrongly (Triton 3.9: errors of order 1e9 on a 32x64 "
    "product): bf16 runs on GPUs only"
)


@functools.cache
def triton_version() -> tuple[int, int] | None:
    """The installed Triton's (major, minor), or None when Triton is not installed. Reads the
    package's metadata: Triton itself is not imported."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        text = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:  # a source build under another distribution name
        import triton

        text = triton.__version__
    parts = [int("".join(ch for ch in part if ch.isdigit()) or 0) for part in text.split(".")[:2]]
    return (parts[0], parts[1] if len(parts) > 1 else 0)


def gpu_architecture(device_index: int | None = None) -> tuple[str, tuple[int, int]]:
    """``("gfx906", (9, 0))`` on ROCm (``gcnArchName`` without its feature flags), ``("sm_90",
    (9, 0))`` on CUDA: the current (or given) GPU's architecture and compute capability. Tests
    replace this function to fake a card."""
    index = torch.cuda.current_device() if device_index is None else device_index
    properties = torch.cuda.get_device_properties(index)
    capability = (properties.major, properties.minor)
    if torch.version.hip is not None:
        return properties.gcnArchName.split(":")[0], capability
    return f"sm_{capability[0]}{capability[1]}", capability


def shared_memory_limit(device_index: int | None = None) -> int:
    """Bytes of shared memory (LDS on AMD) one program may use on the current (or given) GPU, with
    the opt-in carve-out (227 KiB on an H100, 64 KiB on gfx906). Tests replace this function to
    fake a card."""
    index = torch.cuda.current_device() if device_index is None else device_index
    properties = torch.cuda.get_device_properties(index)
    optin = getattr(properties, "shared_memory_per_block_optin", 0)
    return int(optin or properties.shared_memory_per_block)


def _version_text(version: tuple[int, int]) -> str:
    return ".".join(map(str, version))


def triton_reasons(device_type: str, dtype: str) -> list[str]:
    """Why Triton cannot run a kernel on `device_type` inputs of `dtype` here; empty when it can.

    Never raises: a missing Triton, an old one, a CPU without the interpreter or a GPU Triton does
    not compile for are each a reason."""
    if device_type == "cpu" and not interpreting():
        return [NO_TRITON_ON_CPU]
    if device_type not in ("cpu", "cuda"):
        return [f"Triton kernels run on CUDA and ROCm GPUs, not on {device_type} devices"]
    if dtype == "float64":
        return ["Triton kernels take float16, bfloat16 and float32 inputs, not float64"]
    version = triton_version()
    if version is None:
        return ["Triton is not installed (pip install triton; on ROCm, the Triton matching your ROCm PyTorch)"]
    if version < MIN_TRITON:
        return [f"Triton {_version_text(version)} is too old: our kernels need Triton >= {_version_text(MIN_TRITON)}"]
    if device_type == "cpu":
        if dtype == "bfloat16":
            return [INTERPRETER_BF16_REASON]
        return []
    try:
        arch, capability = gpu_architecture()
    except (RuntimeError, AssertionError) as error:  # no usable GPU behind a cuda tensor's device type
        return [f"could not read the GPU's architecture: {error}"]
    needed = MIN_TRITON_FOR_ARCH.get(arch)
    if needed and version < needed:
        return [
            f"Triton {_version_text(version)} cannot compile for {arch}: it needs Triton >= {_version_text(needed)} "
            "(docs/GFX906.md says how to install one for a ROCm PyTorch)"
        ]
    if torch.version.hip is None:
        if capability < MIN_CUDA_CAPABILITY:
            return [f"Triton needs compute capability >= {_version_text(MIN_CUDA_CAPABILITY)}, this GPU has {_version_text(capability)}"]
        if dtype == "bfloat16" and capability < MIN_CUDA_CAPABILITY_BF16:
            return [f"bf16 matrix products need compute capability >= {_version_text(MIN_CUDA_CAPABILITY_BF16)}, this GPU has {_version_text(capability)}"]
    return []


COMPILE_PRIOR_S = 1.0
"""Seconds a Triton kernel's first run of a configuration takes in a process that has not run it
(Triton compiles it, or loads it from its disk cache): half precision, head dims up to
`WIDE_HEAD_DIM`. What the dispatcher weighs before it lets a call pay it."""
WIDE_HEAD_DIM = 128
COMPILE_SECONDS = {
    # (family, fp32, a head dim over WIDE_HEAD_DIM): seconds; medians of a calibration's first runs on
    # the H200, Triton 3.6 (docs/RESULTS.md#where-the-priors-constants-come-from)
    ("triton_flash", False, False): COMPILE_PRIOR_S, ("triton_flash", False, True): 1.8,
    ("triton_flash", True, False): 6.0, ("triton_flash", True, True): 27.0,
    ("triton_decode", False, False): COMPILE_PRIOR_S, ("triton_decode", False, True): 1.7,
    ("triton_decode", True, False): 2.0, ("triton_decode", True, True): 8.0,
}
INTEGER_SPECIALISATION = 16
"""Triton compiles one variant of a kernel per integer argument divisible by 16 and one for the rest."""

_compiled: set[tuple] = set()
"""Configurations run in this process (`Kernel.variant_key`): a later run of one launches at once."""


def triton_variant_key(kernel, problem) -> tuple:
    """`Kernel.variant_key` of a Triton kernel: one compiled variant also fixes the causal alignment
    and whether the lengths divide by Triton's integer specialisation."""
    return (*Kernel.variant_key(kernel, problem), problem.causal_alignment,
            problem.q_len % INTEGER_SPECIALISATION == 0, problem.kv_len % INTEGER_SPECIALISATION == 0)


def compile_seconds(kernel, problem) -> float:
    """Seconds `kernel`'s next run of `problem` spends compiling: 0 where this process has run that
    variant, or under the interpreter (nothing compiles); else `COMPILE_SECONDS` for its family, dtype
    and head dims."""
    if interpreting() or problem.device_type != "cuda" or kernel.variant_key(problem) in _compiled:
        return 0.0
    wide = max(problem.head_dim, problem.value_dim) > WIDE_HEAD_DIM
    return COMPILE_SECONDS.get((kernel.family, problem.dtype == "float32", wide), COMPILE_PRIOR_S)


def mark_compiled(kernel, problem) -> None:
    """`kernel` has run `problem` in this process: its variant is compiled (nothing is noted while
    torch.compile traces the call)."""
    if not torch.compiler.is_compiling():
        _compiled.add(kernel.variant_key(problem))
