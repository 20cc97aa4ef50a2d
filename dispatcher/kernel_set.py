"""The kernels a dispatcher chooses from: a named set or the user's own list."""

from __future__ import annotations

from collections.abc import Sequence

from kernels import AccuracyPolicy, Kernel, all_kernels, kernel_from_name, portable_kernels
from kernels.sdpa_backends import SdpaDefaultKernel

KERNEL_SETS = ("all", "portable")
"""The named kernel sets (`Dispatcher(kernels=...)` and the CLI's ``--kernels`` choices)."""


def kernel_set(kernels: str | Sequence[Kernel | str], policy: AccuracyPolicy) -> dict[str, Kernel]:
    """Kernels by name: ``"all"`` / ``"portable"`` (plus ``sdpa_default``, the last-resort fallback)
    or the given kernels / kernel names, as given. Raises ValueError / TypeError naming the bad item."""
    if isinstance(kernels, str):
        if kernels not in KERNEL_SETS:
            raise ValueError(f"kernels={kernels!r}: pass 'all', 'portable' or a list of kernels / kernel names")
        chosen = all_kernels(policy=policy) if kernels == "all" else portable_kernels(policy=policy)
        chosen.append(SdpaDefaultKernel())
    else:
        chosen = [kernel_from_name(k, policy=policy) if isinstance(k, str) else k for k in kernels]
        for kernel in chosen:
            if not isinstance(kernel, Kernel):
                raise TypeError(f"kernels must hold Kernel objects or kernel names, got {kernel!r}")
    by_name: dict[str, Kernel] = {}
    for kernel in chosen:
        by_name.setdefault(kernel.name, kernel)
    return by_name
