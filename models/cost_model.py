"""The learned cost model: a scikit-learn regressor of log seconds from `models.features` rows.

By default gradient-boosted trees learn the residual ``log(measured / prior)`` relative to each
problem's mean over its kernels (only the order within a problem decides), and a small ensemble on
the problem's features (`PROBLEM_COLUMNS`) learns that per-problem offset; both are summed into one
`SummedTrees` that `models.forest` exports. Held-out comparison: bench/model_quality_compare.py.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_array, check_X_y
from threadpoolctl import threadpool_limits

from attn_dispatch.models.features import FEATURE_NAMES, PRIOR_COLUMN, PROBLEM_COLUMNS

try:  # scikit-learn >= 1.6 validates n_features_in_ and its message for us
    from sklearn.utils.validation import validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    validate_data = None

# Boosting a few thousand rows is fastest on one thread: oversubscribed OpenMP threads made a fit
# up to 40x slower (docs/RESULTS.md#where-the-priors-constants-come-from).
FIT_THREADS = 1
NOT_FITTED_MESSAGE = (
    "This CostModel is not fitted yet: run `attn-dispatch calibrate` on this card (or call "
    "fit(feature_matrix(...), log_seconds)) before predicting"
)


NORMALIZATIONS = ("none", "problem_mean")
# The problem-offset ensemble sees one row per problem (a hundred or so): few, small trees.
OFFSET_PARAMS = {"max_iter": 100, "learning_rate": 0.1, "max_leaf_nodes": 7, "min_samples_leaf": 3}


def problem_groups(X: np.ndarray, columns: tuple[int, ...] = PROBLEM_COLUMNS) -> np.ndarray:
    """``int64 [n]``: rows with equal problem columns (one problem, several kernels) share an id."""
    _, inverse = np.unique(np.ascontiguousarray(X[:, list(columns)]), axis=0, return_inverse=True)
    return np.asarray(inverse, dtype=np.int64).ravel()


def group_means(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``[n]``: the mean of `values` over each row's group."""
    sums = np.bincount(groups, weights=values)
    return (sums / np.bincount(groups))[groups]


class SummedTrees:
    """Two fitted `HistGradientBoostingRegressor` summed: the kernel-relative trees and the
    problem-offset trees (fitted on rows whose kernel columns were zeroed, so none of its trees
    splits on them). Exposes what `models.forest.export_forest` reads from one regressor: the
    trees (``_predictors``) and the constant (``_baseline_prediction``)."""

    def __init__(self, relative: HistGradientBoostingRegressor, offset: HistGradientBoostingRegressor) -> None:
        self.relative, self.offset = relative, offset

    @property
    def _predictors(self) -> list:
        return [*self.relative._predictors, *self.offset._predictors]

    @property
    def _baseline_prediction(self) -> np.ndarray:
        return np.ravel(self.relative._baseline_prediction) + np.ravel(self.offset._baseline_prediction)

    @property
    def n_iter_(self) -> int:
        return self.relative.n_iter_

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.relative.predict(X) + self.offset.predict(X)


class CostModel(RegressorMixin, BaseEstimator):
    """Predicts natural-log seconds of a (problem, kernel) pair from its feature row.

    `residual`: learn ``log seconds - X[:, prior_column]`` and add it back. `normalize`:
    "problem_mean" (module docstring; applied when ``X`` has `FEATURE_NAMES` columns and a problem
    has two rows) or "none". The boosting parameters go to `HistGradientBoostingRegressor`
    (defaults for a few hundred to a few thousand points; deterministic, no early stopping).
    Fitted: `estimator_` (one regressor, or a `SummedTrees`), `n_features_in_`, `n_iter_`,
    `feature_names_` (None unless ``X`` had `FEATURE_NAMES` columns).
    """

    def __init__(
        self,
        *,
        residual: bool = True,
        prior_column: int = PRIOR_COLUMN,
        max_iter: int = 300,
        learning_rate: float = 0.1,
        max_leaf_nodes: int = 15,
        min_samples_leaf: int = 4,
        l2_regularization: float = 1e-3,
        normalize: str = "problem_mean",
        random_state: int = 0,
    ) -> None:
        self.residual = residual
        self.prior_column = prior_column
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.l2_regularization = l2_regularization
        self.normalize = normalize
        self.random_state = random_state

    def _baseline(self, X: np.ndarray) -> np.ndarray:
        if not self.residual:
            return np.zeros(X.shape[0])
        if not 0 <= self.prior_column < X.shape[1]:
            raise ValueError(
                f"prior_column={self.prior_column} is outside X's {X.shape[1]} columns; pass "
                "residual=False, or X built by models.features.feature_matrix"
            )
        return X[:, self.prior_column]

    def fit(self, X, y, sample_weight=None) -> CostModel:
        """Fit on feature rows ``X [n, d]`` and natural-log seconds ``y [n]``."""
        if validate_data is not None:
            X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True)
        else:
            X, y = check_X_y(X, y, dtype=np.float64, y_numeric=True)
            self.n_features_in_ = X.shape[1]
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {self.normalize!r}")
        self.feature_names_ = FEATURE_NAMES if X.shape[1] == len(FEATURE_NAMES) else None
        residual = y - self._baseline(X)
        relative = self._regressor(
            max_iter=self.max_iter, learning_rate=self.learning_rate, max_leaf_nodes=self.max_leaf_nodes,
            min_samples_leaf=self.min_samples_leaf,
        )
        groups = problem_groups(X) if self.normalize == "problem_mean" and self.feature_names_ else None
        with threadpool_limits(limits=FIT_THREADS):
            if groups is None or np.bincount(groups).max() < 2:
                self.estimator_ = relative.fit(X, residual, sample_weight=sample_weight)
            else:
                offsets = group_means(residual, groups)
                relative.fit(X, residual - offsets, sample_weight=sample_weight)
                first = np.unique(groups, return_index=True)[1]  # one row per problem
                problem_rows = np.zeros((len(first), X.shape[1]))
                problem_rows[:, list(PROBLEM_COLUMNS)] = X[np.ix_(first, PROBLEM_COLUMNS)]
                offset = self._regressor(**OFFSET_PARAMS).fit(problem_rows, offsets[first])
                self.estimator_ = SummedTrees(relative, offset)
        self.n_iter_ = self.estimator_.n_iter_
        return self

    def _regressor(self, **params) -> HistGradientBoostingRegressor:
        return HistGradientBoostingRegressor(
            **params, l2_regularization=self.l2_regularization, early_stopping=False, random_state=self.random_state,
        )

    def predict(self, X) -> np.ndarray:
        """Natural-log seconds ``[n]``."""
        if not hasattr(self, "estimator_"):
            raise NotFittedError(NOT_FITTED_MESSAGE)
        if validate_data is not None:
            X = validate_data(self, X, dtype=np.float64, reset=False)
        else:
            X = check_array(X, dtype=np.float64)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features but this CostModel was fitted with {self.n_features_in_}; "
                "build X with the same models.features version, or re-run `attn-dispatch calibrate`"
            )
        with threadpool_limits(limits=FIT_THREADS):
            return self.estimator_.predict(X) + self._baseline(X)

    def predict_seconds(self, X) -> np.ndarray:
        """Predicted seconds ``[n]`` (``exp`` of `predict`)."""
        return np.exp(self.predict(X))

    def describe(self) -> str:
        target = "log(measured / prior)" if self.residual else "log seconds"
        if self.normalize == "problem_mean":
            target += " relative to its problem's mean, plus a problem-offset model"
        return (
            f"HistGradientBoostingRegressor on {target} (max_iter={self.max_iter}, "
            f"learning_rate={self.learning_rate}, max_leaf_nodes={self.max_leaf_nodes}, "
            f"min_samples_leaf={self.min_samples_leaf})"
        )
