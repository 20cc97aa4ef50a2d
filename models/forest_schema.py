"""The ``models`` section of a threshold table: embedded cost models as JSON node lists, checked
so that evaluation is bounded (children follow parents, features and thresholds in range)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np

from attn_dispatch.models._json_checks import (
    TableWarning,
    _bool,
    _fail,
    _int,
    _list,
    _num,
    _obj,
    _spec,
    _spec_dict,
    _str,
    parse_json_at,
)
from attn_dispatch.models.forest import EmbeddedModel, forest_from_arrays
from attn_dispatch.models.gc_pause import cyclic_collection_paused

MAX_MODELS = 16  # cards pooled in one merged table
MAX_TREES = 2000
MAX_NODES = 4095  # per tree (max_leaf_nodes 2048)
MAX_FEATURES = 1024
MAX_LEAF = 100.0  # a leaf's log-time increment: e^100 is beyond any real correction
MAX_THRESHOLD = 1e300
"""A split threshold's bound (finite and far past any feature value; keeps evaluation in float64)."""
ARRAYS = ("feature", "threshold", "left", "right", "missing_left", "value")


def _tree(data: dict, t: int, path: str, n_features: int) -> None:
    sizes = {len(_list(data[name][t], f"{path}.{name}[{t}]", MAX_NODES, min_length=1)) for name in ARRAYS}
    if len(sizes) != 1:
        raise _fail(f"{path}[{t}]", "node arrays of one tree must have equal lengths")
    n = sizes.pop()
    for i in range(n):
        left, right = data["left"][t][i], data["right"][t][i]
        where = f"{path}.tree {t} node {i}"
        _int(left, f"{where} left", 0, n - 1)
        _int(right, f"{where} right", 0, n - 1)
        _num(data["value"][t][i], f"{where} value", -MAX_LEAF, MAX_LEAF)
        if left == 0:
            if right != 0:
                raise _fail(where, "a leaf (left 0) must have right 0")
            _leaf(data, t, i, where)
            continue
        if not (i < left < n and i < right < n):
            raise _fail(where, "children must come after their parent (a tree, not a cycle)")
        _int(data["feature"][t][i], f"{where} feature", 0, n_features - 1)
        _num(data["threshold"][t][i], f"{where} threshold", -MAX_THRESHOLD, MAX_THRESHOLD)
        _bool(data["missing_left"][t][i], f"{where} missing_left")


def _trees_valid(data: dict, count: int, n_features: int) -> bool:
    """Every check of `_tree` (and `_leaf`) on all trees at once, in numpy: True only when all hold
    (False also for some forms `_tree` accepts, e.g. a leaf's feature written 0.0: it decides then).
    Checking hundreds of trees node by node would weigh on a first call's table load; False sends the table to `_tree`, which raises on the first fault."""
    sizes = []
    for t in range(count):
        lengths = {len(tree) if isinstance(tree := data[name][t], list) else -1 for name in ARRAYS}
        if len(lengths) != 1 or not 1 <= (n := lengths.pop()) <= MAX_NODES:
            return False
        sizes.append(n)
    columns = {name: list(chain.from_iterable(data[name])) for name in ARRAYS}
    kinds = {name: set(map(type, column)) for name, column in columns.items()}
    if not (kinds["left"] == kinds["right"] == kinds["feature"] == {int} and kinds["missing_left"] == {bool}
            and kinds["value"] <= {int, float} and kinds["threshold"] <= {int, float}):
        return False
    n = np.repeat(np.asarray(sizes), sizes)  # each node's tree size
    node = np.arange(len(n)) - np.repeat(np.cumsum(sizes) - np.asarray(sizes), sizes)  # index within its tree
    try:
        left, right, feature = (np.asarray(columns[name], dtype=np.int64) for name in ("left", "right", "feature"))
        threshold, value = (np.asarray(columns[name], dtype=np.float64) for name in ("threshold", "value"))
    except (OverflowError, ValueError):  # an integer past 64 bits
        return False
    missing_left = np.asarray(columns["missing_left"], dtype=bool)
    leaf = left == 0
    with np.errstate(invalid="ignore"):
        ok = (np.isfinite(value) & (np.abs(value) <= MAX_LEAF) & (right >= 0) & (right <= n - 1)
              & (left >= 0) & (left <= n - 1))
        ok &= np.where(leaf, (right == 0) & (feature == 0) & (threshold == 0) & ~missing_left,
                       (node < left) & (node < right) & (feature >= 0) & (feature <= n_features - 1)
                       & (np.abs(threshold) < MAX_THRESHOLD))  # strict: an integer just past the bound
        # rounds to it in float64, which `_tree` (exact comparison) rejects; the bound itself goes there too
    return bool(ok.all())


def _leaf(data: dict, t: int, i: int, where: str) -> None:
    """A leaf holds exactly what `export_forest` writes: feature 0, threshold 0, missing_left false."""
    for name, expected in (("feature", 0), ("threshold", 0), ("missing_left", False)):
        value = data[name][t][i]
        same_kind = isinstance(value, bool) if name == "missing_left" else (
            isinstance(value, (int, float)) and not isinstance(value, bool))
        if not same_kind or value != expected:
            raise _fail(f"{where} {name}", f"a leaf must have {name} {str(expected).lower()}, got {value!r:.60}")


def parse_model(value: object, path: str) -> EmbeddedModel:
    data = _obj(value, path, ("spec", "scale", "residual", "prior_column", "feature_names", "baseline", "trees"))
    names = tuple(_str(v, f"{path}.feature_names[{i}]")
                  for i, v in enumerate(_list(data["feature_names"], f"{path}.feature_names", MAX_FEATURES, min_length=1)))
    trees = _obj(data["trees"], f"{path}.trees", ARRAYS)
    count = len(_list(trees["feature"], f"{path}.trees.feature", MAX_TREES, min_length=1))
    for name in ARRAYS:
        if len(_list(trees[name], f"{path}.trees.{name}", MAX_TREES)) != count:
            raise _fail(f"{path}.trees.{name}", f"must hold {count} trees like trees.feature")
    if not _trees_valid(trees, count, len(names)):  # the node-by-node check names the first fault
        for t in range(count):
            _tree(trees, t, f"{path}.trees", len(names))
    baseline = _num(data["baseline"], f"{path}.baseline", -MAX_LEAF, MAX_LEAF)
    return EmbeddedModel(
        forest=forest_from_arrays(trees, baseline), spec=_spec(data["spec"], f"{path}.spec"),
        residual=_bool(data["residual"], f"{path}.residual"),
        prior_column=_int(data["prior_column"], f"{path}.prior_column", 0, len(names) - 1),
        feature_names=names, arrays=trees, scale=_num(data["scale"], f"{path}.scale", 1e-6, 1e6),
    )


def parse_models(value: object) -> tuple[EmbeddedModel, ...]:
    return tuple(parse_model(v, f"models[{i}]") for i, v in enumerate(_list(value, "models", MAX_MODELS)))


class LazyModels(Sequence):
    """A table's ``models`` kept as JSON text (one model a line) until first used, then validated
    together (`parse_models`). A section that fails is dropped with a `TableWarning` naming the
    table and the field: the table then has no model (the prior ranks), never an exception."""

    def __init__(self, lines: list[str], *, source: str,
                 then: Callable[[EmbeddedModel], EmbeddedModel] = lambda model: model) -> None:
        self._lines, self._source, self._then = lines, source, then
        self._models: tuple[EmbeddedModel, ...] | None = None
        self._lock = threading.Lock()

    def mapped(self, function: Callable[[EmbeddedModel], EmbeddedModel]) -> Sequence[EmbeddedModel]:
        """These models passed through `function` (parsed on first use as well)."""
        if self._models is not None:
            return tuple(map(function, self._models))
        then = self._then
        return LazyModels(self._lines, source=self._source, then=lambda model: function(then(model)))

    def _parsed(self) -> tuple[EmbeddedModel, ...]:
        with self._lock:
            if self._models is None:
                try:
                    with cyclic_collection_paused():  # ~100k objects a model
                        values = [parse_json_at(line, f"models[{i}]") for i, line in enumerate(self._lines)]
                        self._models = tuple(map(self._then, parse_models(values)))
                except Exception as error:  # noqa: BLE001 - a malformed model must never fail an inference call
                    warnings.warn(f"table {self._source}: skipped its models: {error}", TableWarning, stacklevel=4)
                    self._models = ()
                self._lines = []
            return self._models

    def __getitem__(self, index):
        return self._parsed()[index]

    def __len__(self) -> int:
        return len(self._parsed())


def models_to_dict(models: tuple[EmbeddedModel, ...]) -> list[dict]:
    return [
        {
            "spec": _spec_dict(m.spec), "scale": m.scale, "residual": m.residual, "prior_column": m.prior_column,
            "feature_names": list(m.feature_names), "baseline": m.forest.baseline, "trees": m.arrays,
        }
        for m in models
    ]


__all__ = ["parse_models", "models_to_dict"]
