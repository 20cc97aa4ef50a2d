"""Kernel names <-> kernel objects, and the default set of variants.

Grammar: ``family`` | ``family[key=value,...]`` | ``convert[CONVERSION]+<plain kernel name>``,
e.g. ``chunked[q=256,kv=4096]``, ``small_q[splits=16]``, ``convert[fp32->bf16]+sdpa_flash``,
``convert[contiguous]+chunked[q=512,kv=4096]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from attn_dispatch.kernels.accuracy import LOSSLESS, AccuracyPolicy, parse_conversion
from attn_dispatch.kernels.base import Kernel, interpreting
from attn_dispatch.kernels.chunked import ChunkedKernel
from attn_dispatch.kernels.convert import CONTIGUOUS, ConvertKernel
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.kernels.sdpa_default import SDPA_BACKEND_KERNELS
from attn_dispatch.kernels.sdpa_gqa_fold import SdpaGqaFoldKernel
from attn_dispatch.kernels.small_q import SmallQKernel
from attn_dispatch.kernels.triton_decode import TritonDecodeKernel
from attn_dispatch.kernels.triton_flash import TritonFlashKernel

PLAIN_FAMILIES: dict[str, type[Kernel]] = {
    cls.family: cls
    for cls in (
        MathKernel, ChunkedKernel, SmallQKernel, TritonFlashKernel, TritonDecodeKernel, *SDPA_BACKEND_KERNELS,
        SdpaGqaFoldKernel,
    )
}
TRITON_FAMILIES = (TritonFlashKernel.family, TritonDecodeKernel.family)
"""Families whose work is a Triton kernel (under ``TRITON_INTERPRET=1``, Triton's interpreter)."""
FAMILIES = (*PLAIN_FAMILIES, ConvertKernel.family)
MAX_NAME_LENGTH = 200

_PLAIN = re.compile(r"^(?P<family>[a-z_]+)(?:\[(?P<params>[a-z0-9_=,]*)\])?$")
_CONVERT = re.compile(r"^convert\[(?P<conversion>[a-z0-9\->]+)\]\+(?P<inner>.+)$")


def _parse_params(text: str, name: str) -> dict[str, int]:
    params: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise ValueError(f"kernel name {name!r}: parameter {item!r} is not of the form key=<integer>")
        params[key] = int(value)
    return params


def _plain_from_name(name: str) -> Kernel:
    match = _PLAIN.match(name)
    if not match or match["family"] not in PLAIN_FAMILIES:
        raise ValueError(f"unknown kernel {name!r}: known families are {', '.join(FAMILIES)}")
    cls = PLAIN_FAMILIES[match["family"]]
    params = _parse_params(match["params"] or "", name)
    try:
        return cls(**params)
    except TypeError:
        allowed = ", ".join(getattr(cls, "PARAM_SPACE", {})) or "none"
        raise ValueError(f"kernel name {name!r}: {cls.family} takes parameters: {allowed}") from None


def kernel_from_name(name: str, *, policy: AccuracyPolicy = LOSSLESS) -> Kernel:
    """Build any kernel variant from its name (inverse of ``kernel.name``); ValueError for names that are not ours."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"kernel name must be a non-empty string of at most {MAX_NAME_LENGTH} characters, got {name!r}")
    match = _CONVERT.match(name)
    if match is None:
        kernel = _plain_from_name(name)
    else:
        inner = _plain_from_name(match["inner"])
        if match["conversion"] == CONTIGUOUS:
            kernel = ConvertKernel(inner, policy=policy)
        else:
            kernel = ConvertKernel(inner, *parse_conversion(match["conversion"]), policy=policy)
    if kernel.name != name:
        raise ValueError(f"kernel name {name!r} is not canonical; write it as {kernel.name!r}")
    return kernel


# Default parameterisations: small, medium and large blocks for an uncalibrated dispatcher (calibration tunes them).
DEFAULT_CHUNKED = (ChunkedKernel(q=128, kv=1024), ChunkedKernel(q=512, kv=4096), ChunkedKernel(q=2048, kv=16384))
DEFAULT_SMALL_Q = (SmallQKernel(splits=1), SmallQKernel(splits=8), SmallQKernel(splits=32))
# Hopper-class cards: 128-row query blocks, 64-key blocks, 8 warps, 3 stages; gfx906 (64 KiB LDS) and small head
# dims: smaller blocks and fewer warps.
DEFAULT_TRITON_FLASH = (TritonFlashKernel(bm=128, bn=64, w=8, s=3), TritonFlashKernel(bm=64, bn=32, w=4, s=2))
# Flash-decoding: enough (batch x K/V head, split) programs to fill the card; 64 splits of 32-key blocks fit
# gfx906's LDS at head dim 128.
DEFAULT_TRITON_DECODE = (TritonDecodeKernel(splits=16, bn=64, w=4, s=2), TritonDecodeKernel(splits=64, bn=32, w=4, s=2))
# What a conversion hands its inputs to: the fused backends, one portable kernel of each kind, and the Triton
# kernels' small configurations (gfx906: bf16 converted to fp16 runs at its dot2 rate).
CONVERT_INNER = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "chunked[q=512,kv=4096]", "small_q[splits=8]",
                 DEFAULT_TRITON_FLASH[-1].name, DEFAULT_TRITON_DECODE[-1].name)
CONVERSIONS = ("fp16->fp32", "bf16->fp32", "bf16->fp16", "fp16->bf16", "fp32->bf16", "fp32->fp16", CONTIGUOUS)


def all_kernels(*, policy: AccuracyPolicy = LOSSLESS) -> list[Kernel]:
    """Every kernel variant in its default parameterisations (supported here or not)."""
    kernels: list[Kernel] = [MathKernel(), *DEFAULT_CHUNKED, *DEFAULT_SMALL_Q, *DEFAULT_TRITON_FLASH, *DEFAULT_TRITON_DECODE]
    kernels += [cls() for cls in SDPA_BACKEND_KERNELS]
    kernels.append(SdpaGqaFoldKernel())
    for conversion in CONVERSIONS:
        for inner in CONVERT_INNER:
            kernels.append(kernel_from_name(f"convert[{conversion}]+{inner}", policy=policy))
    return kernels


def portable_kernels(*, policy: AccuracyPolicy = LOSSLESS) -> list[Kernel]:
    """What a card without fused SDPA backends has (gfx906): math, chunked, small_q, Triton kernels, convert."""
    return [k for k in all_kernels(policy=policy) if not uses_fused_backend(k)]


def uses_fused_backend(kernel: Kernel) -> bool:
    """Whether PyTorch's SDPA (a backend or its default) does the work, a conversion's inner kernel included."""
    return working_family(kernel).startswith("sdpa_")


def interpreted(kernel: Kernel) -> bool:
    """Whether `kernel`'s work would run under Triton's interpreter here: left out of serving sets."""
    return working_family(kernel) in TRITON_FAMILIES and interpreting()


def serving(kernels: list[Kernel]) -> list[Kernel]:
    """`kernels` without the interpreted ones (`interpreted`): what a dispatcher chooses from and calibration times."""
    return [kernel for kernel in kernels if not interpreted(kernel)]


def working_family(kernel: Kernel) -> str:
    """The family of the kernel that does the work: a conversion's inner kernel's, else its own."""
    return (kernel.inner if isinstance(kernel, ConvertKernel) else kernel).family


def tuned_siblings(names: Iterable[str], kernels: Iterable[Kernel]) -> list[Kernel]:
    """The kernels `names` holds that `kernels` lacks but whose plain family it has: configurations a
    calibration tuned (``small_q[splits=64]`` beside ``small_q[splits=8]``) for the set to run.
    Conversions and names this version does not build are left out."""
    kernels = list(kernels)
    have = {kernel.name for kernel in kernels}
    families = {kernel.family for kernel in kernels if not isinstance(kernel, ConvertKernel)}
    siblings = []
    for name in names:
        if name in have or _CONVERT.match(name):
            continue
        try:
            kernel = _plain_from_name(name)
        except ValueError:
            continue
        if kernel.family in families and kernel.name == name:
            have.add(name)
            siblings.append(kernel)
    return siblings


def param_space(family: str) -> dict[str, list[int]]:
    """Tunable parameters of a family and their candidate values (for optuna)."""
    if family not in PLAIN_FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}: known families are {', '.join(PLAIN_FAMILIES)}")
    return dict(getattr(PLAIN_FAMILIES[family], "PARAM_SPACE", {}))
