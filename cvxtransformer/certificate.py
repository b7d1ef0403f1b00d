"""The verifier: certify any coefficients Z, whatever produced them (SPEC.md, Certificates).

Everything is recomputed from Z itself: P(Z), a dual-feasible point built by scaling the
negative loss gradient, D(V), the duality gap, the KKT residuals, beta_max, and the
nonconvex weights of Proposition 1 with the nonconvex objective at them. A solver's
reported status or gap never enters.
"""
from dataclasses import asdict, dataclass, field

import numpy as np

from .recovery import nonconvex_objective, recover_weights
from .regularizers import group_norms

SCREENING_MARGIN = 1e-9


def dual_feasible_point(problem, V):
    """A dual-feasible point from any candidate ``V`` of shape (N, c).

    ``V`` is projected onto the loss's dual domain, then scaled by
    ``min(1, beta / max_g ||(A^T V)_g||)``; scaling toward 0 stays in the domain for all three
    losses, so the returned point satisfies every constraint of the dual program.
    """
    V = problem.loss.project_dual_domain(np.asarray(V, dtype=float), problem.T)
    worst = problem.regularizer.dual_norm(problem.program.adjoint(V))
    return V * min(1.0, problem.beta / worst) if worst > 0 else V


def kkt_residuals(problem, Z4):
    """KKT residuals relative to beta: (stationarity on the support, dual feasibility off it)."""
    G = problem.program.adjoint(problem.residual_dual(Z4))
    norms = group_norms(Z4)
    support = norms > 0
    beta = problem.beta
    stationarity = 0.0
    if support.any():
        direction = Z4[support] / norms[support][:, None]
        stationarity = float(np.max(np.linalg.norm(G[support] - beta * direction, axis=-1))) / beta
    off = group_norms(G)[~support]
    feasibility = float(np.max(np.maximum(0.0, off - beta))) / beta if off.size else 0.0
    return stationarity, feasibility


def gap_safe_zero_groups(problem, V, gap):
    """Groups that are zero at every optimum, by the gap-safe sphere test.

    The dual optimum lies within ``r = sqrt(2 gap / mu)`` of the feasible point ``V``
    (``mu``: strong concavity of D), so ``||(A^T V)_g|| + r ||A_g|| < beta`` proves ``z*_g = 0``.
    The test keeps a relative margin of 1e-9 so that rounding in the norms can never
    discard a group that is active at an exact optimum (where ``||(A^T V)_g|| = beta``).
    Returns a boolean array of shape (h, c, n).
    """
    radius = np.sqrt(2.0 * max(gap, 0.0) / problem.loss.strong_concavity)
    G = problem.program.adjoint(V)
    bound = group_norms(G) + radius * problem.program.group_operator_norms()
    return bound < problem.beta * (1.0 - SCREENING_MARGIN)


@dataclass
class Certificate:
    """What the verifier recomputed from a solution (see :func:`certify`)."""

    primal_objective: float
    dual_objective: float
    duality_gap: float
    relative_gap: float
    kkt_stationarity: float
    kkt_dual_feasibility: float
    beta: float
    beta_max: float
    support_size: int
    heads_recovered: int
    recovered_objective: float
    recovered_objective_lemma1: float
    tol: float
    certified: bool
    V: np.ndarray = field(repr=False)

    def to_dict(self):
        d = asdict(self)
        d.pop("V")
        return d


def certify(problem, Z, V=None, tol=1e-6):
    """Certify coefficients ``Z`` (public shape of the program) of ``problem``.

    Parameters
    ----------
    problem : ConvexProblem
    Z : ndarray of the program's shape: (n, d) for (8), (c, n, d) for (10), (h, c, n, d) for (12)
    V : optional candidate dual point (N, c) (or (N,)), e.g. from the dual program; it is made
        feasible (:func:`dual_feasible_point`) and used only if it gives a better bound
    tol : the relative gap below which the solution is reported ``certified``

    Returns
    -------
    Certificate, with ``relative_gap = (P(Z) - D(V)) / max(1, |P(Z)|)``.
    """
    Z4 = problem.program.to_canonical(Z)
    return certify_canonical(problem, Z4, V, tol)


def certify_canonical(problem, Z4, V=None, tol=1e-6):
    """:func:`certify` for canonical coefficients of shape (h, c, n, d)."""
    primal = problem.primal_objective(Z4)
    V_best = dual_feasible_point(problem, problem.residual_dual(Z4))
    dual = problem.dual_objective(V_best)
    if V is not None:
        V_other = dual_feasible_point(problem, np.asarray(V, dtype=float).reshape(problem.T.shape))
        other = problem.dual_objective(V_other)
        if other > dual:
            V_best, dual = V_other, other
    gap = primal - dual
    stationarity, feasibility = kkt_residuals(problem, Z4)
    gated = problem.program.mask is not None
    X, T, loss, beta = problem.program.X, problem.T, problem.loss, problem.beta
    balanced = recover_weights(Z4, gated, "balanced")
    lemma1 = recover_weights(Z4, gated, "lemma1")
    relative = gap / max(1.0, abs(primal))
    return Certificate(
        primal_objective=primal, dual_objective=dual, duality_gap=gap, relative_gap=relative,
        kkt_stationarity=stationarity, kkt_dual_feasibility=feasibility, beta=beta,
        beta_max=problem.beta_max(), support_size=int(np.count_nonzero(group_norms(Z4))),
        heads_recovered=balanced.heads,
        recovered_objective=nonconvex_objective(X, T, loss, balanced, beta, problem.U1, problem.U2),
        recovered_objective_lemma1=nonconvex_objective(X, T, loss, lemma1, beta, problem.U1, problem.U2),
        tol=tol, certified=bool(relative <= tol), V=V_best)
