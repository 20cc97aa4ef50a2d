"""How much would a wider first-call check gain? Simulated on a recorded LLM-grid run
(`bench/llm_grid.py`), off the card.

For every grid shape the table ranks the kernels that were timed there (`ThresholdTable.rank`,
PyTorch's backends assumed available), and each policy picks among the recorded medians as if its
first-call timing had measured exactly those: a kernel other than PyTorch's default must beat it
by `tuning.MIN_WIN_MARGIN`. Dispatch overhead is not counted (it is what `llm_grid` adds).

Policies:
- ``table``: the table's first choice;
- ``check``: the first-call check before measuring on calls replaced it: the table's first choice
  against PyTorch's default, when it is not the default;
- ``top2`` / ``top3``: the table's first two / three choices and PyTorch's default;
- ``top2+flash``: those and ``sdpa_flash`` (the backend fastest on 303 of the probe's 580 shapes);
- ``shipped``: the candidates a GPU bucket measures on its calls (`dispatcher/measured_candidates.py`):
  ``check`` for decode (one query row), ``top2+flash`` otherwise;
- ``shipped+family`` / ``top2+family``: those and the table's first choice among our own kernels of a
  family not yet timed (`with_other_family`);
- ``tuned``: the removed burst tuning's contenders (predicted within `TUNE_MARGIN` of the best, at
  most `MAX_TUNED`) and PyTorch's default.

Usage: python -m bench.first_call_check_simulation bench/results/h200_session6/run1_llm_grid.jsonl.gz \\
    [--table models/tables/nvidia-h200-140gb.json]
"""

from __future__ import annotations

import argparse
import math
import statistics

from attn_dispatch.dispatcher.selection import MIN_WIN_MARGIN
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_probe import assume_backends_available
from attn_dispatch.models.measured import DEFAULT_KERNEL
from attn_dispatch.models.ranking import kernel_named
from attn_dispatch.models.table_io import load_table
from bench.grid_measurements import read_grid

TUNE_MARGIN = 2.0
"""The removed burst tuning's contenders: predicted within this factor of the best prediction, ..."""
MAX_TUNED = 6
"""... at most this many."""

SMALL_Q_ROWS = (2, 64)


def recorded_times(row: dict) -> dict[str, float]:
    """Kernel name -> seconds of one grid shape (median, or the single call of a pruned loser)."""
    times = {}
    for label, path in row["paths"].items():
        seconds = path.get("median_s") or path.get("once_s")
        if seconds and label == "pytorch":
            times[DEFAULT_KERNEL] = seconds
        elif seconds and label.startswith("kernel:"):
            times[label.removeprefix("kernel:")] = seconds
    return times


def measured_choice(contenders: list[str], times: dict[str, float]) -> str:
    """The fastest contender, where one other than PyTorch's default must beat it by the margin."""
    default = times[DEFAULT_KERNEL]
    best, best_s = DEFAULT_KERNEL, default
    for name in contenders:
        seconds = times.get(name)
        if name != DEFAULT_KERNEL and seconds is not None and seconds * (1 + MIN_WIN_MARGIN) < default and seconds < best_s:
            best, best_s = name, seconds
    return best


def policies(ranked: list[tuple[str, float]], q_len: int) -> dict[str, list[str] | str]:
    """Policy -> its contenders (a list) or its fixed pick (a name)."""
    names = [name for name, _ in ranked]
    first = names[0]
    best_predicted = ranked[0][1]
    check = first if first == DEFAULT_KERNEL else [first]
    return {
        "table": first,
        "check": check,
        "top2": names[:2], "top3": names[:3], "top2+flash": [*names[:2], "sdpa_flash"],
        "shipped": check if q_len == 1 else [*names[:2], "sdpa_flash"],  # dispatcher/measured_candidates.py on a GPU
        "tuned": [name for name, seconds in ranked if seconds <= best_predicted * TUNE_MARGIN][:MAX_TUNED],
        "shipped+family": shipped_plus_family(names, q_len),
        "top2+family": with_other_family(names[:2], names),
    }


def family(name: str) -> str:
    """A kernel's family: ``small_q[splits=8]`` -> ``small_q``, ``convert[...]+k`` -> ``convert``."""
    return name.split("[", 1)[0]


def with_other_family(contenders: list[str], names: list[str]) -> list[str]:
    """`contenders` and the table's first choice of a family none of them (nor PyTorch's backends,
    all ``sdpa_*``) belongs to: one of our own kernels, where the table ranked only PyTorch's first."""
    taken = {family(name) for name in contenders}
    other = next((name for name in names if family(name) not in taken and not name.startswith("sdpa_")), None)
    return [*contenders, other] if other else list(contenders)


def shipped_plus_family(names: list[str], q_len: int) -> list[str] | str:
    """``shipped`` with `with_other_family` where it times more than the table's pick (not decode)."""
    first = names[0]
    if q_len == 1:
        return first if first == DEFAULT_KERNEL else [first]
    return with_other_family([*names[:2], "sdpa_flash"], names)


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", help="a bench/llm_grid.py results file (.jsonl or .jsonl.gz)")
    parser.add_argument("--table", default="models/tables/nvidia-h200-140gb.json")
    args = parser.parse_args()
    rows = read_grid(args.grid)
    table = load_table(args.table)
    results: dict[str, list[tuple[float, float, int]]] = {}
    with assume_backends_available():
        for row in rows:
            times = recorded_times(row)
            problem = Problem.from_dict(row["problem"])
            ranked = table.rank(problem, [kernel_named(name) for name in times])
            fastest, default = min(times.values()), times[DEFAULT_KERNEL]
            for policy, contenders in policies(ranked, problem.q_len).items():
                pick = contenders if isinstance(contenders, str) else measured_choice(contenders, times)
                results.setdefault(policy, []).append((default / times[pick], times[pick] / fastest, problem.q_len))
    print(f"{len(rows)} shapes of {args.grid}; table {args.table}; no dispatch overhead counted")
    for policy, values in results.items():
        small_q = [speed for speed, _, q_len in values if SMALL_Q_ROWS[0] <= q_len <= SMALL_Q_ROWS[1]]
        print(f"{policy:11s} over PyTorch's default {geomean([v[0] for v in values]):.3f}x (Lq 2-64 "
              f"{geomean(small_q):.3f}x, worst {min(v[0] for v in values):.2f}x); against the fastest "
              f"{geomean([v[1] for v in values]):.3f}, worst {max(v[1] for v in values):.2f}")


if __name__ == "__main__":
    main()
