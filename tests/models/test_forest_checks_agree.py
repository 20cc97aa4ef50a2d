"""The vectorised forest check (`forest._trees_valid`, the fast path of a table load) never
accepts a tree that the node-by-node check (`_tree`) rejects, on crafted trees: floats where ints
are required, bools where ints are, NaN and infinite numbers, children pointing backwards, and
integers too large for float64 or just past a bound (where a float64 conversion rounds onto it)."""

from __future__ import annotations

import copy

import pytest

from attn_dispatch.models.forest import MAX_THRESHOLD, _tree, _trees_valid
from attn_dispatch.models.table_schema import TableError

STUMP = {  # node 0 splits feature 0 at 0.5 into leaves 1 and 2
    "feature": [[0, 0, 0]], "threshold": [[0.5, 0, 0]], "left": [[1, 0, 0]], "right": [[2, 0, 0]],
    "missing_left": [[True, False, False]], "value": [[0.0, 1.0, -1.0]],
}


def _edited(field: str, node: int, value: object) -> dict:
    trees = copy.deepcopy(STUMP)
    trees[field][0][node] = value
    return trees


def _node_by_node_accepts(trees: dict) -> bool:
    try:
        _tree(trees, 0, "trees", 1)
    except TableError:
        return False
    return True


CRAFTED = [
    ("threshold", 0, int(MAX_THRESHOLD) + 1),  # rounds down onto the bound in float64
    ("threshold", 0, -int(MAX_THRESHOLD) - 1),
    ("threshold", 0, 10**309),  # past float64's range
    ("value", 0, 10**309),
    ("value", 1, 2**53 + 1),
    ("threshold", 0, float("inf")),
    ("threshold", 0, float("nan")),
    ("value", 1, float("nan")),
    ("feature", 0, 0.0),
    ("left", 0, True),
    ("right", 0, 2.0),
    ("left", 0, -1),
    ("left", 0, 2**63),
    ("missing_left", 0, 1),
    ("feature", 0, -1),
    ("right", 1, 1),
]


@pytest.mark.parametrize(("field", "node", "value"), CRAFTED)
def test_the_fast_check_accepts_nothing_the_node_by_node_check_rejects(field, node, value):
    trees = _edited(field, node, value)
    assert not _node_by_node_accepts(trees)  # every crafted tree is one the slow check rejects, as a TableError
    assert not _trees_valid(trees, 1, 1)


def test_a_child_pointing_back_is_rejected_by_both():
    trees = copy.deepcopy(STUMP)
    trees["left"][0][:] = [1, 1, 0]  # node 1 is its own left child
    trees["right"][0][:] = [2, 2, 0]
    assert not _node_by_node_accepts(trees)
    assert not _trees_valid(trees, 1, 1)


def test_a_valid_tree_passes_both():
    assert _node_by_node_accepts(STUMP) and _trees_valid(STUMP, 1, 1)
