"""How far one kernel's time at one shape moves between H200 sessions, against the table's worst picks.

The table-only target (issue 15: worst pick <= 1.5x the fastest kernel measured) is judged against
one run's timings. Where a kernel's own time at a shape moves by more than that between runs, the
worst ratio says as much about the run as about the table. This reads recorded `bench.llm_grid`
files (every path: PyTorch's default and every kernel), takes the last file's `--worst` shapes by
the table's pick / fastest kernel, and prints each kernel's median at those shapes in every file
that timed them, with the spread across files (largest / smallest). Nothing is timed here.

    python -m bench.diagnostics.kernel_drift --worst 6 bench/results/h200_session8/run3_llm_grid.jsonl \\
        bench/results/h200_session9/run3_llm_grid.jsonl bench/results/h200_session14/run1_llm_grid_all_paths.jsonl \\
        bench/results/h200_session16/run3_grid_every_path.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json

PYTORCH = "pytorch"
"""llm_grid's path name for PyTorch's own call."""
PYTORCH_KERNEL = "sdpa_default"
"""The kernel name that call goes by in tables and here."""
KERNEL_PREFIX = "kernel:"


def read_rows(path: str) -> list[dict]:
    """The shape rows of one `bench.llm_grid` output (plain or gzipped JSON lines)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as lines:
        return [row for row in map(json.loads, lines) if "problem" in row]


def shape_key(problem: dict) -> tuple:
    """A hashable key of one recorded problem (its fields, lists as tuples)."""
    fields = ((name, tuple(value) if isinstance(value, list) else value) for name, value in problem.items())
    return tuple(sorted(fields))


def kernel_medians(row: dict) -> dict[str, float]:
    """Seconds per call of PyTorch's default (as ``sdpa_default``) and each kernel timed on the shape."""
    medians = {}
    for path, timing in row["paths"].items():
        seconds = timing.get("median_s")
        if seconds and (path == PYTORCH or path.startswith(KERNEL_PREFIX)):
            medians[PYTORCH_KERNEL if path == PYTORCH else path[len(KERNEL_PREFIX):]] = seconds
    return medians


def worst_table_picks(rows: list[dict], count: int) -> list[tuple[float, dict, dict[str, float]]]:
    """(the table path's time / the fastest kernel's, row, the row's `kernel_medians`) for the
    `count` shapes where that ratio is largest."""
    scored = []
    for row in rows:
        medians, table = kernel_medians(row), row["paths"].get("table", {}).get("median_s")
        if medians and table:
            scored.append((table / min(medians.values()), row, medians))
    return sorted(scored, key=lambda item: -item[0])[:count]


def describe(problem: dict) -> str:
    """``B1 32/8 Lq4 Lk32768 D128 bfloat16``."""
    return (f"B{problem['batch']} {problem['q_heads']}/{problem['kv_heads']} Lq{problem['q_len']} "
            f"Lk{problem['kv_len']} D{problem['head_dim']} {problem['dtype']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+",
                        help="llm_grid outputs, oldest first; the worst picks come from the last")
    parser.add_argument("--worst", type=int, default=5, help="how many of the last file's worst table picks")
    args = parser.parse_args()
    runs = [{shape_key(row["problem"]): kernel_medians(row) for row in read_rows(path)} for path in args.files]
    print("us per call, one column per file (" + ", ".join(args.files) + "); spread = largest / smallest")
    for ratio, row, medians in worst_table_picks(read_rows(args.files[-1]), args.worst):
        key, picked = shape_key(row["problem"]), row["chosen"]["table"]
        fastest = min(medians, key=medians.get)
        print(f"{describe(row['problem'])}: the table's {picked} at {ratio:.2f}x the fastest ({fastest})")
        for kernel in dict.fromkeys((picked, fastest, PYTORCH_KERNEL)):
            times = [run.get(key, {}).get(kernel) for run in runs]
            known = [t for t in times if t]
            cells = "  ".join(f"{t * 1e6:7.1f}" if t else "      -" for t in times)
            spread = f"{max(known) / min(known):.2f}x" if known else "-"
            print(f"    {kernel:28s} {cells}   spread {spread}")


if __name__ == "__main__":
    main()
