"""The contract every kernel must keep, written once and applied to every kernel."""

from __future__ import annotations

import os

import pytest
import torch

from attn_dispatch.kernels import (
    AccuracyPolicy,
    Kernel,
    Problem,
    all_kernels,
    reference_attention,
    relative_errors,
)
from attn_dispatch.kernels.convert import ConvertKernel
from attn_dispatch.kernels.registry import interpreted
from tests.kernels.cases import Case

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
# The device the contract runs on: cpu in CI; set ATTN_DISPATCH_TEST_DEVICE=cuda on a GPU machine.
TEST_DEVICE = os.environ.get("ATTN_DISPATCH_TEST_DEVICE", "cpu")
# Conversions whose inner kernel runs under Triton's interpreter here are left out: what they add (the
# conversion) is checked with every other inner kernel, the Triton kernels by their own contract,
# and under the interpreter they would add a minute of CPU to the suite. On a GPU they are all in.
EVERY_KERNEL = [kernel for kernel in all_kernels(policy=AccuracyPolicy.allowing("any"))
                if not (isinstance(kernel, ConvertKernel) and interpreted(kernel))]
every_kernel = pytest.mark.parametrize("kernel", EVERY_KERNEL, ids=lambda kernel: kernel.name)


def dtypes_for(kernel: Kernel) -> tuple[str, ...]:
    """The input dtypes a kernel may accept (a dtype conversion takes only its source dtype)."""
    source = getattr(kernel, "source", None)
    return (source,) if source else SUPPORTED_DTYPES


def lossy(kernel: Kernel) -> bool:
    """A dtype conversion that loses precision (its error is the accuracy policy's business)."""
    from attn_dispatch.kernels.accuracy import is_lossless

    source, target = getattr(kernel, "source", None), getattr(kernel, "target", None)
    return source is not None and not is_lossless(source, target)


def basic_problems(kernel: Kernel, device_type: str = TEST_DEVICE) -> list[Problem]:
    """Plain problems in every dtype (and layout) the kernel might take."""
    return [
        Problem(1, 4, 2, 8, 16, 64, 64, dtype, device_type=device_type, strided=strided)
        for dtype in dtypes_for(kernel)
        for strided in (False, True)
    ]


def runs_here(kernel: Kernel, device_type: str = TEST_DEVICE) -> bool:
    return any(not kernel.reasons(problem) for problem in basic_problems(kernel, device_type))


RUNNABLE_HERE = [kernel for kernel in EVERY_KERNEL if runs_here(kernel)]
runnable_kernel = pytest.mark.parametrize("kernel", RUNNABLE_HERE, ids=lambda kernel: kernel.name)


def problem_of(inputs: dict) -> Problem:
    return Problem.from_tensors(
        inputs["query"], inputs["key"], inputs["value"], inputs["attn_mask"], inputs["is_causal"], inputs["enable_gqa"]
    )


def check_against_reference(kernel: Kernel, case: Case, *, skip_unsupported: bool = True) -> bool:
    """Run `kernel` on `case` and compare with the float64 reference. Returns False (or skips)
    when the kernel declares the problem unsupported."""
    inputs = case.build(TEST_DEVICE)
    problem = problem_of(inputs)
    reasons = kernel.reasons(problem)
    if reasons:
        if skip_unsupported:
            pytest.skip("; ".join(reasons))
        return False
    query = inputs.pop("query")
    key = inputs.pop("key")
    value = inputs.pop("value")
    out = kernel(query, key, value, **inputs)
    reference = reference_attention(query, key, value, **inputs)
    assert out.shape == reference.shape, f"{kernel.name}: shape {tuple(out.shape)} != {tuple(reference.shape)}"
    assert out.dtype == query.dtype, f"{kernel.name}: dtype {out.dtype} != input dtype {query.dtype}"
    rel_l2, rel_max = relative_errors(out, reference)
    tolerance = kernel.tolerance(problem)
    assert tolerance.accepts(rel_l2, rel_max), (
        f"{kernel.name} on {case}: relative L2 error {rel_l2:.2e} (max {rel_max:.2e}) exceeds {tolerance}"
    )
    if case.fully_masked_rows and case.mask != "none":
        dead = _fully_masked(inputs["attn_mask"], case)
        if dead is not None and dead.any():
            rows = out.double()[dead.expand(out.shape[:-1])]
            assert torch.equal(rows, torch.zeros_like(rows)), f"{kernel.name}: fully masked rows are not zero"
    return True


def _fully_masked(mask: torch.Tensor, case: Case) -> torch.Tensor | None:
    blocked = ~mask if mask.dtype == torch.bool else mask == float("-inf")
    return blocked.all(dim=-1)
