"""A convex training problem: a program, a loss, targets and beta (SPEC.md).

    P(Z) = sum_i L(yhat_i(Z), y_i) + beta * sum_g ||z_g||_2
    D(V) = sum_i -L*(-V_i)   subject to ||(A^T V)_g||_2 <= beta for every group g

:func:`make_problem` validates raw user input and is the one way in.
"""
import numbers

import numpy as np

from .errors import invalid
from .losses import get_loss
from .programs import PROGRAMS, Program, gate_mask, sample_gates
from .regularizers import GroupLasso

ALLOWED_LOSSES = {8: ("squared", "logistic"),
                  10: ("squared", "logistic", "cross_entropy"),
                  12: ("squared", "logistic", "cross_entropy")}


class ConvexProblem:
    """Program (8), (10) or (12) with a loss and a regularization weight; build with :func:`make_problem`.

    Attributes
    ----------
    program : :class:`Program`, the linear map Z -> yhat and its adjoint
    loss : :class:`cvxtransformer.losses.Loss`
    T : ndarray of shape (N, c), the encoded targets
    beta : float
    regularizer : :class:`GroupLasso`
    U1, U2 : gate vectors of program (12), shapes (h, n) and (h, d); None otherwise
    """

    def __init__(self, program, loss, T, beta, U1=None, U2=None):
        self.program, self.loss, self.T, self.beta = program, loss, T, beta
        self.regularizer = GroupLasso(beta)
        self.U1, self.U2 = U1, U2
        self._beta_max = None

    def __repr__(self):
        p = self.program
        return (f"ConvexProblem(program={p.number}, loss={self.loss.name!r}, beta={self.beta:g}, "
                f"N={p.N}, n={p.n}, d={p.d}, c={p.c}, h={p.h})")

    def primal_objective(self, Z4):
        """P(Z) for canonical coefficients of shape (h, c, n, d)."""
        return self.loss.value(self.program.forward(Z4), self.T) + self.regularizer.value(Z4)

    def dual_objective(self, V):
        """D(V) for V of shape (N, c), which must be dual feasible."""
        return self.loss.dual_objective(V, self.T)

    def residual_dual(self, Z4):
        """``-grad L(yhat(Z))`` of shape (N, c), the unscaled dual point of Z."""
        return self.loss.dual_variable(self.program.forward(Z4), self.T)

    def beta_max(self):
        """Smallest beta for which Z = 0 is optimal: ``max_g ||(A^T (-grad L(0)))_g||``."""
        if self._beta_max is None:
            zero = np.zeros((self.program.N, self.program.c))
            G = self.program.adjoint(self.loss.dual_variable(zero, self.T))
            self._beta_max = self.regularizer.dual_norm(G)
        return self._beta_max

    def with_beta(self, beta):
        """The same data, program and loss with another beta (shares the program)."""
        other = ConvexProblem(self.program, self.loss, self.T, _check_beta(beta), self.U1, self.U2)
        other._beta_max = self._beta_max
        return other


def _finite_array(name, a, ndim, what):
    try:
        a = np.asarray(a, dtype=float)
    except (TypeError, ValueError):
        raise invalid(name, f"a numeric array of {what}", type(a).__name__) from None
    if a.ndim != ndim:
        raise invalid(name, f"{what}", f"shape {a.shape}")
    if a.size == 0:
        raise invalid(name, f"non-empty {what}", f"shape {a.shape}", "pass at least one sample")
    if not np.all(np.isfinite(a)):
        raise invalid(name, "finite values", f"{np.count_nonzero(~np.isfinite(a))} NaN/Inf entries",
                      "remove or impute them")
    return a


def _check_beta(beta):
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not np.isfinite(beta) or beta <= 0:
        raise invalid("beta", "a finite number > 0", repr(beta),
                      "pass the regularization weight, e.g. a fraction of beta_max")
    return float(beta)


def make_problem(X, y, program=10, loss="squared", beta=1.0, U1=None, U2=None, heads=None,
                 gate_seed=0, n_classes=None):
    """Validate the data and build program (8), (10) or (12).

    Parameters
    ----------
    X : array of shape (N, n, d)
    y : targets as SPEC.md fixes them: ``(N,)`` for (8); ``(N, c)`` or ``(N, n, c)`` with the
        squared loss; ``(N,)`` labels in {-1, +1} (logistic) or in [0, c) (cross-entropy)
    program : {8, 10, 12}
    loss : {"squared", "logistic", "cross_entropy"} or a Loss
    beta : float > 0
    U1, U2 : gate vectors (h, n) and (h, d) of program (12); sampled from ``heads`` and
        ``gate_seed`` when not given
    n_classes : number of classes c for the cross-entropy loss (default ``max(y) + 1``)

    Example
    -------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).standard_normal((20, 4, 3))
    >>> P = make_problem(X, X[:, 0, 0], program=8, loss="squared", beta=0.5)
    >>> P.program.shape
    (4, 3)
    """
    if isinstance(program, bool) or program not in PROGRAMS:
        raise invalid("program", "one of 8, 10, 12", repr(program))
    loss = get_loss(loss)
    if loss.name not in ALLOWED_LOSSES[program]:
        raise invalid("loss", f"one of {ALLOWED_LOSSES[program]} for program ({program})",
                      repr(loss.name), "use program 10 or 12 for several outputs")
    X = _finite_array("X", X, 3, "shape (N, n, d)")
    N, n, d = X.shape
    y_arr = np.asarray(y)
    if y_arr.ndim == 0 or y_arr.shape[0] != N:
        raise invalid("y", f"{N} targets (one per sample of X)", f"shape {y_arr.shape}")
    if y_arr.dtype.kind in "fc" and not np.all(np.isfinite(y_arr)):
        raise invalid("y", "finite values", "NaN/Inf entries", "remove or impute them")
    if y_arr.ndim == 3 and y_arr.shape[1] != n:
        raise invalid("y", f"sequence targets of shape (N, n={n}, c)", f"shape {y_arr.shape}")
    if program == 8 and y_arr.ndim != 1:
        raise invalid("y", "shape (N,) for program (8) (scalar output)", f"shape {y_arr.shape}",
                      "use program 10 for vector or sequence targets")
    T = loss.encode(y_arr, n_classes)
    beta = _check_beta(beta)
    mask = None
    if program == 12:
        if U1 is None and U2 is None:
            heads = 8 if heads is None else heads
            if isinstance(heads, bool) or not isinstance(heads, numbers.Integral) or heads < 1:
                raise invalid("heads", "an integer >= 1 (number of gates h)", repr(heads))
            U1, U2 = sample_gates(int(heads), n, d, gate_seed)
        elif U1 is None or U2 is None:
            raise invalid("U1, U2", "both gate matrices or neither", "only one of them")
        else:
            U1 = _finite_array("U1", U1, 2, "shape (h, n)")
            U2 = _finite_array("U2", U2, 2, "shape (h, d)")
            if U1.shape[1] != n or U2.shape[1] != d or U1.shape[0] != U2.shape[0]:
                raise invalid("U1, U2", f"shapes (h, {n}) and (h, {d})", f"{U1.shape} and {U2.shape}")
        mask = gate_mask(X, U1, U2)
    elif U1 is not None or U2 is not None:
        raise invalid("U1, U2", "no gate vectors for programs (8) and (10)", "gate vectors",
                      "use program 12 for the gated-ReLU FCN")
    return ConvexProblem(Program(program, X, T.shape[1], mask), loss, T, beta, U1, U2)
