"""Losses of docs/conventions.md, summed over samples, each with its Fenchel dual: one object per loss.

A loss knows, for predictions ``Yhat`` of shape ``(N, c)`` and encoded targets ``T`` of
shape ``(N, c)`` (see :meth:`Loss.encode`):

* ``value(Yhat, T)``: ``sum_i L(yhat_i, y_i)``, accumulated in float64;
* ``dual_variable(Yhat, T)``: ``V = -grad L(Yhat)``, the dual point at ``Yhat``;
* ``dual_objective(V, T, scale=1)``: ``sum_i -L*(-s V_i)``, valid for ``s V`` in the dual domain;
* ``project_dual_domain(V, T)``: the Euclidean projection of ``V`` onto that domain;
* ``scaled_dual_bound(V, T)``: an upper bound on ``max_{0 < s <= 1} D(s V)`` for ``V`` in that domain
  (None where there is none), from ``dual_slope(V, T)``, the slope of ``s -> D(s V)`` at ``s = 1``:
  whether a candidate dual point could beat another before its scaling is known;
* ``accuracy(Yhat, T)``: fraction of correct labels (NaN for the squared loss);
* ``hessian(Yhat, T)``: ``W_i = grad^2 L(yhat_i)``, shape (N, c, c), and ``gradient_metric(Yhat, T, at)``:
  ``sum_i grad L_i^T W_i^+ grad L_i`` (float64), the gradient at ``Yhat`` and the Hessian at ``at``
  (default ``Yhat``): what a Newton model of the loss needs;
* capabilities: ``quadratic`` (L is quadratic in yhat), ``lipschitz`` (of grad L in yhat),
  ``strong_concavity`` (of the dual objective, for gap-safe rules);
* CVXPY forms of the primal loss and of the dual objective.

The numerical methods take numpy arrays or torch tensors (any device and dtype) and return
the same kind (:func:`cvxtransformer.core.arrays.numpy_face`): one implementation serves the
verifier and the torch backend.

Encoded targets: squared loss, the targets themselves (``(N, c)``); logistic loss, the
labels in {-1, +1} as ``(N, 1)``; cross-entropy, the one-hot matrix ``(N, c)``.

Example
-------
>>> import numpy as np
>>> loss = get_loss("logistic")
>>> T = loss.encode(np.array([1, -1]))
>>> round(loss.value(np.zeros((2, 1)), T), 6)   # 2 log 2
1.386294
"""
import functools
import math

import numpy as np
import torch

from .arrays import F64, numpy_face, to_numpy, to_tensor
from .contracts import LOSS_FACES, check_faces
from .errors import InvalidInputError, invalid
from .validation import check_allocation, check_int


ROWS = 2**16  # entries of a chunk of rows in the losses' sums and maps: their temporaries stay ~1 MB


def _step(A):
    return max(1, ROWS // max(1, A[:1].numel()))


def summed_by_rows(method):
    """A method ``(A, T, *args) -> sum over samples`` evaluated on chunks of rows and summed: its
    temporaries stay a chunk's size, whatever N (so that the iterate's per-sample state is the only
    memory that grows with N)."""
    @functools.wraps(method)
    def wrapper(self, A, T, *args, **kwargs):
        step = _step(A)
        if len(A) <= step:
            return method(self, A, T, *args, **kwargs)
        return sum(method(self, A[s:s + step], T[s:s + step], *args, **kwargs) for s in range(0, len(A), step))

    return wrapper


def mapped_by_rows(method):
    """A method ``(A, T) -> per-sample rows`` (same shape as A) filled chunk by chunk into one output:
    the output is the only allocation that grows with N."""
    @functools.wraps(method)
    def wrapper(self, A, T):
        step = _step(A)
        if len(A) <= step:
            return method(self, A, T)
        out = torch.empty_like(A)
        for s in range(0, len(A), step):
            out[s:s + step] = method(self, A[s:s + step], T[s:s + step])
        return out

    return wrapper


def _simplex(P):
    S, _ = torch.sort(P, dim=1, descending=True)
    cumulative = torch.cumsum(S, dim=1) - 1.0
    ks = torch.arange(1, P.shape[1] + 1, dtype=P.dtype, device=P.device)
    rho = torch.count_nonzero(S - cumulative / ks > 0, dim=1).clamp(min=1)
    theta = cumulative.gather(1, (rho - 1)[:, None]) / rho[:, None].to(P.dtype)
    return torch.clamp(P - theta, min=0.0)


def project_rows_to_simplex(P):
    """Euclidean projection of every row of ``P`` (shape ``(N, c)``, ndarray or tensor) onto the
    unit simplex (sort-based, exact)."""
    if P.shape[0] == 0:
        return P
    return _simplex(P) if isinstance(P, torch.Tensor) else to_numpy(_simplex(to_tensor(P)))


class Loss:
    """Base class: see the module docstring. A subclass sets ``name`` and defines the faces of
    :data:`~.contracts.LOSS_FACES`, ``encode(y, n_classes=None)`` (validate raw targets ``y``, return
    the encoded targets ``T`` of shape (N, c)) among them; :func:`register_loss` checks them."""

    name = None
    quadratic = False
    lipschitz = 1.0
    strong_concavity = 1.0

    def gradient(self, Yhat, T):
        """``grad L(Yhat)``, shape (N, c)."""
        return -self.dual_variable(Yhat, T)

    dual_slope = None  # (V, T) -> d/ds D(s V) at s = 1, where the loss offers it

    def scaled_dual_bound(self, V, T):
        """An upper bound on ``max_{0 < s <= 1} D(s V)`` for ``V`` in the dual domain, or None. ``s -> D(s V)``
        is concave: where its slope at ``s = 1`` is >= 0 it increases on [0, 1], and the bound is ``D(V)``."""
        if self.dual_slope is None:
            return None
        slope = float(self.dual_slope(V, T))
        return float(self.dual_objective(V, T)) if slope >= 0.0 else None

    def accuracy(self, Yhat, T):
        """Fraction of samples whose label is predicted (NaN: the loss has no labels)."""
        return math.nan

    def metrics(self, Yhat, T):
        """Mean loss per sample and accuracy of predictions ``Yhat`` (N, c)."""
        return self.value(Yhat, T) / Yhat.shape[0], self.accuracy(Yhat, T)

    def __repr__(self):
        return f"{type(self).__name__}()"

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


class SquaredLoss(Loss):
    """``L(yhat, y) = 1/2 ||yhat - y||^2``; dual term ``<V, y> - 1/2 ||V||^2`` on all of R^c."""

    name = "squared"
    quadratic = True
    lipschitz = 1.0
    strong_concavity = 1.0

    def encode(self, y, n_classes=None):
        y = np.asarray(y, dtype=float)
        if y.ndim == 1:
            return y[:, None]
        if y.ndim == 2:
            return y
        if y.ndim == 3:  # sequence targets (N, n, c) -> (N, n*c), output (t, l) row-major
            return y.reshape(y.shape[0], -1)
        raise invalid("y", "shape (N,), (N, c) or (N, n, c) for the squared loss", f"shape {y.shape}")

    @numpy_face
    @summed_by_rows
    def value(self, Yhat, T):
        r = Yhat - T
        return 0.5 * torch.sum(r * r, dtype=F64)

    @numpy_face
    def dual_variable(self, Yhat, T):
        return T - Yhat

    @numpy_face
    @summed_by_rows
    def dual_objective(self, V, T, scale=1.0):
        return scale * torch.sum(V * T, dtype=F64) - 0.5 * scale * scale * torch.sum(V * V, dtype=F64)

    @numpy_face
    def project_dual_domain(self, V, T):
        return V

    @numpy_face
    def scaled_dual_bound(self, V, T):
        """``max_{0 <= s <= 1} (s <V, T> - s^2/2 ||V||^2)``, exactly (no temporary of the size of V)."""
        a = torch.dot(V.reshape(-1), T.reshape(-1)).to(F64)
        b = torch.dot(V.reshape(-1), V.reshape(-1)).to(F64)
        s = torch.clamp(a / b, 0.0, 1.0) if b > 0 else torch.ones((), dtype=F64)
        return s * a - 0.5 * s * s * b

    @numpy_face
    def hessian(self, Yhat, T):
        eye = torch.eye(Yhat.shape[1], dtype=Yhat.dtype, device=Yhat.device)
        return eye.expand(Yhat.shape[0], -1, -1)

    @numpy_face
    def gradient_metric(self, Yhat, T, at=None):
        return 2.0 * self.value(Yhat, T)

    def cvxpy_value(self, Yhat, T):
        import cvxpy as cp

        return 0.5 * cp.sum_squares(Yhat - T)

    def cvxpy_dual(self, V, T):
        import cvxpy as cp

        return cp.sum(cp.multiply(V, T)) - 0.5 * cp.sum_squares(V), []


class LogisticLoss(Loss):
    """``L(yhat, y) = log(1 + exp(-y yhat))``, y in {-1, +1}; dual term ``H(y V)``, ``y V in [0, 1]``."""

    name = "logistic"
    lipschitz = 0.25
    strong_concavity = 4.0  # H''(a) = -1/(a(1-a)) <= -4

    def encode(self, y, n_classes=None):
        y = np.asarray(y)
        if y.ndim != 1:
            raise invalid("y", "shape (N,) with labels in {-1, +1} for the logistic loss", f"shape {y.shape}")
        if not np.all(np.isin(y, (-1, 1))):
            bad = np.unique(y[~np.isin(y, (-1, 1))])[:5]
            raise invalid("y", "labels in {-1, +1} for the logistic loss", f"values {bad.tolist()}",
                          "map labels 0/1 to -1/+1")
        return y.astype(float)[:, None]

    @numpy_face
    @summed_by_rows
    def value(self, Yhat, T):
        return torch.sum(torch.logaddexp(torch.zeros_like(Yhat), -T * Yhat), dtype=F64)  # exact at any margin

    @numpy_face
    @mapped_by_rows
    def dual_variable(self, Yhat, T):
        return T * torch.sigmoid(-T * Yhat)

    @numpy_face
    @summed_by_rows
    def dual_objective(self, V, T, scale=1.0):
        a = (scale * T) * V
        return torch.sum(torch.special.entr(a), dtype=F64) + torch.sum(torch.special.entr(1.0 - a), dtype=F64)

    @numpy_face
    @mapped_by_rows
    def project_dual_domain(self, V, T):
        return T * torch.clamp(T * V, 0.0, 1.0)

    @numpy_face
    @summed_by_rows
    def dual_slope(self, V, T):
        """``sum_i a_i log((1 - a_i) / a_i)``, ``a = y V``: the slope of ``s -> D(s V)`` at 1."""
        a = T * V
        return torch.sum(torch.xlogy(a, 1.0 - a) - torch.xlogy(a, a), dtype=F64)

    @numpy_face
    def accuracy(self, Yhat, T):
        return torch.mean((torch.where(Yhat >= 0, 1.0, -1.0) == T).to(F64))

    @numpy_face
    def hessian(self, Yhat, T):
        s = torch.sigmoid(T * Yhat)
        return (s * (1.0 - s))[:, :, None]

    @numpy_face
    def gradient_metric(self, Yhat, T, at=None):
        """``sum_i sigma(-m_i)^2 / (sigma(a_i) sigma(-a_i))``, ``m_i = y_i yhat_i``, ``a_i = y_i at_i``; at
        ``at = Yhat`` it is ``sum_i exp(-m_i)`` (= exp(L_i) - 1). In logarithms: ``sigma(-m) = exp(-softplus(m))``."""
        m = T * Yhat
        if at is None:
            return torch.sum(torch.exp(-m), dtype=F64)
        a = T * at
        sp = torch.nn.functional.softplus
        return torch.sum(torch.exp(sp(a) + sp(-a) - 2.0 * sp(m)), dtype=F64)

    def cvxpy_value(self, Yhat, T):
        import cvxpy as cp

        return cp.sum(cp.logistic(-cp.multiply(T, Yhat)))

    def cvxpy_dual(self, V, T):
        import cvxpy as cp

        a = cp.multiply(T, V)
        return cp.sum(cp.entr(a) + cp.entr(1 - a)), []


class CrossEntropyLoss(Loss):
    """``L(yhat, y) = logsumexp(yhat) - yhat_y``; dual term ``entropy(e_y - V)``, ``e_y - V`` in the simplex."""

    name = "cross_entropy"
    lipschitz = 0.5  # the Hessian diag(p) - p p^T has norm <= 1/2
    strong_concavity = 1.0  # Hessian of the entropy is -diag(1/p) <= -I on the simplex

    def encode(self, y, n_classes=None):
        y = np.asarray(y)
        if y.ndim != 1:
            raise invalid("y", "shape (N,) of integer class labels for the cross-entropy loss", f"shape {y.shape}")
        if y.dtype.kind == "f":
            if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
                raise invalid("y", "integer class labels in [0, c) for the cross-entropy loss", "non-integer values")
        elif y.dtype.kind not in "iu":
            raise invalid("y", "integer class labels for the cross-entropy loss", f"dtype {y.dtype}")
        low, top = float(y.min()), float(y.max())  # before any conversion: labels may be beyond int64
        c = int(top) + 1 if n_classes is None else check_int("n_classes", n_classes, 1)
        if low < 0 or top >= c:
            raise invalid("y", f"class labels in [0, {c})", f"labels from {low:g} to {top:g}", "number classes 0..c-1")
        if c < 2:
            raise invalid("y", "at least 2 classes for the cross-entropy loss", f"{c} class",
                          "pass n_classes or use the logistic/squared loss")
        check_allocation("y", 8.0 * len(y) * c, f"one-hot targets of {len(y)} samples x {c} classes, which take",
                         "number the classes 0..c-1 (c is the largest label + 1, or n_classes / --classes)")
        T = np.zeros((len(y), c))
        T[np.arange(len(y)), y.astype(np.int64)] = 1.0
        return T

    @numpy_face
    @summed_by_rows
    def value(self, Yhat, T):
        return torch.sum(torch.logsumexp(Yhat, dim=1), dtype=F64) - torch.sum(T * Yhat, dtype=F64)

    @numpy_face
    @mapped_by_rows
    def dual_variable(self, Yhat, T):
        # softmax by hand: torch.softmax splits even tiny inputs across threads, which stalls
        # for milliseconds per call on a loaded CPU
        E = torch.exp(Yhat - torch.amax(Yhat, dim=1, keepdim=True))
        return T - E / torch.sum(E, dim=1, keepdim=True)

    @numpy_face
    @summed_by_rows
    def dual_objective(self, V, T, scale=1.0):
        return torch.sum(torch.special.entr(T - scale * V), dtype=F64)

    @numpy_face
    @mapped_by_rows
    def project_dual_domain(self, V, T):
        return T - project_rows_to_simplex(T - V)

    @numpy_face
    @summed_by_rows
    def dual_slope(self, V, T):
        """``sum_ik V_ik (log(T_ik - V_ik) + 1)``: the slope of ``s -> D(s V)`` at 1."""
        return torch.sum(torch.xlogy(V, T - V) + V, dtype=F64)

    @numpy_face
    def accuracy(self, Yhat, T):
        return torch.mean((torch.argmax(Yhat, dim=1) == torch.argmax(T, dim=1)).to(F64))

    @numpy_face
    def hessian(self, Yhat, T):
        """``diag(p_i) - p_i p_i^T`` with ``p_i = softmax(yhat_i)``."""
        p = T - self.dual_variable(Yhat, T)
        return torch.diag_embed(p) - p[:, :, None] * p[:, None, :]

    @numpy_face
    def gradient_metric(self, Yhat, T, at=None):
        """``sum_i (p_i - e_y)^T diag(1/q_i) (p_i - e_y)``, ``p_i = softmax(yhat_i)``, ``q_i = softmax(at_i)``:
        ``p_i - e_y`` sums to zero, so ``diag(1/q_i)`` acts on it as the pseudo-inverse of
        ``diag(q_i) - q_i q_i^T``. At ``at = Yhat`` it is ``sum_i (1/p_{i,y} - 1)`` (= exp(L_i) - 1)."""
        if at is None:
            return torch.sum(torch.expm1(torch.logsumexp(Yhat, dim=1) - torch.sum(T * Yhat, dim=1)), dtype=F64)
        V = self.dual_variable(Yhat, T)  # e_y - p_i
        return torch.sum(V * V * torch.exp(-torch.log_softmax(at, dim=1)), dtype=F64)

    def cvxpy_value(self, Yhat, T):
        import cvxpy as cp

        return cp.sum(cp.log_sum_exp(Yhat, axis=1)) - cp.sum(cp.multiply(T, Yhat))

    def cvxpy_dual(self, V, T):
        import cvxpy as cp

        return cp.sum(cp.entr(T - V)), [cp.sum(V, axis=1) == 0]


LOSSES = {}


def register_loss(cls):
    """Add the loss class ``cls`` to :data:`LOSSES` under ``cls.name`` once it offers every face of the
    contract (:data:`~.contracts.LOSS_FACES`); otherwise one error names the missing faces."""
    check_faces(f"register_loss: loss {getattr(cls, 'name', None)!r}", cls, LOSS_FACES)
    LOSSES[cls.name] = cls
    return cls


for _loss in (SquaredLoss, LogisticLoss, CrossEntropyLoss):
    register_loss(_loss)


def get_loss(loss):
    """A :class:`Loss` from a name (``"squared"``, ``"logistic"``, ``"cross_entropy"``) or an instance."""
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str) and loss.replace("-", "_") in LOSSES:
        return LOSSES[loss.replace("-", "_")]()
    raise invalid("loss", f"one of {sorted(LOSSES)}", repr(loss))


def are_class_labels(y):
    """Whether targets are class labels to map (strings, booleans, objects), not numbers."""
    try:
        return np.asarray(y).dtype.kind not in "iufc"
    except ValueError:  # ragged: the array checks name it
        return False


def encode_classes(y, loss, classes=None, name="y"):
    """Class labels of any kind (strings, ints, ...) mapped to the loss's labels: the classes sorted,
    ``classes[k] -> k`` for ``"cross_entropy"``, ``classes[0] -> -1`` and ``classes[1] -> +1`` for
    ``"logistic"``. With ``classes`` (the training labels' classes, or a stored RESULT's), labels of
    another split are mapped the same way. Returns ``(codes, classes)``. The one mapping of
    ``make_problem``, the command line and the estimators.

    >>> codes, classes = encode_classes(["dog", "cat", "dog"], "logistic")
    >>> codes.tolist(), classes.tolist()
    ([1, -1, 1], ['cat', 'dog'])
    """
    y = np.asarray(y)
    loss = get_loss(loss).name
    if loss not in ("cross_entropy", "logistic"):
        raise invalid(name, f"numeric targets for the {loss} loss", f"labels of dtype {y.dtype}",
                      "class labels need the cross_entropy or logistic loss")
    if y.ndim != 1:
        raise invalid(name, "one label per sample, shape (N,)", f"shape {y.shape}")
    if classes is None:
        try:
            classes, index = np.unique(y, return_inverse=True)
        except TypeError:
            raise invalid(name, "labels of one sortable type", "labels of mixed types") from None
    else:
        classes = np.asarray(classes)
        unknown = ~np.isin(y, classes)
        if unknown.any():
            raise InvalidInputError(f"{name}: labels {np.unique(y[unknown])[:5].tolist()} are not among the "
                                    f"classes {classes.tolist()} of the training labels")
        index = np.searchsorted(classes, y)
    if loss == "logistic":
        if len(classes) != 2:
            raise invalid(name, "2 classes for the logistic loss", f"{len(classes)} classes",
                          "use the cross_entropy loss")
        return 2 * index - 1, classes
    return index, classes
