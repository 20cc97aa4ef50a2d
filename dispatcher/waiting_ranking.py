"""The waiting ranking: with nothing measured on the card, PyTorch's default runs a size bucket's first call whatever
the ranking, so the bucket's ranking waits for its second call (`Waiting`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attn_dispatch.dispatcher.device_ranking import FALLBACK_FIRST
from attn_dispatch.dispatcher.plans import Plan, mask_ndim_of
from attn_dispatch.dispatcher.selection import (
    Option,
    default_kept_first,
    measuring_wanted,
    needs_recheck,
    over_limit_reason,
    shape_setup_seconds,
    workspace_bound,
)
from attn_dispatch.kernels import Problem
from attn_dispatch.kernels.base import compile_seconds

if TYPE_CHECKING:
    from attn_dispatch.dispatcher.device_planner import Asked, Bucket, DevicePlanner


@dataclass(frozen=True)
class Waiting:
    """A bucket whose ranking waits for its second call: what its first call asked, PyTorch's default (which that call
    runs, the ranking putting it first anyway), `rank()` to rank it now (`WaitingRanking.rank`), the plans meanwhile."""

    asked: Asked
    default: Option
    rank: Callable[[], None]
    plans: list[Plan] = field(default_factory=list)


class WaitingRanking:
    """The waiting buckets of one `DevicePlanner`: whether a bucket may wait (`default_first`), making it wait
    (`wait`), its first call's plan (`plan_default`) and its ranking at its second call (`rank`)."""

    def __init__(self, planner: DevicePlanner) -> None:
        self.planner = planner

    def default_first(self, asked: Asked) -> Option | None:
        """PyTorch's default as the option `selection.decide` would put first, where that needs no ranking: stage 3
        keeps it first (`selection.default_kept_first`), no result measured on the bucket's calls, not the portable
        set, and the default runs the problem, has not failed on it, fits and compiles nothing; else None."""
        planner = self.planner
        kernel, problem = planner.config.kernels.get(FALLBACK_FIRST), asked.problem
        if (kernel is None or planner.portable or asked.tuned is not None or kernel.name in asked.failed
                or not default_kept_first(kernel, planner.state.ranking.source.level)
                or compile_seconds(kernel, problem) or kernel.reasons(problem)):
            return None
        option = Option(kernel, None, workspace_bound(kernel, problem))  # the workspace the ranking finds
        return option if over_limit_reason(option.workspace_bytes, asked.free, asked.budget) is None else None

    def wait(self, bucket: Bucket, asked: Asked, default: Option) -> None:
        """Make `bucket` wait for its second call to rank (`Waiting`), its first call running `default`; that call is
        the baseline's first in the trial the ranking would begin (it gets the other candidates from the ranking)."""
        planner = self.planner
        bucket.waiting = Waiting(asked, default, rank=lambda: self.rank(bucket))
        ranking = planner.state.ranking
        if asked.trial and measuring_wanted(planner.device, entry_decides=ranking.entry_decides(asked.problem),
                                            level=ranking.source.level):
            bucket.trial = planner.trial(bucket, (default,), asked, rank_rest=bucket.waiting.rank)

    def rank(self, bucket: Bucket) -> None:
        """Rank a waiting bucket as its first call would have (`Waiting`): its trial gets the other candidates; where
        the ranking measures nothing against the default, the trial ends and the first call's plan runs plainly; where
        the ranking puts another kernel first (the device's state changed since), that plan is planned again."""
        planner = self.planner
        with planner.lock:
            waiting = bucket.waiting
            if waiting is None:  # ranked meanwhile
                return
            candidates = planner.rank(bucket, waiting.asked, defer_probes=True)
            bucket.waiting = None
            trial = bucket.trial
            if trial is not None and candidates and candidates[0].kernel is waiting.default.kernel:
                trial.add_candidates(candidates, planner.setup_seconds(candidates, waiting.asked.problem))
                return
            if trial is not None:
                trial.cancel()
                for plan in trial.plans:
                    plan.stop_measuring()
            bucket.trial = planner.trial(bucket, candidates, waiting.asked) if candidates else None
            for plan in waiting.plans:
                if plan.kernel is not bucket.options[0].kernel:
                    plan.recheck = True

    def plan_default(self, bucket: Bucket, problem: Problem, shape_key: tuple) -> Plan:
        """The first call's plan of a waiting bucket: PyTorch's default, as `DevicePlanner` plans a decided bucket's
        first option on its own problem."""
        planner, waiting = self.planner, bucket.waiting
        kernel, workspace = waiting.default.kernel, waiting.default.workspace_bytes
        if shape_setup_seconds(kernel, problem, planner.cold_costs):
            planner.seen.add(kernel.name, shape_key)
        plan = Plan(problem, planner.device, kernel, workspace, needs_recheck(workspace, bucket.free), bucket,
                    mask_ndim=mask_ndim_of(shape_key))
        if bucket.trial is not None:
            plan.measure_with(bucket.trial)
        waiting.plans.append(plan)
        return plan
