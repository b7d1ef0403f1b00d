"""CVXPY builders of every program and its dual: (8)/(21), (10)/(28), (12)/(33), and program (6)
of Sahiner et al. with its spectral-norm dual.

Builders only build: each returns a :class:`Built` holding an unsolved ``cvxpy.Problem`` and what
is needed to read Z and a dual point back from it. The program supplies its CVXPY faces (the
variable, the map, the adjoint, the layout its regulariser reads), the loss and the regulariser
theirs, so one builder serves every family.

CVXPY itself is imported by the builders only: the memory estimate (:func:`estimate_cvxpy_bytes`)
runs without it, so ``solver="auto"`` choosing the torch backend never loads CVXPY.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .validation import check_problem


@dataclass
class Built:
    """An unsolved CVXPY problem, and readers of Z (the program's shape) and V (N, n_outputs)."""

    problem: cvxpy.Problem  # noqa: F821 (a string: CVXPY is imported by the builders only)
    form: str
    extract_Z: Callable[[], np.ndarray]
    extract_V: Callable[[], np.ndarray]


def build_primal(problem):
    """``min_Z sum_i L(yhat_i, y_i) + R(Z)`` with ``yhat = A(Z)`` as an explicit constraint."""
    import cvxpy as cp

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
    import cvxpy as cp

    program = check_problem(problem).program
    V = cp.Variable((program.N, program.n_outputs), name="V")
    objective, domain = problem.loss.cvxpy_dual(V, problem.T)
    blocks = program.cvxpy_blocks(program.cvxpy_adjoint(V))
    norm_constraints, readback = problem.regularizer.cvxpy_dual_constraint(blocks)
    prob = cp.Problem(cp.Maximize(objective), [*norm_constraints, *domain])
    return Built(prob, "dual", extract_Z=lambda: program.from_blocks(readback(blocks.value)),
                 extract_V=lambda: V.value)


BUILDERS = {"primal": build_primal, "dual": build_dual}


# Memory of a CVXPY build and solve, measured (peak RSS over the interpreter's, ``ru_maxrss``) by
# benchmarks/memory.py on the project's machine (docs/benchmark_memory.md): per coefficient of the
# design (rows x features x columns) and per entry of the dense Hessian block of a PSD cone (the
# nuclear norm's, of side p + q for Z of shape (p, q)), each the largest ratio measured, rounded up.
BYTES_PER_COEFFICIENT = {"clarabel": 300, "scs": 450}
BYTES_PER_PSD_ENTRY = {"clarabel": 64, "scs": 16}
BYTES_FIXED = 64 * 2**20


def design_size(problem):
    """``(rows, features, columns)`` of the CVXPY map: a dense design of ``rows`` x ``features``
    (the program's ``design()``; computed here from one sample, never built whole) times a
    variable of ``features`` x ``columns``. CVXPY and the conic solvers hold its
    ``rows * features * columns`` coefficients (a block-diagonal copy per column)."""
    program = problem.program
    rows, features = program.on(program.X[:1]).design().shape
    return program.N * rows, features, int(np.prod(program.shape)) // features


def estimate_cvxpy_bytes(problem, form="primal", solver="clarabel"):
    """Bytes that building ``problem`` in ``form`` with CVXPY and solving it with ``solver``
    ("clarabel" or "scs") will take at their peak, estimated without building anything:
    ``BYTES_PER_COEFFICIENT`` per coefficient of the design (:func:`design_size`), plus, for the
    nuclear norm, ``BYTES_PER_PSD_ENTRY`` per entry of its PSD cone's Hessian block
    ((t (t + 1) / 2)^2 for a cone of side t = p + q). Calibrated against measured peaks (the
    estimate is at or above every one; docs/benchmark_memory.md); the same for both forms."""
    rows, features, columns = design_size(problem)
    total = BYTES_PER_COEFFICIENT[solver] * float(rows) * features * columns + BYTES_FIXED
    if getattr(problem.regularizer, "name", "") == "nuclear_norm":
        side = sum(problem.program.shape)
        total += BYTES_PER_PSD_ENTRY[solver] * (side * (side + 1) / 2) ** 2
    return total
