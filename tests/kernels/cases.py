"""Input generation for the kernel contract suite (also used by the dispatcher's tests).

A `Case` describes one SDPA call; `Case.build()` draws random inputs (never zeros) for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

LARGE_MAGNITUDE = 64.0
"""Inputs ``randn * 64``: with head dims of 64 and more, raw dot products reach tens of thousands,
past fp16's 65504 in the tails (scores computed in fp16 overflow: PyTorch issue #160841)."""

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass(frozen=True)
class Case:
    """One SDPA call: query ``[*lead, Hq, L, E]``, key/value ``[*lead, Hkv, S, E|Ev]``."""

    lead: tuple[int, ...] = (1,)
    kv_heads: int = 2
    gqa_ratio: int = 1
    q_len: int = 5
    kv_len: int = 7
    head_dim: int = 64
    value_dim: int | None = None
    dtype: str = "float32"
    causal: bool = False
    mask: str = "none"  # none | bool | float
    mask_dims: tuple[bool, ...] = (False, False, True, True)  # which of (B, H, L, S) the mask spans
    mask_rank: int = 4
    fully_masked_rows: bool = False
    strided: bool = False
    scale: float | None = None
    magnitude: float = 1.0  # inputs drawn as randn * magnitude (large: fp16 scores would overflow)
    seed: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def q_heads(self) -> int:
        return self.kv_heads * self.gqa_ratio

    @property
    def enable_gqa(self) -> bool:
        return self.gqa_ratio > 1

    def build(self, device: str | torch.device = "cpu") -> dict:
        """Random inputs as SDPA keyword arguments (query, key, value, attn_mask, ...)."""
        generator = torch.Generator().manual_seed(self.seed)
        dtype = DTYPES[self.dtype]
        value_dim = self.value_dim or self.head_dim

        def tensor(heads: int, length: int, dim: int) -> torch.Tensor:
            if self.strided:  # [*lead, L, H, D] -> [*lead, H, L, D], as transformers passes them
                raw = torch.randn(*self.lead, length, heads, dim, generator=generator) * self.magnitude
                return raw.to(dtype).transpose(-2, -3).to(device)
            raw = torch.randn(*self.lead, heads, length, dim, generator=generator) * self.magnitude
            return raw.to(dtype).to(device)

        query = tensor(self.q_heads, self.q_len, self.head_dim)
        key = tensor(self.kv_heads, self.kv_len, self.head_dim)
        value = tensor(self.kv_heads, self.kv_len, value_dim)
        mask = None
        if self.mask != "none":
            full = (*self.lead, self.q_heads, self.q_len, self.kv_len)
            spans = (any(self.mask_dims[:1]),) * len(self.lead) + tuple(self.mask_dims[1:])
            shape = tuple(size if span else 1 for size, span in zip(full, spans, strict=True))
            shape = shape[len(shape) - min(self.mask_rank, len(shape)):]
            if self.mask == "bool":
                mask = torch.rand(shape, generator=generator) < 0.8
                if self.fully_masked_rows and len(shape) > 1 and shape[-2] > 1:
                    mask[..., 0, :] = False
            else:
                mask = torch.randn(shape, generator=generator, dtype=dtype)
                if self.fully_masked_rows and len(shape) > 1 and shape[-2] > 1:
                    mask[..., 0, :] = float("-inf")
            mask = mask.to(device)
        return {
            "query": query, "key": key, "value": value, "attn_mask": mask,
            "is_causal": self.causal, "scale": self.scale, "enable_gqa": self.enable_gqa,
        }


@st.composite
def cases(draw, dtypes=("float32", "float16", "bfloat16"), head_dims=(64, 80, 128, 256), large_magnitudes=True) -> Case:
    """Hypothesis strategy over every axis of SDPA semantics (small sizes: CPU-friendly).

    `large_magnitudes`: sometimes draw half-precision inputs of magnitude `LARGE_MAGNITUDE` (off
    for lossy conversions, whose error is the accuracy policy's business)."""
    mask = draw(st.sampled_from(["none", "bool", "float"]))
    dtype = draw(st.sampled_from(dtypes))
    # Half inputs only: there the magnitude tests overflow; fp32's error grows with the logits'
    # size (for PyTorch's SDPA alike), past a tolerance set on unit-variance inputs.
    magnitudes = [1.0, LARGE_MAGNITUDE] if large_magnitudes and dtype in ("float16", "bfloat16") else [1.0]
    return Case(
        lead=draw(st.sampled_from([(), (1,), (2,), (2, 1), (1, 2)])),
        kv_heads=draw(st.sampled_from([1, 2])),
        gqa_ratio=draw(st.sampled_from([1, 4, 8])),
        q_len=draw(st.integers(1, 40)),
        kv_len=draw(st.integers(1, 70)),
        head_dim=draw(st.sampled_from(head_dims)),
        dtype=dtype,
        causal=draw(st.booleans()),
        mask=mask,
        mask_dims=tuple(draw(st.lists(st.booleans(), min_size=4, max_size=4))),
        mask_rank=draw(st.sampled_from([1, 2, 3, 4])),
        fully_masked_rows=draw(st.booleans()),
        strided=draw(st.booleans()),
        scale=draw(st.sampled_from([None, 0.05, 0.3])),
        magnitude=draw(st.sampled_from(magnitudes)),
        seed=draw(st.integers(0, 2**16)),
    )
