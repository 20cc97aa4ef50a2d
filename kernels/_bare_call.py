"""The bare ATen operator call a fused backend's plan makes (`SdpaBackendKernel.runner`), named so
that the fast path (`dispatcher.fast_path`) can make the same call in C++."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BareCall:
    """The one ATen operator call `SdpaBackendKernel.runner` makes for a problem.

    op: the operator's name (``"flash"``, ``"flash_cpu"``, ``"efficient"``, ``"cudnn"``: the
        `_scaled_dot_product_*_attention` operators), called with no mask, no dropout, the call's
        causality and scale.
    rows, out_shape: GQA folded into rows: the query reshaped to ``rows`` ``[B, Hkv, R * L, E]``
        before the call and the output to ``out_shape`` ``[B, Hq, L, Ev]`` after (None: as given).
    """

    op: str
    rows: tuple[int, ...] | None = None
    out_shape: tuple[int, ...] | None = None


def aten_binding(name: str):
    """ATen operator `name` through its generated ``torch.<name>`` binding where torch has one
    (its arguments are parsed in C++, about 2 us a call cheaper than ``torch.ops.aten.<name>.default``
    on a CPU, where the warm path's whole budget is about 1 us), else the operator overload."""
    return getattr(torch._C._VariableFunctions, name, None) or getattr(torch.ops.aten, name).default
