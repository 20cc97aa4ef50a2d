"""The kernels a dispatcher chooses from: a named set or the user's own list."""

from __future__ import annotations

from collections.abc import Sequence

from attn_dispatch.kernels import AccuracyPolicy, Kernel, all_kernels, kernel_from_name, portable_kernels
from attn_dispatch.kernels.registry import serving
from attn_dispatch.kernels.sdpa_default import SdpaDefaultKernel

KERNEL_SETS = ("all", "portable")
"""The named kernel sets (`Dispatcher(kernels=...)` and the CLI's ``--kernels`` choices)."""


class LastResortDefault(SdpaDefaultKernel):
    """PyTorch's own SDPA as the portable set's last resort: tried only after every ranked kernel
    failed, never ranked. On gfx906 it is the math backend the portable kernels exist to beat; on
    a card with fused backends (a GPU emulating gfx906 with ``--kernels portable``) ranking it
    would leave the emulated card for its fused kernels."""

    last_resort = True


def kernel_set(kernels: str | Sequence[Kernel | str], policy: AccuracyPolicy) -> dict[str, Kernel]:
    """Kernels by name: ``"all"`` / ``"portable"`` (plus ``sdpa_default``, the last-resort fallback;
    without kernels Triton's interpreter would run: `kernels.registry.serving`) or the given kernels
    / kernel names, as given. Raises ValueError / TypeError naming the bad item."""
    if isinstance(kernels, str):
        if kernels not in KERNEL_SETS:
            raise ValueError(f"kernels={kernels!r}: pass 'all', 'portable' or a list of kernels / kernel names")
        if kernels == "all":
            chosen = [*serving(all_kernels(policy=policy)), SdpaDefaultKernel()]
        else:
            chosen = [*serving(portable_kernels(policy=policy)), LastResortDefault()]
    else:
        chosen = [kernel_from_name(k, policy=policy) if isinstance(k, str) else k for k in kernels]
        for kernel in chosen:
            if not isinstance(kernel, Kernel):
                raise TypeError(f"kernels must hold Kernel objects or kernel names, got {kernel!r}")
    by_name: dict[str, Kernel] = {}
    for kernel in chosen:
        by_name.setdefault(kernel.name, kernel)
    return by_name
