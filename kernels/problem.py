"""The attention problem: one `F.scaled_dot_product_attention` call, reduced to the numbers that
decide which kernel is fastest and how much memory it needs.

A `Problem` is built once per call (`Problem.from_tensors`). Building it validates the inputs with
SDPA's rules and raises SDPA's exception types, with messages that name the bad argument.
"""

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
"""Where the causal diagonal starts: ``is_causal`` / `causal_upper_left` align it top-left (query
i sees keys 0..i); `torch.nn.attention.bias.causal_lower_right` aligns it bottom-right (query i
sees keys 0..i + S - L: the last query sees every key, as in a decode step against a cache)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One attention call in canonical 4-D form.

    The query is viewed as ``[batch, q_heads, q_len, head_dim]``, key as
    ``[batch, kv_heads, kv_len, head_dim]`` and value as ``[batch, kv_heads, kv_len, value_dim]``;
    every leading dimension before the heads dimension is folded into ``batch``.

    Attributes
    ----------
    mask_shape:
        The attention mask's canonical 4-D shape ``(B or 1, H or 1, L or 1, S or 1)``, ``()`` when
        there is no mask.
    strided:
        Some input is not contiguous in its canonical 4-D view (e.g. a ``[B, L, H, D]`` tensor
        transposed to ``[B, H, L, D]``, as transformers passes them); kernels may copy it.
    broadcast_inputs:
        Query, key and value leading dimensions differ and broadcast (or key and value have
        different head counts under GQA): canonicalisation materialises them at one layout.
    causal_alignment:
        ``"top_left"`` (``is_causal``) or ``"bottom_right"`` (`causal_lower_right` with
        ``q_len != kv_len``; see `CAUSAL_ALIGNMENTS`). Only ever bottom-right when causal.

    Sizes may be 0 (SDPA returns an empty or zero output for them; `is_degenerate`).
    """

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
        """This problem with another key length (and the mask shape that goes with it), copied field
        by field without validating again: what changes was checked by the caller (`_plan.
        problem_at_key_length`). Cheaper than `dataclasses.replace`, and a decode loop makes one per
        token."""
        new = object.__new__(Problem)
        for name in _COPIED_FIELDS:
            object.__setattr__(new, name, getattr(self, name))
        object.__setattr__(new, "kv_len", kv_len)
        object.__setattr__(new, "mask_shape", mask_shape)
        object.__setattr__(new, "_hash", hash(new.key()))
        return new

    def key(self) -> tuple:
        """All fields as a tuple (hashable, cheap to compare)."""
        return (
            self.batch, self.q_heads, self.kv_heads, self.q_len, self.kv_len, self.head_dim,
            self.value_dim, self.dtype, self.causal, self.mask_kind, self.mask_shape,
            self.device_type, self.strided, self.broadcast_inputs, self.causal_alignment,
        )

    # ------------------------------------------------------------------ derived sizes
    @property
    def gqa_ratio(self) -> int:
        """Query heads per key/value head (1 without GQA, and with no heads at all)."""
        return self.q_heads // self.kv_heads if self.kv_heads else 1

    @property
    def causal_offset(self) -> int:
        """Query i sees keys ``0 .. i + causal_offset`` when causal: 0 top-left, ``S - L``
        bottom-right (negative when L > S: the first ``L - S`` queries see no key)."""
        return self.kv_len - self.q_len if self.causal_alignment == "bottom_right" else 0

    @property
    def is_degenerate(self) -> bool:
        """Some size is 0: nothing to multiply (an empty output, zeros, or the mean of the values
        when the head dim is 0), computed by `kernels.base`, never by a kernel's body."""
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
        """Elements of the full ``[B, Hq, L, S]`` score matrix."""
        return self.batch * self.q_heads * self.q_len * self.kv_len

    @property
    def mask_bytes(self) -> int:
        if not self.mask_shape:
            return 0
        return math.prod(self.mask_shape) * (1 if self.mask_kind == "bool" else 4)

    @property
    def input_bytes(self) -> int:
        """Bytes of one set of inputs: query, key, value and mask."""
        return self.q_bytes + self.kv_bytes + self.mask_bytes

    @property
    def flops(self) -> int:
        """Multiply-adds of QK^T and PV counted as 2 FLOPs each (causal masking not subtracted)."""
        return 2 * self.batch * self.q_heads * self.q_len * self.kv_len * (self.head_dim + self.value_dim)

    @property
    def io_bytes(self) -> int:
        """The fewest bytes any kernel must move: read Q, K, V (and mask), write the output."""
        return self.input_bytes + self.out_bytes

    def to_dict(self) -> dict:
        """JSON-ready dict (inverse: `Problem.from_dict`)."""
        return {
            "batch": self.batch, "q_heads": self.q_heads, "kv_heads": self.kv_heads,
            "q_len": self.q_len, "kv_len": self.kv_len, "head_dim": self.head_dim,
            "value_dim": self.value_dim, "dtype": self.dtype, "causal": self.causal,
            "mask_kind": self.mask_kind, "mask_shape": list(self.mask_shape),
            "device_type": self.device_type, "strided": self.strided,
            "broadcast_inputs": self.broadcast_inputs,
            **({"causal_alignment": self.causal_alignment} if self.causal_alignment != "top_left" else {}),
        }

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
        """The same problem with inputs of another dtype (what a conversion kernel hands on)."""
        return replace(self, dtype=dtype)

    def with_layout(self, *, strided: bool) -> Problem:
        return replace(self, strided=strided)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_tensors(cls, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                     enable_gqa: bool = False) -> Problem:
        """Validate SDPA inputs and describe them.

        Parameters
        ----------
        query: ``[..., L, E]``; key: ``[..., S, E]``; value: ``[..., S, Ev]``. With
            ``enable_gqa`` the heads dimension (-3) of key/value may divide the query's.
        attn_mask: bool (True = attend) or float (added to scores), broadcastable to
            ``[..., L, S]``; or a `torch.nn.attention.bias.CausalBias` (causality, aligned
            top-left or bottom-right: `causal_alignment`).

        Raises
        ------
        RuntimeError
            Where `F.scaled_dot_product_attention` raises RuntimeError (shapes, dtypes, devices).
        TypeError
            For arguments that are not tensors.
        ValueError
            For a `CausalBias` together with ``is_causal=True`` (as PyTorch).
        NotImplementedError
            For complex inputs (as PyTorch's softmax).
        """
        from attn_dispatch.kernels._layout import describe_inputs

        return describe_inputs(cls, query, key, value, attn_mask, is_causal, enable_gqa)


_COPIED_FIELDS = tuple(item.name for item in fields(Problem) if item.name not in ("kv_len", "mask_shape", "_hash"))
"""`Problem.at_key_length` copies these and sets the rest."""
