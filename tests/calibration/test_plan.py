"""What a calibration measures after its sweep (`calibration.plan`): crossover refinement and the
class-level numerics gate."""

from __future__ import annotations

import math

from attn_dispatch.calibration.finish import apply_numerics_gate, problem_class
from attn_dispatch.calibration.plan import crossover_problems, family_of
from attn_dispatch.models.measurement import Measurement
from tests.calibration.helpers import problem


def _m(p, kernel, seconds, status="ok", error=None):
    return Measurement(problem=p, kernel=kernel, median_s=seconds if status in ("ok", "inaccurate") else math.inf,
                       status=status, rel_error=error, reason="" if status == "ok" else "bad")


def test_family_of():
    assert family_of("chunked[q=256,kv=1024]") == "chunked"
    assert family_of("convert[fp16->fp32]+sdpa_flash") == "convert+sdpa_flash"
    assert family_of("math") == "math"


def test_midpoints_between_different_winners_only():
    points = []
    for q in (1, 4, 64, 256):
        p = problem(q_len=q, kv_len=4096)
        small_q_wins = q <= 4
        points += [_m(p, "small_q[splits=8]", 1.0 if small_q_wins else 2.0), _m(p, "chunked[q=128,kv=1024]", 2.0 if small_q_wins else 1.0)]
    new = crossover_problems(points, count=5)
    assert len(new) == 1
    assert new[0].q_len == 16 and new[0].kv_len == 4096  # geometric midpoint of 4 and 64
    assert crossover_problems(points, count=5) == new  # deterministic
    assert crossover_problems(points[:4], count=5) == []  # same winner everywhere


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
