"""The numerics gate over a problem class: a kernel that failed its tolerance on any point of a
class (dtype, head dim, causal, GQA ratio, mask kind: the table's classes) is unusable for the
whole class. Its other points of that class are re-marked "inaccurate" with the worst error
recorded, so the cost model and the table never choose it there.
"""

from __future__ import annotations

from dataclasses import replace

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.measurement import Measurement


def problem_class(problem: Problem) -> tuple:
    """The threshold table's class of a problem."""
    return (problem.dtype, problem.head_dim, problem.causal, problem.gqa_ratio, problem.mask_kind)


def describe_class(key: tuple) -> str:
    dtype, head_dim, causal, gqa, mask = key
    return f"{dtype} D={head_dim}{' causal' if causal else ''} GQA={gqa} mask={mask}"


def unusable(measurements: list[Measurement]) -> dict[tuple, dict[str, Measurement]]:
    """class -> kernel -> its worst inaccurate measurement in that class."""
    worst: dict[tuple, dict[str, Measurement]] = {}
    for m in measurements:
        if m.status != "inaccurate":
            continue
        per_class = worst.setdefault(problem_class(m.problem), {})
        previous = per_class.get(m.kernel)
        if previous is None or (m.rel_error or 0.0) > (previous.rel_error or 0.0):
            per_class[m.kernel] = m
    return worst


def apply_numerics_gate(measurements: list[Measurement]) -> tuple[list[Measurement], dict[tuple, dict[str, Measurement]]]:
    """Mark every point of an unusable (class, kernel) inaccurate.

    Returns
    -------
    (the gated measurements, the `unusable` map used)
    """
    excluded = unusable(measurements)
    gated = []
    for m in measurements:
        offender = excluded.get(problem_class(m.problem), {}).get(m.kernel)
        if offender is not None and m.status == "ok":
            m = replace(
                m, status="inaccurate",
                reason=f"unusable for {describe_class(problem_class(m.problem))}: {offender.reason} "
                f"on {offender.problem.q_len}x{offender.problem.kv_len}",
                extra={**m.extra, "gated_by_class": True},
            )
        gated.append(m)
    return gated, excluded
