"""The numerics gate of one point: a kernel's output on the calibration inputs against the float64
reference, on two slices of the output (the head and the tail of the query rows).

PyTorch has shipped backends that silently returned wrong results; a kernel outside its tolerance
is recorded as "inaccurate" and `calibration.gate` excludes it for the whole problem class.
"""

from __future__ import annotations

import torch

from attn_dispatch.calibration.inputs import AttentionInputs
from attn_dispatch.kernels.reference import reference_attention, relative_errors

# Query rows compared in each slice: enough to catch a wrong kernel (every kernel treats rows
# alike within a block, and the tail slice lands in the last query/key block of a tiled kernel),
# small enough that the float64 reference of a 128k-deep problem costs milliseconds.
GATE_ROWS = 64


def _row_slices(q_len: int) -> list[slice]:
    head = slice(0, min(GATE_ROWS, q_len))
    if q_len <= GATE_ROWS:
        return [head]
    return [head, slice(q_len - GATE_ROWS, q_len)]


def _slice_mask(inputs: AttentionInputs, batch: slice, rows: slice) -> torch.Tensor | None:
    """The mask for output rows `rows` of batch elements `batch`, with top-left causality folded
    in (the reference's own `is_causal` assumes rows start at 0)."""
    mask = inputs.attn_mask
    if mask is not None:
        mask = mask[batch] if mask.shape[0] > 1 else mask
        if mask.dim() >= 2 and mask.shape[-2] > 1:
            mask = mask[..., rows, :]
    if not inputs.is_causal:
        return mask
    kv_len = inputs.key.shape[-2]
    device = inputs.query.device
    allowed = torch.arange(kv_len, device=device)[None, :] <= torch.arange(rows.start, rows.stop, device=device)[:, None]
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


def reference_slices(inputs: AttentionInputs) -> list[tuple[slice, slice, torch.Tensor]]:
    """(batch slice, row slice, float64 reference ``[1, Hq, rows, Ev]``) for each gated slice."""
    batch_size = inputs.query.shape[0]
    out = []
    for index, rows in enumerate(_row_slices(inputs.query.shape[-2])):
        batch = slice(0, 1) if index == 0 else slice(batch_size - 1, batch_size)
        reference = reference_attention(
            inputs.query[batch, :, rows], inputs.key[batch], inputs.value[batch],
            _slice_mask(inputs, batch, rows), False, enable_gqa=inputs.enable_gqa,
        )
        out.append((batch, rows, reference))
    return out


def gate_errors(
    out: torch.Tensor, references: list[tuple[slice, slice, torch.Tensor]]
) -> tuple[float, float]:
    """Worst (relative L2, relative max) error of ``out [B, Hq, L, Ev]`` over the gated slices."""
    worst_l2, worst_max = 0.0, 0.0
    for batch, rows, reference in references:
        l2, biggest = relative_errors(out[batch, :, rows], reference)
        worst_l2, worst_max = max(worst_l2, l2), max(worst_max, biggest)
    return worst_l2, worst_max
