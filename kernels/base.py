"""The kernel protocol: a kernel declares what it can run (`reasons`), its extra memory (`workspace_bytes`, never
allocating) and computes exactly what `F.scaled_dot_product_attention` computes. Also the plain formula for inputs
with nothing to tile (`direct_attention`), `is_out_of_memory` and forward-plus-backward memory (`training_bytes`)."""

from __future__ import annotations

import functools
import math
import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import torch

from attn_dispatch.kernels._blocks import accumulation_dtype, causal_blocked
from attn_dispatch.kernels._layout import canonicalisation_bytes, canonicalise
from attn_dispatch.kernels.accuracy import TOLERANCES, Tolerance
from attn_dispatch.kernels.problem import Problem

if TYPE_CHECKING:
    from attn_dispatch.kernels.sdpa_backends import BareCall


INTERPRETER_VARIABLE = "TRITON_INTERPRET"
NO_TRITON_ON_CPU = "Triton kernels run on GPUs; on the CPU only under Triton's interpreter (TRITON_INTERPRET=1, for tests)"
"""Why a Triton kernel cannot run CPU tensors without the interpreter."""


def interpreting() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET=1``)."""
    return os.environ.get(INTERPRETER_VARIABLE, "0") == "1"


def checked_parameter(name: str, value: object, low: int, high: int, *, power_of_two: bool = False) -> int:
    """`value` if an integer from `low` to `high` (a power of two when asked), else ValueError naming the parameter."""
    valid = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    if not valid or (power_of_two and value & (value - 1)):
        kind = "a power of two" if power_of_two else "an integer"
        raise ValueError(f"{name} must be {kind} from {low} to {high}, got {value!r}")
    return value


class UnsupportedProblemError(RuntimeError):
    """A kernel was asked to run a problem it declared it cannot run."""


def format_params(params: dict[str, object]) -> str:
    """``{"q": 256, "kv": 1024}`` -> ``"[q=256,kv=1024]"`` (``""`` when there are none)."""
    if not params:
        return ""
    return "[" + ",".join(f"{key}={value}" for key, value in params.items()) + "]"


class Kernel(ABC):
    """One attention implementation in one parameterisation: subclasses set `family`, implement `_forward` on
    canonical 4-D tensors (or `run`) and `workspace_bytes`, and extend `_own_reasons`."""

    family: ClassVar[str]
    supports_backward: ClassVar[bool] = False
    """True when autograd through the kernel gives SDPA's gradients (training may use it)."""

    # ------------------------------------------------------------------ identity
    @property
    def params(self) -> dict[str, object]:
        """Tunable parameters, in name order."""
        return {}

    @functools.cached_property
    def name(self) -> str:
        """``family[params]``; made once (a kernel's parameters never change), as every lookup hashes it."""
        return self.family + format_params(self.params)

    def __repr__(self) -> str:
        return f"kernel_from_name({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Kernel) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def variant_key(self, problem: Problem) -> tuple:
        """What shares this kernel's lazily loaded device code (a compiled variant) across problems:
        name, device, dtype, head dims, causality, mask kind. A problem of a new key runs set-up first."""
        return (self.name, problem.device_type, problem.dtype, problem.head_dim, problem.value_dim, problem.causal,
                problem.mask_kind)

    # ------------------------------------------------------------------ capabilities
    def reasons(self, problem: Problem) -> list[str]:
        """Why this kernel cannot run `problem`; empty when it can. Never raises."""
        return self._own_reasons(problem)

    def _own_reasons(self, problem: Problem) -> list[str]:
        return []

    @abstractmethod
    def workspace_bytes(self, problem: Problem) -> int:
        """Upper bound of the extra peak memory of one call, output included; never allocates."""

    def tolerance(self, problem: Problem) -> Tolerance:
        """The error against a float64 reference this kernel must stay within."""
        return TOLERANCES[problem.dtype]

    # ------------------------------------------------------------------ running
    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                 attn_mask: torch.Tensor | None = None, is_causal: bool = False, scale: float | None = None,
                 enable_gqa: bool = False) -> torch.Tensor:
        """`F.scaled_dot_product_attention` without dropout; raises `UnsupportedProblemError` where `reasons` refuse."""
        problem = Problem.from_tensors(query, key, value, attn_mask, is_causal, enable_gqa)
        why = self.reasons(problem)
        if why:
            raise UnsupportedProblemError(f"kernel {self.name} cannot run {problem}: " + "; ".join(why))
        return self.run(query, key, value, attn_mask, scale, enable_gqa, problem)

    def run(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
            scale: float | None, enable_gqa: bool, problem: Problem) -> torch.Tensor:
        """Run on inputs already validated as `problem` (the dispatcher's path: no checks)."""
        inputs = canonicalise(query, key, value, attn_mask, problem, enable_gqa)
        if scale is None:
            scale = 1.0 / math.sqrt(problem.head_dim) if problem.head_dim else math.inf
        if problem.is_degenerate or problem.device_type == "meta":  # a size of 0, or shapes only
            out = direct_attention(inputs.query, inputs.key, inputs.value, inputs.mask, problem, scale)
            return out.reshape(inputs.out_shape)  # in the autograd graph, unlike new_zeros
        out = self._forward(inputs.query, inputs.key, inputs.value, inputs.mask, problem, scale)
        return out.reshape(inputs.out_shape)

    def runner(self, problem: Problem):
        """The callable the warm path calls for problems like `problem`, with `run`'s signature: `run` or a shortcut."""
        return self.run

    def sdpa_call(self, problem: Problem) -> tuple[bool, bool, bool] | None:
        """``(takes_mask, is_causal, enable_gqa)`` where running `problem` is exactly one
        ``torch._C._nn.scaled_dot_product_attention`` call on the call's own tensors and scale, which the warm path
        then makes itself; None: run through `runner`."""
        return None

    def bare_call(self, problem: Problem) -> BareCall | None:
        """The one ATen operator call `runner` makes (`kernels.sdpa_backends.BareCall`), or None."""
        return None

    def _forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                 problem: Problem, scale: float) -> torch.Tensor:
        """Canonical inputs -> ``[B, Hq, L, Ev]`` in the input dtype (or override `run`)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither _forward nor run")

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def input_copy_bytes(problem: Problem) -> int:
        return canonicalisation_bytes(problem)


# inputs with nothing to tile (a size of 0, meta tensors): the plain formula in fp32 (fp64 for fp64),
# so the output is SDPA's and stays in the autograd graph


def direct_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     problem: Problem, scale: float) -> torch.Tensor:
    """Canonical inputs -> ``[B, Hq, L, Ev]`` in the query's dtype by the plain formula (fp32, fp64 for fp64)."""
    acc = accumulation_dtype(query.dtype)
    if problem.gqa_ratio > 1:
        key = key.repeat_interleave(problem.gqa_ratio, dim=1)
        value = value.repeat_interleave(problem.gqa_ratio, dim=1)
    scores = torch.matmul(query.to(acc) * scale, key.to(acc).transpose(-1, -2))  # scaled first: E = 0 gives 0, not 0 * inf
    blocked = None
    if problem.causal:
        blocked = causal_blocked(slice(0, problem.q_len), slice(0, problem.kv_len), scores.device, problem.causal_offset)
    if mask is not None:
        mask_blocked = mask.logical_not() if mask.dtype == torch.bool else None
        if mask_blocked is None:
            scores = scores + mask.to(acc)
        else:
            blocked = mask_blocked if blocked is None else blocked | mask_blocked
    if blocked is not None:
        scores = scores.masked_fill(blocked, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if blocked is not None or mask is not None:  # rows with every key blocked give zeros, not NaN
        probs = probs.masked_fill((scores == float("-inf")).all(dim=-1, keepdim=True), 0.0)
    return torch.matmul(probs, value.to(acc)).to(query.dtype)


# out-of-memory failures

OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")
"""How CPU allocators (and some HIP builds) word an out-of-memory error that is not a torch.OutOfMemoryError."""


def is_out_of_memory(error: BaseException) -> bool:
    """torch.OutOfMemoryError, MemoryError, or a RuntimeError an allocator raised for lack of memory."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error).lower() for m in OOM_MESSAGES)


# forward-plus-backward memory of one call (`dispatcher.training_route`, `calibration.training_profile`)

FUSED_BACKWARDS = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
"""PyTorch backends whose backward recomputes tiles."""

MATH_BACKWARD_SCORE_MATRICES = 4
"""Score-sized fp32 tensors assumed for a backward declaring no bound (docs/RESULTS.md#training-memory)."""


def compile_seconds(kernel: Kernel, problem: Problem) -> float:
    """Seconds the next run spends compiling in this process (`Kernel.setup_seconds`), else 0; a
    conversion's inner kernel compiles for the converted inputs."""
    inner = getattr(kernel, "inner", None)
    if inner is not None:
        return compile_seconds(inner, kernel.converted(problem))
    setup = getattr(kernel, "setup_seconds", None)
    return setup(problem) if setup is not None else 0.0


def training_bytes(kernel: Kernel, problem: Problem) -> int:
    """Extra peak memory of forward plus backward on `kernel`, never allocating: its `backward_workspace_bytes`, else
    an estimate (fused backends: forward, row statistics, gradients, fp32 dQ, K/V repeated; others:
    `MATH_BACKWARD_SCORE_MATRICES`)."""
    declared = getattr(kernel, "backward_workspace_bytes", None)
    if declared is not None:
        return int(declared(problem))
    grads = problem.q_bytes + problem.kv_bytes
    forward = int(kernel.workspace_bytes(problem))
    if kernel.family in FUSED_BACKWARDS:
        rows = problem.batch * problem.q_heads * problem.q_len
        dq_accumulator = problem.q_bytes * 4 // problem.itemsize
        return forward + rows * 4 + grads + dq_accumulator + 2 * problem.kv_bytes * problem.gqa_ratio
    return forward + grads + MATH_BACKWARD_SCORE_MATRICES * problem.score_elements * 4
