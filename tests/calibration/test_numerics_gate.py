"""The class-level numerics gate a calibration's points pass before the fit (`calibration.finish`)."""

from __future__ import annotations

import math

from attn_dispatch.calibration.finish import apply_numerics_gate, problem_class
from attn_dispatch.models.measurement import Measurement
from tests.calibration.helpers import problem


def _m(p, kernel, seconds, status="ok", error=None):
    return Measurement(problem=p, kernel=kernel, median_s=seconds if status in ("ok", "inaccurate") else math.inf,
                       status=status, rel_error=error, reason="" if status == "ok" else "bad")


def test_gate_excludes_the_kernel_for_the_whole_class():
    a, b, other = problem(q_len=8), problem(q_len=512), problem(q_len=8, dtype="float16")
    assert problem_class(a) == problem_class(b) != problem_class(other)
    points = [
        _m(a, "wrong", 1.0, status="inaccurate", error=0.01), _m(b, "wrong", 1.0), _m(other, "wrong", 1.0),
        _m(a, "math", 2.0), _m(b, "math", 2.0),
    ]
    gated, excluded = apply_numerics_gate(points)
    by = {(m.problem, m.kernel): m for m in gated}
    assert by[b, "wrong"].status == "inaccurate" and "unusable for float32" in by[b, "wrong"].reason
    assert by[other, "wrong"].ok  # another class: not excluded
    assert by[a, "math"].ok and by[b, "math"].ok
    assert list(excluded[problem_class(a)]) == ["wrong"]
