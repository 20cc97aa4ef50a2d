"""`convert[SRC->DST]+<kernel>` and `convert[contiguous]+<kernel>`: convert the inputs' dtype or layout, run a faster
kernel, convert the output back. Lossless conversions are always allowed; lossy ones only under an `AccuracyPolicy`
naming them."""

from __future__ import annotations

import functools

import torch

from attn_dispatch.kernels.accuracy import (
    LOSSLESS,
    TOLERANCES,
    AccuracyPolicy,
    Tolerance,
    format_conversion,
    looser,
)
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import DTYPES_BY_NAME, Problem

CONTIGUOUS = "contiguous"


class ConvertKernel(Kernel):
    """Convert, run `inner`, convert back. `source`, `target`: dtype names, both None for a layout conversion;
    `policy`: the lossy conversions allowed."""

    family = "convert"

    def __init__(self, inner: Kernel, source: str | None = None, target: str | None = None, *,
                 policy: AccuracyPolicy = LOSSLESS) -> None:
        if isinstance(inner, ConvertKernel):
            raise ValueError("convert kernels do not nest: give one conversion and a plain kernel")
        if (source is None) != (target is None):
            raise ValueError("give both source and target dtypes, or neither for a layout conversion")
        if source is not None and (source not in DTYPES_BY_NAME or target not in DTYPES_BY_NAME):
            raise ValueError(f"unknown dtype in conversion {source!r} -> {target!r}; use {sorted(DTYPES_BY_NAME)}")
        if source is not None and source == target:
            raise ValueError(f"conversion {source} -> {target} converts nothing")
        self.inner = inner
        self.source = source
        self.target = target
        self.policy = policy
        self._converted: dict[Problem, Problem] = {}  # run() is on the per-call path: build once

    @property
    def conversion(self) -> str:
        return CONTIGUOUS if self.source is None else format_conversion(self.source, self.target)

    @functools.cached_property
    def name(self) -> str:
        return f"convert[{self.conversion}]+{self.inner.name}"

    @property
    def params(self) -> dict[str, object]:
        return dict(self.inner.params)

    def converted(self, problem: Problem) -> Problem:
        """The problem `inner` sees (cached per problem)."""
        converted = self._converted.get(problem)
        if converted is None:
            converted = problem.with_layout(strided=False) if self.source is None else problem.with_dtype(self.target)
            self._converted[problem] = converted
        return converted

    def _own_reasons(self, problem: Problem) -> list[str]:
        if self.source is None:
            if not problem.strided:
                return ["inputs are already contiguous: a layout conversion has nothing to do"]
        else:
            if problem.dtype != self.source:
                return [f"converts {self.source} inputs, these are {problem.dtype}"]
            if not self.policy.allows(self.source, self.target):
                return [f"{self.conversion} is lossy and the accuracy policy ({self.policy.describe()}) "
                        f"does not allow it; pass AccuracyPolicy.allowing({self.conversion!r}) (command "
                        f"line: --allow-lossy {self.conversion}) to accept its error"]
        return [f"after {self.conversion}: {why}" for why in self.inner.reasons(self.converted(problem))]

    def workspace_bytes(self, problem: Problem) -> int:
        """Converted copies of Q, K, V (and a float mask), the inner workspace and the converted output."""
        inner_problem = self.converted(problem)
        ratio = inner_problem.itemsize / problem.itemsize
        copies = int((problem.q_bytes + problem.kv_bytes) * ratio)
        if problem.mask_kind == "float" and self.target is not None:
            copies += problem.mask_bytes
        return copies + self.inner.workspace_bytes(inner_problem) + problem.out_bytes

    def tolerance(self, problem: Problem) -> Tolerance:
        own = TOLERANCES[problem.dtype]
        return looser(own, TOLERANCES[self.target]) if self.target is not None else own

    def run(self, query, key, value, attn_mask, scale, enable_gqa, problem: Problem) -> torch.Tensor:
        inner_problem = self.converted(problem)
        if self.source is None:
            query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
        else:
            dtype = DTYPES_BY_NAME[self.target]
            query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
            if attn_mask is not None and attn_mask.dtype not in (torch.bool, torch.float32, dtype):
                attn_mask = attn_mask.to(torch.float32)  # widened, never overflowed (a bf16 -1e5 is -inf in fp16)
        out = self.inner.run(query, key, value, attn_mask, scale, enable_gqa, inner_problem)
        return out.to(DTYPES_BY_NAME[problem.dtype])
