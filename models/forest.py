"""A fitted cost model carried inside a table as plain arrays: JSON-safe, never a pickle.

`Forest` holds a boosted-tree ensemble (`HistGradientBoostingRegressor`'s trees) as padded
arrays and evaluates it with numpy, all trees at once. `EmbeddedModel` adds what turns its
output into seconds: the card spec its features were computed with, whether it predicts the
residual over the prior, and a time scale (a family stand-in or a merge).

A model stores the names of the features it was fitted on. A later attn-dispatch that computes
every one of them (under the same names: a feature whose definition changes gets a new name, as
the prior's version does) evaluates it on those columns, in the model's order, whatever columns
were added since; and it prices only kernels of the families it was fitted with (its
``family=...`` features): a family registered after the fit is the prior's to price
(`models.table.ThresholdTable.model_seconds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import working_family
from attn_dispatch.models.cards import CardSpec
from attn_dispatch.models.features import FAMILY_FEATURE_PREFIX, FEATURE_NAMES, feature_matrix
from attn_dispatch.models.ranking import kernel_named

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
        """Sum of the trees' leaves plus the baseline: ``X [n, d]`` -> ``[n]``.

        All rows and trees advance one level per step (flat gathers), until every path is at a leaf.
        """
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
    """The trees of a fitted `CostModel` as JSON-ready per-tree node lists, and the baseline.

    Reads scikit-learn's fitted trees (``_predictors``, ``_baseline_prediction``): private
    attributes, so `embed` checks the export against the estimator before a table uses it.
    """
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
    """A cost model inside a table (see module docstring).

    Attributes
    ----------
    forest: the trees; spec: the card spec its features use; residual / prior_column: as in
    `CostModel`; feature_names: the features it was fitted on; scale: multiplies its seconds.
    arrays: the per-tree node lists (what the JSON holds).
    """

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
