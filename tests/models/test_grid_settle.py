"""The grid's warm-up to a dispatcher plan's settle point and its bucket's decided measuring
(`bench.llm_grid.settle_calls`), and its round order."""

from __future__ import annotations

from types import SimpleNamespace

from bench.llm_grid import SETTLE_BUDGET_S, settle_calls

KEY = ("shape",)


def dispatcher_with(settle_at: int, count: int):
    """A stand-in dispatcher holding one plan, and the call that counts as the fast path does."""
    plan = SimpleNamespace(settle_at=settle_at, count=[count], trial=None)
    dispatcher = SimpleNamespace(_plans={KEY: plan})

    def call():
        plan.count[0] += 1

    return dispatcher, plan, call


def test_calls_up_to_the_settle_point():
    dispatcher, plan, call = dispatcher_with(settle_at=1000, count=2)
    assert settle_calls(dispatcher, KEY, call, once_s=25e-6) == 998
    assert plan.count[0] == 1000


def test_no_settle_point_no_calls():
    dispatcher, plan, call = dispatcher_with(settle_at=0, count=2)
    assert settle_calls(dispatcher, KEY, call, once_s=25e-6) == 0
    assert plan.count[0] == 2
    assert settle_calls(SimpleNamespace(_plans={}), KEY, call, once_s=25e-6) == 0


def test_already_settled_no_calls():
    dispatcher, plan, call = dispatcher_with(settle_at=5, count=9)
    assert settle_calls(dispatcher, KEY, call, once_s=25e-6) == 0
    assert plan.count[0] == 9


def test_over_the_budget_reports_the_calls_it_would_take_and_makes_none():
    once_s = 1e-3
    needed = int(2 * SETTLE_BUDGET_S / once_s)
    dispatcher, plan, call = dispatcher_with(settle_at=needed + 2, count=2)
    assert settle_calls(dispatcher, KEY, call, once_s=once_s) == -needed
    assert plan.count[0] == 2


def test_a_bucket_still_measuring_is_called_until_it_has_decided():
    """A plan whose bucket measures its candidates on its calls (`dispatcher.measuring`) is called
    until the trial closes (the dispatcher then plans it again), then once more for the new plan."""
    trial = SimpleNamespace(open=True)
    measuring = SimpleNamespace(settle_at=0, count=[1], trial=trial)
    decided = SimpleNamespace(settle_at=0, count=[0], trial=None)
    dispatcher = SimpleNamespace(_plans={KEY: measuring})

    def call():
        plan = dispatcher._plans[KEY]
        plan.count[0] += 1
        if plan is measuring and plan.count[0] == 6:
            trial.open = False
            dispatcher._plans[KEY] = decided

    assert settle_calls(dispatcher, KEY, call, once_s=25e-6) == 6
    assert measuring.count[0] == 6 and decided.count[0] == 1


def test_rounds_shuffle_the_paths_so_none_always_follows_the_same_one():
    from bench.llm_grid import round_order

    labels = [f"path{i}" for i in range(15)]
    orders = [round_order(labels, index) for index in range(5)]
    assert all(sorted(order) == sorted(labels) for order in orders)
    assert orders == [round_order(labels, index) for index in range(5)]  # seeded: a rerun repeats them
    predecessors = {label: {order[order.index(label) - 1] for order in orders if order.index(label)}
                    for label in labels}
    assert sum(len(before) > 1 for before in predecessors.values()) >= 10
