"""Losses of SPEC.md, summed over samples, each with its Fenchel dual.

A loss object knows, for predictions ``Yhat`` of shape ``(N, c)`` and encoded targets
``T`` of shape ``(N, c)`` (see :meth:`Loss.encode`):

* ``value(Yhat, T)``: ``sum_i L(yhat_i, y_i)``;
* ``dual_variable(Yhat, T)``: ``V = -grad L(Yhat)``, the dual point at ``Yhat``;
* ``dual_objective(V, T)``: ``sum_i -L*(-V_i)``, valid for ``V`` in the dual domain;
* ``project_dual_domain(V, T)``: the Euclidean projection of ``V`` onto that domain;
* ``strong_concavity``: modulus of strong concavity of ``dual_objective`` (gap-safe rules);
* CVXPY forms of the primal loss and of the dual objective.

Encoded targets: squared loss, the targets themselves (``(N, c)``); logistic loss, the
labels in {-1, +1} as ``(N, 1)``; cross-entropy, the one-hot matrix ``(N, c)``.
"""
import cvxpy as cp
import numpy as np
from scipy.special import entr, expit, logsumexp, softmax

from .errors import invalid


def project_rows_to_simplex(P):
    """Euclidean projection of every row of ``P`` (shape ``(N, c)``) onto the unit simplex."""
    P = np.asarray(P, dtype=float)
    c = P.shape[1]
    S = -np.sort(-P, axis=1)
    cumulative = np.cumsum(S, axis=1) - 1.0
    ks = np.arange(1, c + 1)
    rho = np.count_nonzero(S - cumulative / ks > 0, axis=1)
    theta = cumulative[np.arange(P.shape[0]), rho - 1] / rho
    return np.maximum(P - theta[:, None], 0.0)


class Loss:
    """Base class: see the module docstring for the contract."""

    name = ""
    strong_concavity = 1.0

    def encode(self, y, n_classes=None):
        """Validate raw targets ``y`` and return the encoded targets ``T`` of shape (N, c)."""
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}()"


class SquaredLoss(Loss):
    """``L(yhat, y) = 1/2 ||yhat - y||^2``; dual term ``<V, y> - 1/2 ||V||^2`` on all of R^c."""

    name = "squared"
    strong_concavity = 1.0

    def encode(self, y, n_classes=None):
        y = np.asarray(y, dtype=float)
        if y.ndim == 1:
            return y[:, None]
        if y.ndim == 2:
            return y
        if y.ndim == 3:  # sequence targets (N, n, c) -> (N, n*c), output (t, l) row-major
            return y.reshape(y.shape[0], -1)
        raise invalid("y", "shape (N,), (N, c) or (N, n, c) for the squared loss",
                      f"shape {y.shape}")

    def value(self, Yhat, T):
        return 0.5 * float(np.sum((Yhat - T) ** 2))

    def dual_variable(self, Yhat, T):
        return T - Yhat

    def dual_objective(self, V, T):
        return float(np.sum(V * T) - 0.5 * np.sum(V * V))

    def project_dual_domain(self, V, T):
        return np.asarray(V, dtype=float)

    def cvxpy_value(self, Yhat, T):
        return 0.5 * cp.sum_squares(Yhat - T)

    def cvxpy_dual(self, V, T):
        return cp.sum(cp.multiply(V, T)) - 0.5 * cp.sum_squares(V), []


class LogisticLoss(Loss):
    """``L(yhat, y) = log(1 + exp(-y yhat))``, y in {-1, +1}; dual term ``H(y V)``, ``y V in [0, 1]``."""

    name = "logistic"
    strong_concavity = 4.0  # H''(a) = -1/(a(1-a)) <= -4

    def encode(self, y, n_classes=None):
        y = np.asarray(y)
        if y.ndim != 1:
            raise invalid("y", "shape (N,) with labels in {-1, +1} for the logistic loss",
                          f"shape {y.shape}")
        if not np.all(np.isin(y, (-1, 1))):
            bad = np.unique(y[~np.isin(y, (-1, 1))])[:5]
            raise invalid("y", "labels in {-1, +1} for the logistic loss",
                          f"values {bad.tolist()}", "map labels 0/1 to -1/+1")
        return y.astype(float)[:, None]

    def value(self, Yhat, T):
        return float(np.sum(np.logaddexp(0.0, -T * Yhat)))

    def dual_variable(self, Yhat, T):
        return T * expit(-T * Yhat)

    def dual_objective(self, V, T):
        a = T * V
        return float(np.sum(entr(a) + entr(1.0 - a)))

    def project_dual_domain(self, V, T):
        return T * np.clip(T * V, 0.0, 1.0)

    def cvxpy_value(self, Yhat, T):
        return cp.sum(cp.logistic(-cp.multiply(T, Yhat)))

    def cvxpy_dual(self, V, T):
        a = cp.multiply(T, V)
        return cp.sum(cp.entr(a) + cp.entr(1 - a)), []


class CrossEntropyLoss(Loss):
    """``L(yhat, y) = logsumexp(yhat) - yhat_y``; dual term ``entropy(e_y - V)``, ``e_y - V`` in the simplex."""

    name = "cross_entropy"
    strong_concavity = 1.0  # Hessian of the entropy is -diag(1/p) <= -I on the simplex

    def encode(self, y, n_classes=None):
        y = np.asarray(y)
        if y.ndim != 1:
            raise invalid("y", "shape (N,) of integer class labels for the cross-entropy loss",
                          f"shape {y.shape}")
        if y.dtype.kind == "f":
            if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
                raise invalid("y", "integer class labels in [0, c) for the cross-entropy loss",
                              "non-integer values")
        elif y.dtype.kind not in "iu":
            raise invalid("y", "integer class labels for the cross-entropy loss", f"dtype {y.dtype}")
        y = y.astype(np.int64)
        c = int(y.max()) + 1 if n_classes is None else int(n_classes)
        if y.min() < 0 or y.max() >= c:
            raise invalid("y", f"class labels in [0, {c})",
                          f"labels from {y.min()} to {y.max()}", "number classes 0..c-1")
        if c < 2:
            raise invalid("y", "at least 2 classes for the cross-entropy loss", f"{c} class",
                          "pass n_classes or use the logistic/squared loss")
        return np.eye(c)[y]

    def value(self, Yhat, T):
        return float(np.sum(logsumexp(Yhat, axis=1)) - np.sum(T * Yhat))

    def dual_variable(self, Yhat, T):
        return T - softmax(Yhat, axis=1)

    def dual_objective(self, V, T):
        return float(np.sum(entr(T - V)))

    def project_dual_domain(self, V, T):
        return T - project_rows_to_simplex(T - V)

    def cvxpy_value(self, Yhat, T):
        return cp.sum(cp.log_sum_exp(Yhat, axis=1)) - cp.sum(cp.multiply(T, Yhat))

    def cvxpy_dual(self, V, T):
        return cp.sum(cp.entr(T - V)), [cp.sum(V, axis=1) == 0]


LOSSES = {cls.name: cls for cls in (SquaredLoss, LogisticLoss, CrossEntropyLoss)}


def get_loss(loss):
    """Return a :class:`Loss` from a name (``"squared"``, ``"logistic"``, ``"cross_entropy"``) or an instance."""
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str) and loss.replace("-", "_") in LOSSES:
        return LOSSES[loss.replace("-", "_")]()
    raise invalid("loss", f"one of {sorted(LOSSES)}", repr(loss))
