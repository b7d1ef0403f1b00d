"""CVXPY builders for programs (8), (10), (12) and their duals (21), (28), (33).

Builders only build: each returns a :class:`Built` holding an unsolved ``cvxpy.Problem``
and what is needed to read the coefficients Z back from it. The formulation is
vectorised: one matrix product with the (gated) design for all samples and one vector
norm over all groups.

Layout: the primal variable ``W`` has shape (h*n*d, c) with ``W[(j*n + k)*d + e, l] =
Z[j, l, k, e]``; reshaped column-major to (d, h*n*c) its columns are the groups, column
``q = j*n + k + l*h*n`` being group (j, l, k).
"""
from dataclasses import dataclass
from typing import Callable

import cvxpy as cp
import numpy as np


@dataclass
class Built:
    """An unsolved CVXPY problem and the map from its solution to canonical Z (h, c, n, d)."""

    problem: cp.Problem
    form: str
    extract_Z: Callable[[], np.ndarray]
    extract_V: Callable[[], np.ndarray]


def _groups_as_columns(expr, program):
    h, c, n, d = program.canonical_shape
    return cp.reshape(expr, (d, h * n * c), order="F")


def _W_to_canonical(W, program):
    h, c, n, d = program.canonical_shape
    return W.reshape(h, n, d, c).transpose(0, 3, 1, 2).copy()


def _multipliers_to_canonical(lam, program):
    h, c, n, _ = program.canonical_shape
    return lam.reshape(c, h, n).transpose(1, 0, 2)


def build_primal(problem):
    """Program (8)/(10)/(12) as ``min_Z sum_i L(yhat_i, y_i) + beta sum_g ||z_g||``."""
    program = problem.program
    W = cp.Variable((program.h * program.n * program.d, program.c), name="Z")
    Yhat = cp.Variable((program.N, program.c), name="Yhat")
    prediction = Yhat == program.design() @ W
    objective = problem.loss.cvxpy_value(Yhat, problem.T) + \
        problem.regularizer.cvxpy_value(_groups_as_columns(W, program))
    prob = cp.Problem(cp.Minimize(objective), [prediction])
    # The multiplier of yhat = A(Z) is V = -grad L(yhat) at the optimum: a dual point that
    # is as accurate as the solver's dual iterate, not only as accurate as its Z.
    return Built(prob, "primal",
                 extract_Z=lambda: _W_to_canonical(W.value, program),
                 extract_V=lambda: np.asarray(prediction.dual_value, dtype=float))


def build_dual(problem):
    """Dual (21)/(28)/(33): ``max_V sum_i -L*(-V_i)`` s.t. ``||(A^T V)_g|| <= beta`` for every group.

    The primal is read back from the multipliers ``lambda_g >= 0`` of the norm constraints:
    ``z_g = lambda_g (A^T V)_g / beta`` (stationarity of the Lagrangian in V).
    """
    program = problem.program
    V = cp.Variable((program.N, program.c), name="V")
    objective, domain = problem.loss.cvxpy_dual(V, problem.T)
    AtV = program.design().T @ V
    norm_constraint = problem.regularizer.cvxpy_dual_constraint(_groups_as_columns(AtV, program))
    prob = cp.Problem(cp.Maximize(objective), [norm_constraint, *domain])

    def extract_Z():
        lam = np.maximum(np.asarray(norm_constraint.dual_value, dtype=float).ravel(), 0.0)
        G = program.adjoint(V.value)
        return _multipliers_to_canonical(lam, program)[..., None] * G / problem.beta

    return Built(prob, "dual", extract_Z=extract_Z, extract_V=lambda: V.value)


BUILDERS = {"primal": build_primal, "dual": build_dual}
