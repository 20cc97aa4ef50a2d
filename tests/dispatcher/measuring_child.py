"""A process that calls one bucket 40 times with a dispatcher measuring on its calls, under a
virtual clock (a kernel named "fast" takes half the baseline's virtual time), and prints what ran
as one JSON line: ``python -m tests.dispatcher.measuring_child HOME``. `test_first_call` runs it
twice with one home: the second process must measure nothing again."""

from __future__ import annotations

import json
import sys

from attn_dispatch.dispatcher import Dispatcher, cold_path
from attn_dispatch.dispatcher import device_planner as planner
from attn_dispatch.dispatcher.device_ranking import DeviceRanking
from tests.dispatcher.helpers import PRIOR_SOURCE, FixedRanker, qkv
from tests.dispatcher.test_measuring import BASE_S, Timed, VirtualClock


def main(home: str) -> int:
    clock = VirtualClock()
    planner.clock_for = lambda device: clock
    cold_path.resolve_ranking = lambda device, *, home=None: DeviceRanking(
        table=FixedRanker(["base", "fast"]), prior=None, source=PRIOR_SOURCE, prior_source=PRIOR_SOURCE)
    base, fast = Timed("base", BASE_S, clock), Timed("fast", BASE_S / 2, clock)
    ours = Dispatcher(kernels=[base, fast], home=home, measure=True)
    inputs = qkv()
    for _ in range(40):
        ours.attention(**inputs)
    decision = ours.explain(**inputs)
    print(json.dumps({"base": len(base.outputs), "fast": len(fast.outputs), "kernel": decision.kernel,
                      "notes": list(decision.notes)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
