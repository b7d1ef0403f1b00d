"""CVXPY builders of every program and its dual: (8)/(21), (10)/(28), (12)/(33), and program (6)
of Sahiner et al. with its spectral-norm dual.

Builders only build: each returns a :class:`Built` holding an unsolved ``cvxpy.Problem`` and what
is needed to read Z and a dual point back from it. The program supplies its CVXPY faces (the
variable, the map, the adjoint, the layout its regulariser reads), the loss and the regulariser
theirs, so one builder serves every family.

Formulations: the same program, handed to CVXPY in one of three forms (:data:`FORMULATIONS`; the
first one the problem allows is chosen by ``"auto"``, and recorded in the result):

* ``"compressed"`` (the squared loss, any program with ``design(start, stop)``): the data term
  ``1/2 ||A z - y||^2`` becomes ``1/2 ||R z - s||^2 + const`` with R of at most p rows (p the
  coefficients per output), computed in one pass over chunks of samples (:class:`LeastSquares`):
  the CVXPY problem does not grow with N.
* ``"factored"`` (programs that offer it, e.g. program (6) of Sahiner et al.): the map as a product of structured factors
  (``program.cvxpy_forward(W, "factored")``), fewer coefficients than the dense design.
* ``"direct"``: the dense design ``A`` times the variable, ``N * n_outputs`` rows.

Every form has the same optimum; the certificate is recomputed on the whole problem whatever the form.

Example
-------
>>> import numpy as np, cvxtransformer as ct
>>> X = np.random.default_rng(0).standard_normal((500, 4, 3))
>>> P = ct.make_problem(X, X[:, 0, :2], program=10, beta=5.0)
>>> built = build_primal(P)
>>> built.formulation, built.problem.size_metrics.num_scalar_variables < 100
('compressed', True)

CVXPY itself is imported by the builders only: the memory estimate (:func:`estimate_cvxpy_bytes`)
runs without it, so ``solver="auto"`` choosing the torch backend never loads CVXPY.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .errors import invalid
from .problem import check_problem
from .regularizers import NuclearNorm

FORMULATIONS = ("compressed", "factored", "direct")
GRAM_BYTES = 16 * 2**20  # design rows per chunk of the compression


@dataclass
class Built:
    """An unsolved CVXPY problem, its formulation, and readers of Z (the program's shape) and V (N, n_outputs)."""

    problem: cvxpy.Problem  # noqa: F821 (a string: CVXPY is imported by the builders only)
    form: str
    extract_Z: Callable[[], np.ndarray]
    extract_V: Callable[[], np.ndarray]
    formulation: str = "direct"


def offered_formulations(problem):
    """The formulations ``problem`` can be built in, in the order ``"auto"`` prefers them: compressed
    (the squared loss), then the program's own ``cvxpy_formulations`` in its order."""
    program = problem.program
    offered = tuple(getattr(program, "cvxpy_formulations", ("direct",)))
    if problem.loss.quadratic and hasattr(program, "design"):
        offered = ("compressed",) + offered
    return offered


def choose_formulation(problem, formulation="auto"):
    """``formulation`` checked against what ``problem`` offers (``"auto"``: the first it offers)."""
    offered = offered_formulations(problem)
    if formulation == "auto":
        return offered[0]
    if formulation not in offered:
        raise invalid("formulation", f"one of {('auto',) + offered} for {problem.program.label} with the "
                      f"{problem.loss.name} loss", repr(formulation))
    return formulation


def _design_dims(program):
    """(p, q, r): design columns, outputs per design row (the variable is (p, q) reshaped), rows per sample."""
    p = program.design(0, 0).shape[1]
    q = int(np.prod(program.cvxpy_variable().shape)) // p
    return p, q, program.n_outputs // q


def _design_gram(program):
    """``design_gram(start, stop, Y)`` from the design rows: ``(A^T A, A^T Y)`` of samples start:stop."""
    def gram(start, stop, Y):
        A = torch.from_numpy(np.ascontiguousarray(program.design(start, stop), dtype=float))
        return (A.T @ A).numpy(), (A.T @ torch.from_numpy(np.ascontiguousarray(Y))).numpy()

    return gram


class LeastSquares:
    """The squared-loss data term of a program compressed to the size of its coefficients.

    With the design ``A`` (``N*r`` rows, ``r`` rows per sample, p columns: ``program.design``), the
    targets ``Y`` (``N*r`` x q) and the coefficients ``C`` (p x q, the CVXPY variable reshaped),

        1/2 ||A C - Y||_F^2 = 1/2 ||R C - S||_F^2 + const      for every C,

    from ``H = A^T A``, ``B = A^T Y`` and ``||Y||^2``, accumulated over chunks of samples (only those rows of
    X are read: memory-mapped data is never loaded whole) by the program's ``design_gram(start, stop, Y)``
    when it has one (program (6): from its G_i, never forming the design), else from its design rows. Then a
    Cholesky factorisation with complete pivoting, ``H[perm][:, perm] = L L^T`` (LAPACK ``dpstrf``), stops at
    the numerical rank k (the pivot falls below ``p * eps * max(diag H)``): ``R = L^T`` with its columns put
    back in place (k x p, full row rank), ``S = L_k^{-1} B[perm_k]`` (k x q, ``L_k`` the leading k x k block)
    and ``const = 1/2 (||Y||^2 - ||S||^2)``, the squared norm of the part of Y outside the range of A, so
    the two sides agree for every C. Why this factor: the Gram matrix is one pass of BLAS-3 products over
    the data (half the work of a streamed QR, and the product the torch backend forms too), the pivoted
    Cholesky costs p^2 k / 3 (an eigendecomposition ~9 p^3: seconds for program (6) with d = 12, p = 1728), and
    stopping at the rank makes a singular ``A^T A`` (duplicated tokens, N < p, the symmetric ``G_i`` of
    program (6), where k is about half of p) harmless: ``L_k`` is well conditioned on the range, S stays
    bounded, and what is dropped is a Schur complement that is zero up to rounding. The CVXPY problem has
    k q residuals and k p q coefficients, whatever N.

    Dual points: for any ``U`` (k x q) (the compressed residual ``S - R C``, or a solver's multiplier for
    it), the C' with ``C'[perm_k] = L_k^{-T} (S - U)`` and zeros elsewhere has ``R C' = S - U``, hence
    ``A^T (Y - A C') = R^T U``: the full residual ``Y - A C'`` is the dual point of the whole problem that U
    stands for (its dual objective is ``<U, S> - 1/2 ||U||^2 + const``), computed in one pass over the data.

    Attributes: ``R`` (k, p), ``S`` (k, q), ``const``, ``L`` (k, k), ``perm`` (k,), ``seconds`` (the pass).
    """

    def __init__(self, problem, chunk_bytes=GRAM_BYTES):
        from scipy.linalg import lapack, solve_triangular

        t0 = time.perf_counter()
        program, T = problem.program, problem.T
        p, q, r = _design_dims(program)
        gram = getattr(program, "design_gram", None) or _design_gram(program)
        H, B, yy = np.zeros((p, p)), np.zeros((p, q)), 0.0
        step = max(1, chunk_bytes // (8 * r * (p + q)))
        for s in range(0, program.N, step):
            Y = T[s:min(s + step, program.N)].reshape(-1, q)
            Hc, Bc = gram(s, min(s + step, program.N), Y)
            H += Hc
            B += Bc
            yy += float(np.sum(Y * Y))
        c, piv, k, _ = lapack.dpstrf(H, lower=1)  # H[perm][:, perm] = L L^T, L (p, k)
        if k == 0:  # A = 0: the data term is the constant 1/2 ||Y||^2 (one zero row keeps the shapes nonempty)
            self.perm, self.L, self.R, self.S = np.zeros(1, dtype=int), np.ones((1, 1)), np.zeros((1, p)), np.zeros((1, q))
        else:
            self.perm, self.L = piv[:k] - 1, np.tril(c[:k, :k])
            self.R = np.zeros((k, p))
            self.R[:, piv - 1] = np.tril(c)[:, :k].T
            self.S = solve_triangular(self.L, B[self.perm], lower=True)
        self.const = 0.5 * (yy - np.sum(self.S ** 2))
        self.p, self.q = p, q
        self.seconds = time.perf_counter() - t0

    def coefficients(self, W):
        """The CVXPY variable ``W`` viewed as the (p, q) coefficients the design multiplies."""
        import cvxpy as cp

        return W if W.shape == (self.p, self.q) else cp.reshape(W, (self.p, self.q), order="C")

    def dual_point(self, problem, U, shape):
        """The dual point ``Y - A C'`` (N, n_outputs) of the whole problem for a compressed one ``U``
        (one pass over the data); ``shape`` is that of the CVXPY variable."""
        from scipy.linalg import solve_triangular

        C = np.zeros((self.p, self.q))
        C[self.perm] = solve_triangular(self.L.T, self.S - np.asarray(U, dtype=float), lower=False)
        return problem.residual_dual(problem.program.from_cvxpy(C.reshape(shape)))


def cvxpy_penalty(regularizer, blocks, nuclear_form="joint"):
    """``(expression, constraints)`` of ``R(Z)`` in CVXPY: the nuclear norm's in ``nuclear_form``
    (:meth:`~.regularizers.NuclearNorm.cvxpy_penalty`), any other regulariser's ``cvxpy_value`` and no constraint."""
    if isinstance(regularizer, NuclearNorm):
        return regularizer.cvxpy_penalty(blocks, nuclear_form)
    return regularizer.cvxpy_value(blocks), []


def build_primal(problem, formulation="auto", nuclear_form="joint"):
    """``min_Z sum_i L(yhat_i, y_i) + R(Z)``; ``yhat = A(Z)`` is an explicit constraint, or, compressed,
    ``min_Z 1/2 ||R C - S||^2 + const + R(Z)`` with the residual ``R C - S`` as the constraint.
    ``nuclear_form``: the PSD cones of a nuclear norm, "joint", "rows" or "auto" (:func:`cvxpy_penalty`)."""
    import cvxpy as cp

    program = check_problem(problem).program
    formulation = choose_formulation(problem, formulation)
    W = program.cvxpy_variable()
    penalty, cones = cvxpy_penalty(problem.regularizer, program.cvxpy_blocks(W), nuclear_form)
    if formulation == "compressed":
        ls = LeastSquares(problem)
        residual = cp.Variable(ls.S.shape, name="residual")
        fit = residual == ls.R @ ls.coefficients(W) - ls.S
        prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(residual) + ls.const + penalty), [fit, *cones])
        # the multiplier of the residual is -grad at the optimum: U, mapped to the whole problem
        return Built(prob, "primal", extract_Z=lambda: program.from_cvxpy(W.value),
                     extract_V=lambda: ls.dual_point(problem, fit.dual_value, W.shape), formulation=formulation)
    Yhat = cp.Variable((program.N, program.n_outputs), name="Yhat")
    forward, factors = program.cvxpy_factored_forward(W) if formulation == "factored" else \
        (program.cvxpy_forward(W), [])
    prediction = Yhat == forward
    prob = cp.Problem(cp.Minimize(problem.loss.cvxpy_value(Yhat, problem.T) + penalty), [prediction, *factors, *cones])
    # The multiplier of yhat = A(Z) is V = -grad L(yhat) at the optimum: a dual point that is
    # as accurate as the solver's dual iterate, not only as accurate as its Z.
    return Built(prob, "primal", extract_Z=lambda: program.from_cvxpy(W.value),
                 extract_V=lambda: np.asarray(prediction.dual_value, dtype=float), formulation=formulation)


def build_dual(problem, formulation="auto"):
    """``max_V sum_i -L*(-V_i)`` s.t. ``dual_norm(A^T V) <= beta``: (21)/(28)/(33), or the spectral-norm
    dual of program (6). The primal is read back from the multipliers of the norm constraint.
    Compressed: ``max_U <U, S> - 1/2 ||U||^2 + const`` s.t. ``dual_norm(R^T U) <= beta`` (see
    :class:`LeastSquares`), whose optimum is the whole problem's."""
    import cvxpy as cp

    program = check_problem(problem).program
    formulation = choose_formulation(problem, formulation)
    if formulation == "compressed":
        ls = LeastSquares(problem)
        shape = program.cvxpy_variable().shape
        U = cp.Variable(ls.S.shape, name="U")
        objective = cp.sum(cp.multiply(U, ls.S)) - 0.5 * cp.sum_squares(U) + ls.const
        adjoint, domain = cp.reshape(ls.R.T @ U, shape, order="C"), []
        extract_V = lambda: ls.dual_point(problem, U.value, shape)  # noqa: E731
    else:
        V = cp.Variable((program.N, program.n_outputs), name="V")
        objective, domain = problem.loss.cvxpy_dual(V, problem.T)
        adjoint, factors = program.cvxpy_factored_adjoint(V) if formulation == "factored" else \
            (program.cvxpy_adjoint(V), [])
        domain = [*domain, *factors]
        extract_V = lambda: V.value  # noqa: E731
    blocks = program.cvxpy_blocks(adjoint)
    norm_constraints, readback = problem.regularizer.cvxpy_dual_constraint(blocks)
    prob = cp.Problem(cp.Maximize(objective), [*norm_constraints, *domain])
    return Built(prob, "dual", extract_Z=lambda: program.from_blocks(readback(blocks.value)),
                 extract_V=extract_V, formulation=formulation)


BUILDERS = {"primal": build_primal, "dual": build_dual}


BYTES_FIXED = 80 * 2**20  # the interpreter's growth by importing CVXPY (lazily) and the solver's setup


def design_size(problem):
    """``(rows, features, columns)`` of the dense design (the direct formulation): ``rows`` x
    ``features`` (the program's ``design()``; computed here from one sample, never built whole) times
    a variable of ``features`` x ``columns``."""
    program = problem.program
    rows, features = program.on(program.X[:1]).design().shape
    return program.N * rows, features, int(np.prod(program.shape)) // features


def cvxpy_coefficients(problem, formulation="auto"):
    """Nonzeros of the map CVXPY gets in ``formulation``: ``"compressed"`` at most p^2 q (p design
    columns, q outputs per design row: whatever N), ``"factored"`` the program's
    ``cvxpy_factored_size()``, ``"direct"`` the dense design's ``rows * features * columns`` (a
    block-diagonal copy per column)."""
    formulation = choose_formulation(problem, formulation)
    if formulation == "compressed":
        p, q, _ = _design_dims(problem.program)
        return p * p * q
    if formulation == "factored":
        return problem.program.cvxpy_factored_size()
    rows, features, columns = design_size(problem)
    return rows * features * columns


def estimate_cvxpy_bytes(problem, form, solver, formulation="auto", nuclear_form=None):
    """Peak bytes that building ``problem`` in ``form`` ("primal" or "dual", the same to this
    precision) and ``formulation`` with CVXPY and solving it with ``solver`` (a CVXPY backend of
    :mod:`cvxtransformer.solvers`, which measured its own costs) will take, estimated before any of it:
    ``solver.bytes_per_coefficient`` per nonzero of the map (:func:`cvxpy_coefficients`), of the loss's
    cones (2 per output for the squared loss, 8 for an exponential cone) and of the regulariser's; for
    the nuclear norm, ``solver.bytes_per_psd_entry`` per entry of each PSD cone's Hessian block
    ((t (t + 1) / 2)^2 for a cone of side t; the cones are those of ``nuclear_form`` (default: the
    solver's) in the primal, :meth:`~.regularizers.NuclearNorm.psd_cones`, and one of side p + q in the dual: what
    makes program (6) with d = 12 costly, whatever N); and the arrays the builder itself holds.
    Calibrated against measured peaks (the estimate is at or above every one;
    docs/benchmark_memory.md).

    Example
    -------
    >>> import numpy as np, cvxtransformer as ct
    >>> from cvxtransformer.solvers import Clarabel
    >>> X = np.random.default_rng(0).standard_normal((10_000, 8, 16))
    >>> P = ct.make_problem(X, X[:, 0, :4], program=10, beta=1.0)
    >>> [estimate_cvxpy_bytes(P, "primal", Clarabel, f) // 2**20 for f in ("direct", "compressed")]   # MiB
    [1577, 115]
    """
    formulation = choose_formulation(problem, formulation)
    program = problem.program
    outputs = program.N * program.n_outputs
    if formulation == "compressed":
        p, q, _ = _design_dims(program)
        outputs, held = p * q, GRAM_BYTES + 4 * 8 * (p + q) ** 2
    elif formulation == "factored":
        held = 8 * program.N * program.d ** 2
    else:
        rows, features, _ = design_size(problem)
        held = 8 * rows * features
    shape = program.shape
    size = int(np.prod(shape))
    cones, dense = 2 * size, 0.0
    if isinstance(problem.regularizer, NuclearNorm):
        psd_form = (nuclear_form or getattr(solver, "nuclear_form", "joint")) if form == "primal" else "joint"
        matrices, p, q = problem.regularizer.matrices(shape)
        count, entries = NuclearNorm.psd_cones(p, q, psd_form)
        count *= matrices
        cones = count * entries + size
        dense = solver.bytes_per_psd_entry * count * float(entries) ** 2
    loss = outputs * (2 if problem.loss.quadratic else 8)
    coefficients = cvxpy_coefficients(problem, formulation) + loss + cones
    return int(solver.bytes_per_coefficient * coefficients + dense + held + BYTES_FIXED)
