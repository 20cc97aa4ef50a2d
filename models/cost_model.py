"""The learned cost model: a scikit-learn regressor of log seconds from `models.features` rows.

By default it learns the residual ``log(measured / prior)`` with gradient-boosted trees and adds
the analytic prior back: the prior carries how time scales with size (so predictions extrapolate
past the sweep), the trees learn what the prior gets wrong on this card (caches, launch costs,
backend quirks). ``residual=False`` learns log seconds directly (compared in
tests/models/test_quality.py).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_array, check_X_y

try:  # scikit-learn >= 1.6 validates n_features_in_ and its message for us
    from sklearn.utils.validation import validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    validate_data = None
from threadpoolctl import threadpool_limits

from models.features import FEATURE_NAMES, PRIOR_COLUMN

# Boosting a few thousand rows is fastest on one thread: OpenMP threads oversubscribed by other
# work (pytest -n 2 on a 2-core CI machine, a calibration worker) made one fit 40x slower here.
FIT_THREADS = 1
NOT_FITTED_MESSAGE = (
    "This CostModel is not fitted yet: run `attn-dispatch calibrate` on this card (or call "
    "fit(feature_matrix(...), log_seconds)) before predicting"
)


class CostModel(RegressorMixin, BaseEstimator):
    """Predicts natural-log seconds of a (problem, kernel) pair from its feature row.

    Parameters
    ----------
    residual: learn ``log seconds - X[:, prior_column]`` (the log analytic prior) and add it back.
    prior_column: column of ``X`` holding the log prior (`models.features.PRIOR_COLUMN`).
    max_iter, learning_rate, max_leaf_nodes, min_samples_leaf, l2_regularization: passed to
        `HistGradientBoostingRegressor`. Defaults chosen for a few hundred to a few thousand
        points (small leaves, many shallow trees, slow learning rate; see test_quality.py).
    random_state: seed of the boosting (no early stopping is used, so it is deterministic).

    Attributes
    ----------
    estimator_: the fitted `HistGradientBoostingRegressor`.
    n_features_in_: number of feature columns seen in `fit`.
    n_iter_: boosting iterations run.
    feature_names_: `models.features.FEATURE_NAMES` when ``X`` had that many columns, else None.
    """

    def __init__(
        self,
        *,
        residual: bool = True,
        prior_column: int = PRIOR_COLUMN,
        max_iter: int = 300,
        learning_rate: float = 0.05,
        max_leaf_nodes: int = 15,
        min_samples_leaf: int = 4,
        l2_regularization: float = 1e-3,
        random_state: int = 0,
    ) -> None:
        self.residual = residual
        self.prior_column = prior_column
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.l2_regularization = l2_regularization
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
        self.feature_names_ = FEATURE_NAMES if X.shape[1] == len(FEATURE_NAMES) else None
        self.estimator_ = HistGradientBoostingRegressor(
            max_iter=self.max_iter, learning_rate=self.learning_rate, max_leaf_nodes=self.max_leaf_nodes,
            min_samples_leaf=self.min_samples_leaf, l2_regularization=self.l2_regularization,
            early_stopping=False, random_state=self.random_state,
        )
        with threadpool_limits(limits=FIT_THREADS):
            self.estimator_.fit(X, y - self._baseline(X), sample_weight=sample_weight)
        self.n_iter_ = self.estimator_.n_iter_
        return self

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
        return (
            f"HistGradientBoostingRegressor on {target} (max_iter={self.max_iter}, "
            f"learning_rate={self.learning_rate}, max_leaf_nodes={self.max_leaf_nodes}, "
            f"min_samples_leaf={self.min_samples_leaf})"
        )
