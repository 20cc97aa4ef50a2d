"""The 580-shape LLM grid of shared/reference/h200-probe.md, warm: the dispatcher against PyTorch's
default and against the fastest kernel measured on each shape (issue 14's grid target, issue 15's
table-only target).

Grid: batch 1, 32 query heads, fp16 and bf16, head dim 64/128/256, GQA 1 and 4 (32 or 8 K/V heads),
Lq in {1, 2, 4, ..., 64, 128, 512, 2048, 8192}, Lk in {512, 2k, 8k, 32k, 128k} (no 128k at head dim
256), Lq < Lk non-causal, plus Lq = Lk in {512, 2048, 8192} causal: 580 shapes.

Paths per shape, each called as a user calls it, on the same inputs:
- ``pytorch``: `F.scaled_dot_product_attention` (PyTorch's own choice);
- ``kernel:<name>``: every kernel of ``Dispatcher(kernels="all")`` that supports the shape, called
  through its bound runner, except the conversions (half inputs: the lossless ones go through fp32,
  4-13x slower on this card: h200-probe.md) and the full-matrix paths past `FULL_MATRIX_LIMIT`;
The dispatchers are called through ``fast_attention`` as PyTorch's SDPA is called (what `patched`
and transformers call: the C++ fast path, built first where it is not, `dispatcher.fast_path`;
runs before session 10 called ``attention``, the Python method):
- ``table``: ``Dispatcher(measure=False)``, the table (or prior) alone;
- ``shipped``: ``Dispatcher(remember_tunings=False)`` as installed: the table, and each bucket no
  measured entry of this card decides measured on its own calls (`dispatcher/measuring.py`), afresh
  in every run;
- ``shipped_b`` (with ``--home-b DIR``): the same, served from the tables imported into DIR (`import`):
  two tables side by side on the same inputs.

Each path's first call is timed alone (`cold_s`: the dispatchers decide there, PyTorch builds its
per-shape plan); a second call estimates the per-call time; kernels `LOSER_FACTOR` x slower than the
best so far stop there. A dispatcher whose bucket still measures its candidates, or whose plan for
the shape runs a set-up-free kernel until it settles, is called until it has decided and up to its
settle point (`settle_calls`, within `SETTLE_BUDGET_S`): warm is each path's steady state. Then `ROUNDS` interleaved rounds (the paths in a seeded shuffle each round,
`round_order`, so that no path always runs right after the same one), each sample a batch of
back-to-back calls of about `calibration.timer.TARGET_SAMPLE_S`, timed by CUDA events; medians and
interquartile ranges per path. Shapes run in a shuffled order (`--seed`), so a run cut by
`--budget-s` is a fair sample; every shape appends one JSON line to `--out` as it ends.

Usage (from the repository root, the card's table installed or bundled):
    python -m bench.llm_grid --device cuda --out bench/results/llm_grid.jsonl [--budget-s 420]
    python -m bench.llm_grid --device cuda --heldout 200 --out heldout.jsonl   # shapes off the grid
    python -m bench.llm_grid --summarize bench/results/h200_session16/run3_grid_every_path.jsonl.gz
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time

import torch

from attn_dispatch.calibration.inputs import make_inputs
from attn_dispatch.calibration.timer import calls_per_sample, interquartile_range, time_batch
from attn_dispatch.dispatcher.plans import cache_key
from attn_dispatch.kernels import Problem, kernel_from_name
from attn_dispatch.kernels.convert import ConvertKernel
from attn_dispatch.kernels.sdpa_backends import pytorch_sdpa
from bench.grid_measurements import grid_lines

Q_HEADS, BATCH = 32, 1
GRID_DTYPES = ("float16", "bfloat16")
GRID_HEAD_DIMS = (64, 128, 256)
GRID_GQA = (1, 4)
GRID_Q_LENS = (1, 2, 4, 8, 16, 32, 64, 128, 512, 2048, 8192)
GRID_KV_LENS = (512, 2048, 8192, 32768, 131072)
GRID_CAUSAL_LENS = (512, 2048, 8192)
LONGEST_KV_AT_HEAD_DIM_256 = 32768  # the probe left 128k keys out at head dim 256
SMALL_Q_ROWS = (2, 64)  # the "Lq 2-64" slice (speculative decoding, chunked prefill)

ROUNDS = 5
LOSER_FACTOR = 4.0  # a kernel this much slower than the best so far cannot be the oracle whatever the noise
FULL_MATRIX_LIMIT = 1 << 30  # score-matrix bytes (fp32) past which `math` / `sdpa_math` are not run
DISPATCHERS = ("table", "shipped", "shipped_b")
CONTROL = "pytorch_again"
"""An A/A control path (only where ``--paths`` names it): PyTorch's call again, timed as the
dispatchers are, so its paired ratios to ``pytorch`` show how many shapes the measurement alone
puts over `SLOWER_MARGIN`."""
TRITON_PREFIXES = ("kernel:triton_flash[", "kernel:triton_decode[")
"""Labels of the ``triton`` path group."""
SLOWER_MARGIN = 1.03  # "slower than the default by more than 3%" (the wording)
SETTLE_BUDGET_S = 3.0
"""Most seconds of back-to-back calls a dispatcher path may spend on one shape to reach its settle
point before it is timed (`settle_calls`). "Warm" is each path's steady state on a shape that keeps
being called: PyTorch's after its first call (cuDNN's per-shape plan built), the dispatcher's once a
plan that runs a set-up-free kernel in place of one that sets up per shape has settled
(`dispatcher.selection.settle_after`): cuDNN's ~36 ms set-up over a 5% loss on a 30 us call is
24,000 calls, 0.7 s. No grid shape has one (each is the first of its decision bucket, where no
swap happens: session 14, runs 3 and 5); shapes of an off-grid draw (`--heldout`) can share one."""


def grid_problems(device_type: str = "cuda", batch: int = BATCH) -> list[Problem]:
    """The probe's 580 shapes as `Problem`s (see the module docstring), at `batch` (the probe's is 1)."""
    problems = []
    for dtype in GRID_DTYPES:
        for dim in GRID_HEAD_DIMS:
            kv_lens = [s for s in GRID_KV_LENS if dim < 256 or s <= LONGEST_KV_AT_HEAD_DIM_256]
            for gqa in GRID_GQA:
                kv_heads = Q_HEADS // gqa
                for s in kv_lens:
                    for q in GRID_Q_LENS:
                        if q < s or (q == s and q in GRID_CAUSAL_LENS):
                            problems.append(Problem(batch, Q_HEADS, kv_heads, q, s, dim, dim, dtype, causal=q == s,
                                                    device_type=device_type))
    return problems


HELDOUT_BATCHES = (1, 2, 4)
HELDOUT_HEADS = ((32, 32), (32, 8), (40, 8), (28, 4))  # (query heads, K/V heads): the grid's, plus two it lacks
HELDOUT_HEAD_DIMS = (64, 96, 128, 256)
HELDOUT_KV_RANGE = (600, 110_000)
HELDOUT_KV_BYTES = 8 << 30  # K and V of one shape at most this large (keeps every path on the card)
HELDOUT_DECODE_SHARE, HELDOUT_SMALL_Q_SHARE = 0.25, 0.45  # Lq = 1; Lq 2-96; the rest 100-6000, a sixth causal


def heldout_problems(count: int, seed: int, device_type: str = "cuda") -> list[Problem]:
    """`count` shapes off the grid, drawn with `seed`: lengths between its powers of two (log-uniform),
    batches 2 and 4, head counts 40/8 and 28/4 and head dim 96 beside the grid's. A table fitted on
    grid measurements meets these in buckets the grid has (lengths rounding up to its powers of two)
    and in buckets it lacks: issue 15's "held-out shapes", drawn the same way every run."""
    rng = random.Random(seed)
    problems: list[Problem] = []

    def log_uniform(low: float, high: float) -> int:
        return round(math.exp(rng.uniform(math.log(low), math.log(high))))

    while len(problems) < count:
        batch, (q_heads, kv_heads) = rng.choice(HELDOUT_BATCHES), rng.choice(HELDOUT_HEADS)
        dim, dtype = rng.choice(HELDOUT_HEAD_DIMS), rng.choice(GRID_DTYPES)
        draw = rng.random()
        s = log_uniform(*HELDOUT_KV_RANGE)
        if draw < HELDOUT_DECODE_SHARE:
            q, causal = 1, False
        elif draw < HELDOUT_DECODE_SHARE + HELDOUT_SMALL_Q_SHARE:
            q, causal = log_uniform(2, 96), False
        else:
            q = log_uniform(100, 6000)
            causal = rng.random() < 1 / 6
            s = q if causal else max(s, q + 1)
        if q in GRID_Q_LENS and s in GRID_KV_LENS or 2 * batch * kv_heads * s * dim * 2 > HELDOUT_KV_BYTES:
            continue
        problems.append(Problem(batch, q_heads, kv_heads, q, s, dim, dim, dtype, causal=causal,
                                device_type=device_type))
    return problems


def oracle_kernels(dispatcher, problem: Problem, extra: tuple = ()) -> dict:
    """Kernels of the dispatcher's set and `extra` (``--extra-kernels``) worth timing on `problem` (see the module
    docstring)."""
    score_bytes = problem.batch * problem.q_heads * problem.q_len * problem.kv_len * 4
    chosen = {}
    for kernel in (*dispatcher.kernels, *extra):
        if isinstance(kernel, ConvertKernel) or kernel.name == "sdpa_default" or kernel.reasons(problem):
            continue
        if kernel.family in ("math", "sdpa_math") and score_bytes > FULL_MATRIX_LIMIT:
            continue
        chosen[f"kernel:{kernel.name}"] = kernel
    return chosen


def make_paths(problem: Problem, inputs, dispatchers: dict, only: frozenset[str] | None = None,
               extra_kernels: tuple = ()) -> dict:
    """label -> ``() -> tensor`` for every path of `problem` (those `only` names where given:
    ``pytorch``, the dispatchers' names, ``kernels`` for every ``kernel:<name>``, ``triton`` for those of the
    Triton families). Kernel paths come before the dispatchers: a Triton variant a kernel path compiled is
    compiled for the dispatchers too, as in a process that has run it before."""
    q, k, v, gqa = inputs.query, inputs.key, inputs.value, inputs.enable_gqa
    extra = {"enable_gqa": True} if gqa else {}
    paths = {"pytorch": lambda: pytorch_sdpa(q, k, v, is_causal=problem.causal, **extra)}  # as users call it
    if only is not None and CONTROL in only:  # the same call again: the paired ratio's own noise
        paths[CONTROL] = lambda: pytorch_sdpa(q, k, v, is_causal=problem.causal, **extra)
    for label, kernel in oracle_kernels(dispatchers["table"], problem, extra_kernels).items():
        run = kernel.runner(problem)
        paths[label] = lambda run=run: run(q, k, v, None, None, gqa, problem)
    for name, ours in dispatchers.items():
        paths[name] = lambda run=ours.fast_attention: run(q, k, v, is_causal=problem.causal, **extra)
    if only is None:
        return paths
    return {label: call for label, call in paths.items()
            if label in only or ("kernels" in only and label.startswith("kernel:"))
            or ("triton" in only and label.startswith(TRITON_PREFIXES))}


def _timed_call(call, device) -> float:
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    start = time.perf_counter()
    call()
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    return time.perf_counter() - start


def measure_shape(problem: Problem, device: torch.device, dispatchers: dict, rounds: int,
                  only: frozenset[str] | None = None, extra_kernels: tuple = ()) -> dict:
    """One shape: cold call, estimate, pruning, interleaved rounds (module docstring); each timed
    path keeps its per-round seconds (``samples_s``, in round order: round i of two paths ran
    side by side, so their ratio per round pairs out the host's drift)."""
    inputs = make_inputs(problem, device)
    paths = make_paths(problem, inputs, dispatchers, only, extra_kernels)
    cold, estimate, failed = {}, {}, {}
    for label, call in paths.items():
        try:
            cold[label] = _timed_call(call, device)
            estimate[label] = _timed_call(call, device)
        except Exception as error:  # noqa: BLE001 - a failing path is recorded, not fatal
            failed[label] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    shape_key = cache_key(inputs.query, inputs.key, inputs.value, None, problem.causal, inputs.enable_gqa)
    settled = {name: settle_calls(ours, shape_key, paths[name], estimate[name])
               for name, ours in dispatchers.items() if name in estimate}
    best = min(estimate.values())
    timed = [label for label in estimate
             if not label.startswith("kernel:") or estimate[label] <= LOSER_FACTOR * best]
    samples = {label: [] for label in timed}
    # One batch size for every path, sized on the fastest path's single-call estimate. Sized per path
    # instead, each on its own second call (which may still be set-up: cuDNN's, the dispatcher's
    # first decisions), the A/A control read 0.964x PyTorch's path on the H200 grid's kept-default
    # shapes (session 13, run 3): a batch of fewer calls carries more of the fixed event and launch
    # latency per call.
    calls = calls_per_sample(best)
    for index in range(rounds):
        for label in round_order(timed, index):
            call = paths[label]
            samples[label].append(time_batch(lambda _i, call=call: call(), 0, calls, device))
    plans = {name: ours._plans.get(shape_key) for name, ours in dispatchers.items()}
    chosen = {name: plan.kernel.name if plan is not None else None for name, plan in plans.items()}
    return {
        "problem": problem.to_dict(), "chosen": chosen, "failed": failed, "why": _why(dispatchers, inputs, problem),
        "settle_calls": {name: calls for name, calls in settled.items() if calls},
        "paths": {label: {"cold_s": cold[label], "median_s": statistics.median(s),
                          "iqr_s": interquartile_range(s), "samples": len(s), "samples_s": s} if s else
                  {"cold_s": cold[label], "median_s": None, "once_s": estimate[label]}
                  for label, s in ((label, samples.get(label, [])) for label in estimate)},
    }


def _why(dispatchers: dict, inputs, problem: Problem) -> dict:
    """Each dispatcher's account of the shape's decision: its first candidates with their predicted
    seconds and its notes (the measuring's outcome among them)."""
    extra = {"enable_gqa": True} if inputs.enable_gqa else {}
    why = {}
    for name, ours in dispatchers.items():
        try:
            decision = ours.explain(inputs.query, inputs.key, inputs.value, is_causal=problem.causal, **extra)
        except Exception as error:  # noqa: BLE001 - a diagnostic, never fatal
            why[name] = f"{type(error).__name__}: {error}"
            continue
        why[name] = {"candidates": [[c.name, c.predicted_s] for c in decision.candidates[:6]],
                     "notes": list(decision.notes)}
    return why


def round_order(labels: list[str], index: int) -> list[str]:
    """The paths' order in round `index`: a shuffle seeded by the round. Rotating one fixed order
    (before session 14) kept every path behind the same one in every round but the one it led:
    with 15 paths and 5 rounds the table-only column ran behind the kernel paths throughout, and
    where it kept PyTorch's call it read a paired median of 1.015 against the shipped column's
    0.999 on the same shapes (run 1); behind PyTorch's own call in run 3, 1.0007. That the order
    caused the difference is likely, not shown: no shuffled run has been made on the card yet."""
    order = list(labels)
    random.Random(index).shuffle(order)
    return order


def settle_calls(dispatcher, shape_key: tuple, call, once_s: float) -> int:
    """Calls made so that `dispatcher`'s bucket for this shape has decided its measuring and its plan
    reached its settle point: 0 where there is neither (or both are done); minus the calls a settle
    point would take where that is over `SETTLE_BUDGET_S` (none made). A plan that settles runs the
    bucket's decided kernel afterwards."""
    measuring = 0
    plan = dispatcher._plans.get(shape_key)
    while (plan is not None and plan.trial is not None and plan.trial.open
           and (measuring + 1) * once_s <= SETTLE_BUDGET_S):
        call()
        measuring += 1
        plan = dispatcher._plans.get(shape_key)
    if measuring:
        call()  # the plan made from the decided bucket
        plan, measuring = dispatcher._plans.get(shape_key), measuring + 1
    settle = _settle_point_calls(plan, call, once_s)
    return settle if settle < 0 else measuring + settle


def _settle_point_calls(plan, call, once_s: float) -> int:
    """Calls made so that `plan` reaches its settle point (`settle_calls`' rule for that part)."""
    if plan is None or not plan.settle_at:
        return 0
    remaining = plan.settle_at - plan.count[0]
    if remaining <= 0:
        return 0
    if remaining * once_s > SETTLE_BUDGET_S:
        return -remaining
    for _ in range(remaining):
        call()
    return remaining


def conditions(device: torch.device, rounds: int, paths: frozenset[str] | None = None) -> dict:
    import attn_dispatch
    from attn_dispatch.dispatcher import fast_path

    info = {"torch": torch.__version__, "attn_dispatch": attn_dispatch.__version__, "device": str(device),
            "rounds": rounds, "loser_factor": LOSER_FACTOR, "measure_env": os.environ.get("ATTN_DISPATCH_MEASURE"),
            "home": os.environ.get("ATTN_DISPATCH_HOME"), "entry": "fast_attention", "paths": paths,
            "fast_path": fast_path.load() is not None, "settle_budget_s": SETTLE_BUDGET_S}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def run(args) -> None:
    import attn_dispatch as ad

    device = torch.device(args.device)
    shapes = (grid_problems(device.type, args.batch) if args.heldout == 0
              else heldout_problems(args.heldout, args.seed + 1, device.type))
    problems = [p for p in shapes if args.min_kv <= p.kv_len <= args.max_kv and p.head_dim <= args.max_head_dim
                and p.q_len >= args.min_q]
    random.Random(args.seed).shuffle(problems)
    if args.limit:
        problems = problems[: args.limit]
    from attn_dispatch.dispatcher import fast_path

    if fast_path.fast_path_enabled() and fast_path.load() is None:
        print(f"building the fast path ... {fast_path.build()}", flush=True)
    dispatchers = {"table": ad.Dispatcher(measure=False), "shipped": ad.Dispatcher(remember_tunings=False)}
    if args.home_b:
        dispatchers["shipped_b"] = ad.Dispatcher(remember_tunings=False, home=args.home_b)
    extra_kernels = tuple(kernel_from_name(name) for name in args.extra_kernels)
    started = time.perf_counter()
    with open(args.out, "a") as out:
        out.write(json.dumps({"conditions": conditions(device, args.rounds, sorted(args.paths) if args.paths else None), "shapes": len(problems)}) + "\n")
        for index, problem in enumerate(problems):
            if time.perf_counter() - started > args.budget_s:
                print(f"budget spent after {index} of {len(problems)} shapes", flush=True)
                break
            row = measure_shape(problem, device, dispatchers, args.rounds, args.paths, extra_kernels)
            out.write(json.dumps(row) + "\n")
            out.flush()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    summarize(args.out)


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def summarize(path: str) -> None:
    """Print the grid's ratios from a results file, plain or gzipped (the last run in it)."""
    rows = []
    for row in grid_lines(path):
        if "conditions" in row:
            rows, conditions_row = [], row
        else:
            rows.append(row)
    print(json.dumps(conditions_row["conditions"]))
    print(f"{len(rows)} shapes of {conditions_row['shapes']}")

    def median(row, label):
        value = row["paths"].get(label, {}).get("median_s")
        return value if value else None

    def oracle(row):
        timed = [p["median_s"] for label, p in row["paths"].items()
                 if (label == "pytorch" or label.startswith("kernel:")) and p.get("median_s")]
        return min(timed) if timed else None

    fused = ("kernel:sdpa_flash", "kernel:sdpa_cudnn", "kernel:sdpa_efficient")
    for subset_name, keep in (("all shapes", lambda p: True),
                              ("Lq 2-64", lambda p: SMALL_Q_ROWS[0] <= p["q_len"] <= SMALL_Q_ROWS[1]),
                              ("Lq 1", lambda p: p["q_len"] == 1), ("Lq > 64", lambda p: p["q_len"] > 64)):
        chosen = [r for r in rows if keep(r["problem"]) and median(r, "pytorch")]
        fused_pairs = [(r, min(m for m in (median(r, f) for f in fused) if m)) for r in chosen
                       if any(median(r, f) for f in fused)]  # shapes where a fused backend ran
        line = [f"{subset_name} ({len(chosen)}):",
                f"oracle {_geomean([median(r, 'pytorch') / oracle(r) for r in chosen]):.3f}x",
                f"best fused {_geomean([median(r, 'pytorch') / b for r, b in fused_pairs]):.3f}x"]
        for name in DISPATCHERS:
            mine = [(r, median(r, name)) for r in chosen if median(r, name)]
            if not mine:
                continue
            speed = [median(r, "pytorch") / m for r, m in mine]
            to_oracle = [m / oracle(r) for r, m in mine]
            slower = sum(1 for s in speed if 1 / s > SLOWER_MARGIN)
            line.append(f"{name}: {_geomean(speed):.3f}x over default, {slower} >3% slower, "
                        f"vs oracle geomean {_geomean(to_oracle):.3f} worst {max(to_oracle, default=math.nan):.2f}")
        print("  ".join(line))
    for line in paired_lines(rows) + settle_lines(rows):
        print(line)


def settle_lines(rows: list[dict]) -> list[str]:
    """Per dispatcher, the shapes called up to their settle point before timing (`settle_calls`)."""
    lines = []
    for name in DISPATCHERS:
        calls = [row.get("settle_calls", {}).get(name) for row in rows]
        warmed = [c for c in calls if c and c > 0]
        over = [-c for c in calls if c and c < 0]
        if warmed or over:
            lines.append(f"{name}: {len(warmed)} shapes called to their settle point before timing "
                         f"({min(warmed, default=0)}-{max(warmed, default=0)} calls); {len(over)} would have "
                         f"needed more than {SETTLE_BUDGET_S:g} s ({min(over, default=0)}-{max(over, default=0)} calls), "
                         "timed unsettled")
    return lines


def paired_ratios(row: dict, label: str) -> float | None:
    """Median over rounds of `label`'s time / PyTorch's in the same round (None without both
    paths' per-round samples: runs before ``samples_s`` was kept)."""
    mine = row["paths"].get(label, {}).get("samples_s")
    theirs = row["paths"].get("pytorch", {}).get("samples_s")
    if not mine or not theirs or len(mine) != len(theirs):
        return None
    return statistics.median(m / t for m, t in zip(mine, theirs, strict=True))


def _quartiles(values: list[float]) -> tuple[float, float]:
    """First and third quartiles of `values` (NaN for fewer than two)."""
    if len(values) < 2:
        return math.nan, math.nan
    first, _, third = statistics.quantiles(values, n=4)
    return first, third


def paired_lines(rows: list[dict]) -> list[str]:
    """Per dispatcher, the per-round paired ratio to PyTorch's default: shapes over `SLOWER_MARGIN`,
    split by whether the dispatcher kept PyTorch's own call there (then only overhead and noise
    can make it slower) or chose another kernel."""
    lines = []
    control = [ratio for r in rows if (ratio := paired_ratios(r, CONTROL)) is not None]
    if control:
        low, high = _quartiles(control)
        lines.append(f"{CONTROL} (A/A control), paired per round: {len(control)} shapes, median "
                     f"{statistics.median(control):.4f}, quartiles {low:.3f}-{high:.3f}, "
                     f"{sum(1 for x in control if x > SLOWER_MARGIN)} >3% slower, "
                     f"{sum(1 for x in control if x < 1 / SLOWER_MARGIN)} >3% faster")
    for name in DISPATCHERS:
        paired = [(r, ratio) for r in rows if (ratio := paired_ratios(r, name)) is not None]
        if not paired:
            continue
        kept = [ratio for r, ratio in paired if r["chosen"].get(name) == "sdpa_default"]
        other = [(r, ratio) for r, ratio in paired if r["chosen"].get(name) != "sdpa_default"]
        slow_other = sorted(((ratio, r) for r, ratio in other if ratio > SLOWER_MARGIN), key=lambda x: -x[0])
        low, high = _quartiles(kept)
        lines.append(
            f"{name}, paired per round: {len(paired)} shapes, {_geomean([ratio for _, ratio in paired]):.3f}x "
            f"PyTorch's time; kept PyTorch's call on {len(kept)} (median {statistics.median(kept) if kept else math.nan:.4f}, "
            f"quartiles {low:.3f}-{high:.3f}, {sum(1 for x in kept if x > SLOWER_MARGIN)} >3% slower); "
            f"another kernel on {len(other)} ({len(slow_other)} >3% slower)")
        for ratio, r in slow_other:
            p = r["problem"]
            lines.append(f"  {ratio:.3f}x {r['chosen'].get(name)}: B{p['batch']} {p['q_heads']}/{p['kv_heads']} Lq{p['q_len']} "
                         f"Lk{p['kv_len']} D{p['head_dim']} {p['dtype']}{' causal' if p['causal'] else ''}")
    return lines


def _path_names(text: str) -> frozenset[str]:
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = names - {"pytorch", "kernels", "triton", CONTROL, *DISPATCHERS}
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--paths: unknown {sorted(unknown)}; use pytorch, kernels, triton, {CONTROL}, "
                                         f"{', '.join(DISPATCHERS)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="bench/results/llm_grid.jsonl")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--budget-s", type=float, default=math.inf, help="no new shape after this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="only the first N shapes of the shuffled grid")
    parser.add_argument("--min-kv", type=int, default=0, help="only shapes with at least this many keys")
    parser.add_argument("--min-q", type=int, default=0, help="only shapes with at least this many query rows")
    parser.add_argument("--max-kv", type=int, default=max(GRID_KV_LENS), help="only shapes with at most this many keys")
    parser.add_argument("--max-head-dim", type=int, default=max(GRID_HEAD_DIMS), help="only shapes with at most this head dim")
    parser.add_argument("--batch", type=int, default=BATCH,
                        help="the grid's shapes at this batch (the probe's: 1; the bundled table's worst held-out picks "
                             "are batch 2-4 decode, which no grid run has measured)")
    parser.add_argument("--heldout", type=int, default=0, metavar="N",
                        help="N shapes off the grid instead of the grid (`heldout_problems`, drawn with --seed + 1)")
    parser.add_argument("--paths", type=_path_names, default=None, metavar="LABELS",
                        help="time only these paths, comma-separated: pytorch, table, shipped, kernels (every "
                             "kernel:<name>), triton (the Triton kernels' kernel:<name> paths), pytorch_again (PyTorch's call again: an A/A control of the paired ratio); "
                             "e.g. pytorch,pytorch_again,shipped with --rounds 21 checks the 3%% bound on 20-40 us calls")
    parser.add_argument("--extra-kernels", type=lambda text: [n.strip() for n in text.split(";") if n.strip()],
                        default=[], metavar="NAMES",
                        help="more kernels timed as kernel:<name> paths, ';'-separated (e.g. Triton configurations: "
                             "\"triton_flash[bm=128,bn=128,w=8,s=3];triton_decode[splits=32,bn=128,w=4,s=2]\")")
    parser.add_argument("--home-b", metavar="DIR", default=None,
                        help="also time `shipped_b`: the shipped dispatcher served from the tables imported into DIR")
    parser.add_argument("--summarize", metavar="FILE", help="print the summary of a results file and stop")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
    else:
        run(args)


if __name__ == "__main__":
    main()
