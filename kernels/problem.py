"""The attention problem: one `F.scaled_dot_product_attention` call reduced to the numbers that decide the fastest
kernel and its memory; built and validated once per call (`Problem.from_tensors`, SDPA's exception types)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import torch

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
DTYPES_BY_NAME: dict[str, torch.dtype] = {name: dtype for dtype, name in DTYPE_NAMES.items()}
SHORT_DTYPE_NAMES: dict[str, str] = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}
ITEMSIZE: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
MASK_KINDS = ("none", "bool", "float")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
"""Where the causal diagonal starts: top-left (``is_causal``, `causal_upper_left`: query i sees keys 0..i) or
bottom-right (`causal_lower_right`: keys 0..i + S - L, as a decode step against a cache)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One attention call in canonical 4-D form (`kernels._layout`), every leading dimension folded into ``batch``.

    `mask_shape`: the mask's ``(B|1, H|1, L|1, S|1)``, ``()`` without one. `strided`: some input is not contiguous in
    its 4-D view (kernels may copy it). `broadcast_inputs`: inputs' leading dimensions (or K/V head counts under GQA)
    broadcast; canonicalisation materialises them. `causal_alignment`: bottom-right only when causal. Sizes may be 0
    (`is_degenerate`)."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    value_dim: int
    dtype: str = "float16"
    causal: bool = False
    mask_kind: str = "none"
    mask_shape: tuple[int, ...] = ()
    device_type: str = "cpu"
    strided: bool = False
    broadcast_inputs: bool = False
    causal_alignment: str = "top_left"
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "value_dim"):
            if getattr(self, name) < 0:
                raise ValueError(f"Problem.{name} must be >= 0, got {getattr(self, name)}")
        if (self.kv_heads == 0) != (self.q_heads == 0) or (self.kv_heads and self.q_heads % self.kv_heads):
            raise ValueError(f"Problem.q_heads ({self.q_heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"Problem.dtype must be one of {sorted(ITEMSIZE)}, got {self.dtype!r}")
        if self.mask_kind not in MASK_KINDS:
            raise ValueError(f"Problem.mask_kind must be one of {MASK_KINDS}, got {self.mask_kind!r}")
        if (self.mask_kind == "none") != (self.mask_shape == ()):
            raise ValueError("Problem.mask_shape must be () exactly when mask_kind is 'none'")
        if self.mask_shape and len(self.mask_shape) != 4:
            raise ValueError(f"Problem.mask_shape must have 4 dims, got {self.mask_shape}")
        if self.causal_alignment not in CAUSAL_ALIGNMENTS:
            raise ValueError(f"Problem.causal_alignment must be one of {CAUSAL_ALIGNMENTS}, got {self.causal_alignment!r}")
        if self.causal_alignment != "top_left" and not self.causal:
            raise ValueError("Problem.causal_alignment is 'bottom_right' only for causal problems")
        object.__setattr__(self, "_hash", hash(self.key()))

    def __hash__(self) -> int:
        return self._hash

    def at_key_length(self, kv_len: int, mask_shape: tuple[int, ...]) -> Problem:
        """This problem at another key length and mask shape, without validating again
        (`plans.problem_at_key_length`)."""
        new = object.__new__(Problem)
        for name in _COPIED_FIELDS:
            object.__setattr__(new, name, getattr(self, name))
        object.__setattr__(new, "kv_len", kv_len)
        object.__setattr__(new, "mask_shape", mask_shape)
        object.__setattr__(new, "_hash", hash(new.key()))
        return new

    def key(self) -> tuple:
        return (self.batch, self.q_heads, self.kv_heads, self.q_len, self.kv_len, self.head_dim,
                self.value_dim, self.dtype, self.causal, self.mask_kind, self.mask_shape, self.device_type,
                self.strided, self.broadcast_inputs, self.causal_alignment)

    # ------------------------------------------------------------------ derived sizes
    @property
    def gqa_ratio(self) -> int:
        """Query heads per key/value head (1 without GQA, and with no heads at all)."""
        return self.q_heads // self.kv_heads if self.kv_heads else 1

    @property
    def causal_offset(self) -> int:
        """Query i sees keys ``0 .. i + causal_offset`` when causal: 0 top-left, ``S - L`` bottom-right."""
        return self.kv_len - self.q_len if self.causal_alignment == "bottom_right" else 0

    @property
    def is_degenerate(self) -> bool:
        """Some size is 0: computed by `kernels.base`, never by a kernel's body."""
        return 0 in (self.batch, self.q_heads, self.q_len, self.kv_len, self.head_dim, self.value_dim)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES_BY_NAME[self.dtype]

    @property
    def q_bytes(self) -> int:
        return self.batch * self.q_heads * self.q_len * self.head_dim * self.itemsize

    @property
    def kv_bytes(self) -> int:
        """Bytes of key plus value."""
        return self.batch * self.kv_heads * self.kv_len * (self.head_dim + self.value_dim) * self.itemsize

    @property
    def out_bytes(self) -> int:
        return self.batch * self.q_heads * self.q_len * self.value_dim * self.itemsize

    @property
    def score_elements(self) -> int:
        return self.batch * self.q_heads * self.q_len * self.kv_len

    @property
    def mask_bytes(self) -> int:
        if not self.mask_shape:
            return 0
        return math.prod(self.mask_shape) * (1 if self.mask_kind == "bool" else 4)

    @property
    def input_bytes(self) -> int:
        return self.q_bytes + self.kv_bytes + self.mask_bytes

    @property
    def flops(self) -> int:
        """QK^T and PV multiply-adds as 2 FLOPs each (causal masking not subtracted)."""
        return 2 * self.batch * self.q_heads * self.q_len * self.kv_len * (self.head_dim + self.value_dim)

    @property
    def io_bytes(self) -> int:
        """The fewest bytes any kernel must move: inputs read, output written."""
        return self.input_bytes + self.out_bytes

    def to_dict(self) -> dict:
        """JSON-ready dict (inverse: `from_dict`)."""
        return {"batch": self.batch, "q_heads": self.q_heads, "kv_heads": self.kv_heads, "q_len": self.q_len,
                "kv_len": self.kv_len, "head_dim": self.head_dim, "value_dim": self.value_dim,
                "dtype": self.dtype, "causal": self.causal, "mask_kind": self.mask_kind,
                "mask_shape": list(self.mask_shape), "device_type": self.device_type, "strided": self.strided,
                "broadcast_inputs": self.broadcast_inputs,
                **({"causal_alignment": self.causal_alignment} if self.causal_alignment != "top_left" else {})}

    @classmethod
    def from_dict(cls, data: dict) -> Problem:
        """Build from `to_dict` output; raises ValueError naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"a problem must be a JSON object, got {type(data).__name__}")
        ints = ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "value_dim")
        bools = ("causal", "strided", "broadcast_inputs")
        strs = ("dtype", "mask_kind", "device_type", "causal_alignment")
        known = set(ints) | set(bools) | set(strs) | {"mask_shape"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown problem fields {sorted(unknown)}")
        kwargs: dict = {}
        for name in ints:
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"problem field {name!r} must be an integer, got {value!r}")
            kwargs[name] = value
        for name in bools:
            value = data.get(name, False)
            if not isinstance(value, bool):
                raise ValueError(f"problem field {name!r} must be true or false, got {value!r}")
            kwargs[name] = value
        for name in strs:
            value = data.get(name, {"device_type": "cpu", "causal_alignment": "top_left"}.get(name))
            if not isinstance(value, str):
                raise ValueError(f"problem field {name!r} must be a string, got {value!r}")
            kwargs[name] = value
        shape = data.get("mask_shape", [])
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ValueError(f"problem field 'mask_shape' must be a list of non-negative integers, got {shape!r}")
        kwargs["mask_shape"] = tuple(shape)
        return cls(**kwargs)

    def with_dtype(self, dtype: str) -> Problem:
        """The same problem with inputs of another dtype (what a conversion hands on)."""
        return replace(self, dtype=dtype)

    def with_layout(self, *, strided: bool) -> Problem:
        return replace(self, strided=strided)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_tensors(cls, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                     enable_gqa: bool = False) -> Problem:
        """Validate SDPA inputs and describe them. `attn_mask`: bool (True = attend), float (added), or a
        `CausalBias` (`causal_alignment`).

        Raises as `F.scaled_dot_product_attention` does: RuntimeError (shapes, dtypes, devices), TypeError
        (non-tensors), ValueError (a `CausalBias` with ``is_causal=True``), NotImplementedError (complex inputs)."""
        from attn_dispatch.kernels._layout import describe_inputs

        return describe_inputs(cls, query, key, value, attn_mask, is_causal, enable_gqa)


_COPIED_FIELDS = tuple(item.name for item in fields(Problem) if item.name not in ("kv_len", "mask_shape", "_hash"))
"""`Problem.at_key_length` copies these and sets the rest."""
