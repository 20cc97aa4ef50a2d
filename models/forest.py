"""A fitted cost model carried inside a table as plain arrays: JSON-safe, never a pickle.

`Forest`: boosted trees as padded arrays, evaluated with numpy all at once. `EmbeddedModel` adds
the card spec of its features, residual-or-not and a time scale. A model reads its features by
name and prices only the families it was fitted with (`ThresholdTable.model_seconds`).
`parse_models` validates a table's ``models`` section; `LazyModels` defers that to first use.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import working_family
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
from attn_dispatch.models.features import FAMILY_FEATURE_PREFIX, FEATURE_NAMES, feature_matrix
from attn_dispatch.models.gc_pause import cyclic_collection_paused
from attn_dispatch.models.identity import CardSpec
from attn_dispatch.models.priors import kernel_named

if TYPE_CHECKING:  # scikit-learn is imported by whoever fits a model; evaluating a table needs numpy only
    from attn_dispatch.models.cost_model import CostModel

LEAF_DIGITS = 7  # leaf values are log-time increments: 7 significant digits is far below noise
# Exported trees must reproduce the estimator's predictions to this (log seconds) on the rows
# they were checked against, else the table is built without them.
EXPORT_TOLERANCE = 1e-6


@dataclass(frozen=True, eq=False)
class Forest:
    """Trees as arrays ``[n_trees, max_nodes]``: node ``i`` of tree ``t`` sends a row to
    ``left[t, i]`` when ``x[feature[t, i]] <= threshold[t, i]`` (or when the value is NaN and
    ``missing_left[t, i]``), else to ``right[t, i]``; a leaf has ``left == 0`` and adds
    ``value[t, i]``. Children always follow their parent, so evaluation ends."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    missing_left: np.ndarray
    value: np.ndarray
    baseline: float
    depth: int

    def __repr__(self) -> str:
        return f"Forest({self.n_trees} trees, depth {self.depth})"

    @property
    def n_trees(self) -> int:
        return self.feature.shape[0]

    @cached_property
    def _flat(self) -> tuple[np.ndarray, ...]:
        """The node arrays flattened, so a node is one index ``tree * width + node``."""
        return tuple(a.ravel() for a in (self.feature, self.threshold, self.left, self.right, self.missing_left, self.value))

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Sum of the trees' leaves plus the baseline, ``X [n, d]`` -> ``[n]``: every row and tree
        advances one level per step (flat gathers)."""
        X = np.asarray(X, dtype=np.float64)
        feature, threshold, left, right, missing_left, value = self._flat
        n, (trees, width) = X.shape[0], self.feature.shape
        tree_base = (np.arange(trees, dtype=np.int64) * width)[None, :]  # [1, T]
        node = np.repeat(tree_base, n, axis=0)  # [n, T] flat node index (each tree's root)
        row_base = (np.arange(n, dtype=np.int64) * X.shape[1])[:, None]
        flat_x = X.ravel()
        for _ in range(self.depth):
            child_left = left[node]
            inner = child_left != 0
            if not inner.any():
                break
            x = flat_x[row_base + feature[node]]
            go_left = np.where(np.isnan(x), missing_left[node], x <= threshold[node])
            node = np.where(inner, np.where(go_left, child_left, right[node]) + tree_base, node)
        return value[node].sum(axis=1) + self.baseline


def _depth(left: np.ndarray, right: np.ndarray) -> int:
    """Levels of the deepest tree (children follow their parent: one pass over node indices)."""
    depth = np.zeros(left.shape, dtype=np.int64)
    for i in range(left.shape[1]):
        trees = np.flatnonzero(left[:, i])
        depth[trees, left[trees, i]] = depth[trees, right[trees, i]] = depth[trees, i] + 1
    return int(depth.max()) + 1


def forest_from_arrays(arrays: dict[str, Sequence[Sequence[float]]], baseline: float) -> Forest:
    """Pad per-tree node lists into a `Forest` (the caller has validated them)."""
    sizes = np.array([len(tree) for tree in arrays["feature"]], dtype=np.int64)
    tree = np.repeat(np.arange(len(sizes)), sizes)
    node = np.arange(len(tree)) - np.repeat(np.cumsum(sizes) - sizes, sizes)

    def pad(name: str, dtype) -> np.ndarray:
        out = np.zeros((len(sizes), int(sizes.max())), dtype=dtype)
        out[tree, node] = np.fromiter(chain.from_iterable(arrays[name]), dtype=dtype, count=len(tree))
        return out

    left, right = pad("left", np.int64), pad("right", np.int64)
    return Forest(
        feature=pad("feature", np.int64), threshold=pad("threshold", np.float64), left=left, right=right,
        missing_left=pad("missing_left", bool), value=pad("value", np.float64), baseline=float(baseline),
        depth=_depth(left, right),
    )


def export_forest(model: CostModel) -> tuple[dict[str, list[list]], float]:
    """The trees of a fitted `CostModel` as JSON-ready node lists, and the baseline. Reads
    scikit-learn's private ``_predictors``: `embed` checks the export against the estimator."""
    estimator = model.estimator_
    arrays: dict[str, list[list]] = {k: [] for k in ("feature", "threshold", "left", "right", "missing_left", "value")}
    for (predictor,) in estimator._predictors:
        nodes = predictor.nodes
        if np.any(nodes["is_categorical"]):
            raise ValueError("categorical splits cannot be exported; the cost model uses numeric features only")
        leaf = nodes["is_leaf"].astype(bool)
        arrays["feature"].append([0 if lf else int(f) for f, lf in zip(nodes["feature_idx"], leaf, strict=True)])
        arrays["threshold"].append([0.0 if lf else float(x) for x, lf in zip(nodes["num_threshold"], leaf, strict=True)])
        arrays["left"].append([0 if lf else int(c) for c, lf in zip(nodes["left"], leaf, strict=True)])
        arrays["right"].append([0 if lf else int(c) for c, lf in zip(nodes["right"], leaf, strict=True)])
        arrays["missing_left"].append([bool(m) and not lf for m, lf in zip(nodes["missing_go_to_left"], leaf, strict=True)])
        arrays["value"].append([float(f"{v:.{LEAF_DIGITS}g}") if lf else 0.0 for v, lf in zip(nodes["value"], leaf, strict=True)])
    return arrays, float(np.ravel(estimator._baseline_prediction)[0])


_COMPUTED = frozenset(FEATURE_NAMES)
_COLUMN = {name: index for index, name in enumerate(FEATURE_NAMES)}


@dataclass(frozen=True, eq=False)
class EmbeddedModel:
    """A cost model inside a table (module docstring): `residual` / `prior_column` as in
    `CostModel`; `scale` multiplies its seconds; `arrays` are the JSON's node lists."""

    forest: Forest
    spec: CardSpec
    residual: bool
    prior_column: int
    feature_names: tuple[str, ...]
    arrays: dict
    scale: float = 1.0

    def __repr__(self) -> str:
        return (f"EmbeddedModel({self.forest.n_trees} trees, spec={self.spec.name!r}, "
                f"residual={self.residual}, scale={self.scale:.4g})")

    @property
    def compatible(self) -> bool:
        """True when this attn-dispatch computes every feature the model was fitted on (names in
        `FEATURE_NAMES`; columns added since are not read)."""
        return set(self.feature_names) <= _COMPUTED

    @cached_property
    def columns(self) -> np.ndarray:
        """``int64 [len(feature_names)]``: the `FEATURE_NAMES` column of each of the model's
        features, in the model's order (ValueError when not `compatible`)."""
        if not self.compatible:
            missing = sorted(set(self.feature_names) - _COMPUTED)
            raise ValueError(f"this embedded cost model reads features this attn-dispatch does not compute "
                             f"({', '.join(missing[:3])}); refit it with `attn-dispatch check --fix` or recalibrate")
        return np.array([_COLUMN[name] for name in self.feature_names], dtype=np.int64)

    @cached_property
    def families(self) -> frozenset[str] | None:
        """The kernel families the model was fitted with (its ``family=...`` features); None when
        its features name no family (a model of hand-made columns prices every kernel)."""
        named = {name.removeprefix(FAMILY_FEATURE_PREFIX) for name in self.feature_names
                 if name.startswith(FAMILY_FEATURE_PREFIX)}
        return frozenset(named) if named else None

    def knows(self, kernel_name: str) -> bool:
        """Whether the model was fitted with the family of the kernel doing the work (a
        conversion's inner kernel's): only then does it price the kernel. ValueError for a name
        that is not ours."""
        return self.families is None or working_family(kernel_named(kernel_name)) in self.families

    def predict_seconds(self, problems: Sequence[Problem], kernel_names: Sequence[str]) -> np.ndarray:
        return self.seconds_from_features(feature_matrix(problems, kernel_names, self.spec))

    def seconds_from_features(self, X: np.ndarray) -> np.ndarray:
        """Seconds for feature rows ``[n, len(FEATURE_NAMES)]`` built with this model's `spec`
        (`feature_matrix`); the model reads its own columns (`columns`)."""
        own = np.asarray(X, dtype=np.float64)[:, self.columns]
        log_seconds = self.forest.predict(own) + (own[:, self.prior_column] if self.residual else 0.0)
        return np.exp(log_seconds) * self.scale

    def scaled(self, factor: float) -> EmbeddedModel:
        return replace(self, scale=self.scale * factor)


def embed(model: CostModel, spec: CardSpec, X_check: np.ndarray) -> EmbeddedModel | None:
    """Export a fitted model; None when the export does not reproduce it on `X_check`."""
    try:
        arrays, baseline = export_forest(model)
    except (AttributeError, KeyError, ValueError, TypeError):
        return None
    forest = forest_from_arrays(arrays, baseline)
    embedded = EmbeddedModel(forest, spec, bool(model.residual), int(model.prior_column), FEATURE_NAMES, arrays)
    reference = model.estimator_.predict(X_check)
    if not np.allclose(forest.predict(X_check), reference, rtol=0.0, atol=EXPORT_TOLERANCE):
        return None
    return embedded


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
    """Every check of `_tree` (and `_leaf`) on all trees at once, in numpy: True only when all hold.
    False (also for some forms `_tree` accepts, e.g. a leaf's feature written 0.0) leaves the
    verdict to `_tree`, which raises on the first fault."""
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


