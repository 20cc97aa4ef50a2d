"""One-off (recorded in docs/RESULTS.md#h100-without-tables, then removed; git keeps it): a card without a table,
as simulated on recorded every-kernel grids, with and without `selection.sets_up_past_budget` (a candidate whose
first call's set-up is over the bucket's measuring budget takes no candidate's place).

Each shape's bucket is decided by `selection.decide` under the card's analytic prior (PyTorch's backends answering
as recorded on the H200, `bench/offline_card.py`); its trial sets aside a candidate whose set-up is over the budget
and keeps the fastest of the rest that beats PyTorch's default by `MIN_WIN_MARGIN`, readings taken as exact (the
device-backed rule and the measuring's own cost not simulated). A candidate the file did not time wins nothing.

    python -m bench.setup_budget_rule H200 FILE.jsonl.gz ...
"""

from __future__ import annotations

import collections
import gzip
import json
import math
import os
import sys

import torch

os.environ["TRITON_INTERPRET"] = "0"

from attn_dispatch.dispatcher import selection  # noqa: E402
from attn_dispatch.dispatcher.core import kernel_set  # noqa: E402
from attn_dispatch.dispatcher.decision import RankingSource  # noqa: E402
from attn_dispatch.dispatcher.device_ranking import DeviceRanking  # noqa: E402
from attn_dispatch.kernels import AccuracyPolicy, Problem, triton_decode, triton_flash  # noqa: E402
from attn_dispatch.kernels import _triton_support as support  # noqa: E402
from attn_dispatch.kernels.assumed_backends import assume_backends_available  # noqa: E402
from attn_dispatch.models import identity  # noqa: E402
from attn_dispatch.models.priors import PriorRanker  # noqa: E402
from bench.offline_card import H200_TORCH_2_11  # noqa: E402

HOPPER_SHARED_MEMORY = 227 * 1024


def fake_hopper() -> None:
    """Triton 3.6 on an sm_90 card, for deciding only."""
    support.gpu_architecture = lambda device_index=None: ("sm_90", (9, 0))
    support.triton_version = lambda: (3, 6)
    for module in (triton_flash, triton_decode):
        module.shared_memory_limit = lambda device_index=None: HOPPER_SHARED_MEMORY


def recorded_times(row: dict) -> dict[str, float]:
    times = {}
    for path, timing in row["paths"].items():
        seconds = timing.get("median_s") or timing.get("once_s")
        if path.startswith("kernel:") and seconds:
            times[path.removeprefix("kernel:")] = seconds
    return times


def simulate(path: str, ranking: DeviceRanking) -> None:
    kernels, policy, device = kernel_set("all", AccuracyPolicy()), AccuracyPolicy(), torch.device("cuda")
    rules = {"without": lambda *args: False, "with": selection.sets_up_past_budget}
    logs = {label: [] for label in rules}
    faster, slower, new_picks, places = 0, 0, collections.Counter(), collections.Counter()
    rows = [row for row in map(json.loads, gzip.open(path, "rt")) if "problem" in row]
    for row in rows:
        problem = Problem.from_dict(row["problem"])
        times, default_s = recorded_times(row), row["paths"]["pytorch"]["median_s"]
        picks, candidates = {}, {}
        for label, rule in rules.items():
            selection.sets_up_past_budget = rule
            chosen = selection.decide(problem, kernels=kernels, policy=policy, ranking=ranking, failed={}, free=None,
                                      budget=None, tuned=None, measure=True, device=device, portable=False,
                                      cold_costs={}).candidates
            candidates[label] = {option.kernel.name for option in chosen[1:]}
            pick = ("sdpa_default", default_s)
            for option in chosen[1:]:
                name = option.kernel.name
                if selection.cold_seconds(option.kernel, problem, {}) > selection.BUDGET_CALLS * default_s:
                    continue  # the trial sets it aside unmeasured
                seconds = times.get(name)
                if seconds is not None and seconds < pick[1] and seconds < default_s * (1 - selection.MIN_WIN_MARGIN):
                    pick = (name, seconds)
            picks[label] = pick
            logs[label].append(math.log(default_s / pick[1]))
        selection.sets_up_past_budget = rules["with"]
        places.update(name.split("[")[0] for name in candidates["with"] - candidates["without"])
        before, after = picks["without"][1], picks["with"][1]
        faster += after * (1 + selection.MIN_WIN_MARGIN) < before
        slower += after > before * (1 + selection.MIN_WIN_MARGIN)
        if after != before:
            new_picks[picks["with"][0]] += 1
    geomean = {label: math.exp(sum(values) / len(values)) for label, values in logs.items()}
    print(f"{path}: {len(rows)} shapes; over PyTorch's default without the rule {geomean['without']:.4f}x, with it "
          f"{geomean['with']:.4f}x; > 3% faster on {faster}, slower on {slower}; picks that changed {dict(new_picks)}; "
          f"places given to {dict(places)}")


def main() -> None:
    spec, paths = getattr(identity, sys.argv[1]), sys.argv[2:]
    fake_hopper()
    source = RankingSource("prior", f"analytic prior of {spec}", None, "card")
    ranking = DeviceRanking(table=None, prior=PriorRanker(spec), source=source, prior_source=source)
    with assume_backends_available(H200_TORCH_2_11):
        for path in paths:
            simulate(path, ranking)


if __name__ == "__main__":
    main()
