"""What a lossy conversion the caller has not allowed would gain, said by `explain`.

On gfx906 a bf16 call runs its products `NO_MATRIX_BF16_SLOWDOWN` times slower than fp16 (no bf16
dot instruction; `models.triton_costs`), so ``convert[bf16->fp16]+<kernel>`` can be much faster.
It stays opt-in: fp16's range ends at 65504 where bf16's reaches 3.4e38, so activations past it
overflow to inf. `explain` says what it would gain, from the analytic prior (a prediction, never a
measurement), and how to opt in.
"""

from __future__ import annotations

from dataclasses import replace

from attn_dispatch.dispatcher.decision import Decision, format_seconds
from attn_dispatch.kernels import AccuracyPolicy, Kernel
from attn_dispatch.kernels.convert import ConvertKernel
from attn_dispatch.models.identity import CardSpec
from attn_dispatch.models.priors import kernel_named, prior_seconds

NOTED_CONVERSIONS = ("bf16->fp16", "fp16->bf16")
"""Lossy conversions whose gain `explain` states: those between the half dtypes, which keep the
inputs' size, so what they gain is the card's rate for the other dtype (gfx906's fp16 dot2
against its bf16 emulation), not memory."""
MIN_GAIN = 1.25
"""A conversion is worth a note when the prior predicts it at least this much faster than the
chosen kernel: the margin the prior keeps before overriding a choice (`models.priors.FORCED_BACKEND_FACTOR`)."""
RANGE_LOSS = {
    "bf16->fp16": "fp16's range ends at 65504 where bf16's reaches 3.4e38: larger activations overflow to inf",
    "fp16->bf16": "bf16 keeps 8 bits of mantissa where fp16 keeps 11: about 3 significant digits fewer",
}


def lossy_gain_note(decision: Decision, spec: CardSpec | None, policy: AccuracyPolicy) -> str | None:
    """A line for `explain` when a conversion of `NOTED_CONVERSIONS` that `policy` does not allow was
    dropped, would run otherwise, and the prior of `spec`'s card predicts it at least `MIN_GAIN`
    times faster than the chosen kernel; None otherwise (no spec, no such conversion, or no such
    gain). Both times are the prior's, so the gain compares like with like."""
    if spec is None:
        return None
    problem = decision.problem
    try:
        chosen_s = prior_seconds(problem, kernel_named(decision.kernel), spec)
    except ValueError:  # the training route's PyTorch call, or a kernel that is not ours
        return None
    best: tuple[float, Kernel] | None = None
    for name, _ in decision.dropped:
        kernel = _noted_conversion(name)
        if kernel is None or policy.allows(kernel.source, kernel.target) or kernel.reasons(problem):
            continue  # not ours or not noted, allowed (dropped for another reason), or its inner cannot run
        seconds = prior_seconds(problem, kernel, spec)
        if best is None or seconds < best[0]:
            best = (seconds, kernel)
    if best is None or chosen_s < MIN_GAIN * best[0]:
        return None
    seconds, kernel = best
    return (f"{kernel.name} would take {format_seconds(seconds)} against {format_seconds(chosen_s)} for "
            f"{decision.kernel}, {chosen_s / seconds:.1f}x faster (predicted by the analytic prior of {spec.name}, "
            f"unmeasured); it stays off because {kernel.conversion} is lossy ({RANGE_LOSS[kernel.conversion]}): "
            f"opt in with --allow-lossy {kernel.conversion} (AccuracyPolicy.allowing({kernel.conversion!r}))")


def with_lossy_gain(decision: Decision, prior: object, policy: AccuracyPolicy) -> Decision:
    """`decision` with `lossy_gain_note` among its notes, when there is one; `prior` is the
    device's analytic prior ranker (`models.priors.PriorRanker`; None when it has none)."""
    note = lossy_gain_note(decision, getattr(prior, "spec", None), policy)
    return decision if note is None else replace(decision, notes=(*decision.notes, note))


def _noted_conversion(name: str) -> ConvertKernel | None:
    """The kernel `name` under a policy allowing every conversion, when it converts by one of
    `NOTED_CONVERSIONS`; else None."""
    try:
        kernel = kernel_named(name)
    except ValueError:
        return None
    if isinstance(kernel, ConvertKernel) and kernel.source is not None and kernel.conversion in NOTED_CONVERSIONS:
        return kernel
    return None
