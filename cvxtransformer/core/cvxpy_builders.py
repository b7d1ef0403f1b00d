"""CVXPY builders of every program and its dual: (8)/(21), (10)/(28), (12)/(33), and program (6)
of Sahiner et al. with its spectral-norm dual.

Builders only build: each returns a :class:`Built` holding an unsolved ``cvxpy.Problem`` and what
is needed to read Z and a dual point back from it. The program supplies its CVXPY faces (the
variable, the map, the adjoint, the layout its regulariser reads), the loss and the regulariser
theirs, so one builder serves every family.
"""
from dataclasses import dataclass
from typing import Callable

import cvxpy as cp
import numpy as np

from .validation import check_problem


@dataclass
class Built:
    """An unsolved CVXPY problem, and readers of Z (the program's shape) and V (N, n_outputs)."""

    problem: cp.Problem
    form: str
    extract_Z: Callable[[], np.ndarray]
    extract_V: Callable[[], np.ndarray]


def build_primal(problem):
    """``min_Z sum_i L(yhat_i, y_i) + R(Z)`` with ``yhat = A(Z)`` as an explicit constraint."""
    program = check_problem(problem).program
    W = program.cvxpy_variable()
    Yhat = cp.Variable((program.N, program.n_outputs), name="Yhat")
    prediction = Yhat == program.cvxpy_forward(W)
    objective = problem.loss.cvxpy_value(Yhat, problem.T) + problem.regularizer.cvxpy_value(program.cvxpy_blocks(W))
    prob = cp.Problem(cp.Minimize(objective), [prediction])
    # The multiplier of yhat = A(Z) is V = -grad L(yhat) at the optimum: a dual point that is
    # as accurate as the solver's dual iterate, not only as accurate as its Z.
    return Built(prob, "primal", extract_Z=lambda: program.from_cvxpy(W.value),
                 extract_V=lambda: np.asarray(prediction.dual_value, dtype=float))


def build_dual(problem):
    """``max_V sum_i -L*(-V_i)`` s.t. ``dual_norm(A^T V) <= beta``: (21)/(28)/(33), or the spectral-norm
    dual of program (6). The primal is read back from the multipliers of the norm constraint."""
    program = check_problem(problem).program
    V = cp.Variable((program.N, program.n_outputs), name="V")
    objective, domain = problem.loss.cvxpy_dual(V, problem.T)
    blocks = program.cvxpy_blocks(program.cvxpy_adjoint(V))
    norm_constraints, readback = problem.regularizer.cvxpy_dual_constraint(blocks)
    prob = cp.Problem(cp.Maximize(objective), [*norm_constraints, *domain])
    return Built(prob, "dual", extract_Z=lambda: program.from_blocks(readback(blocks.value)),
                 extract_V=lambda: V.value)


BUILDERS = {"primal": build_primal, "dual": build_dual}
