"""The verifier: certify any coefficients Z, whatever produced them, as tightly as the problem allows.

Everything is recomputed from Z (:mod:`cvxtransformer.core.certificate`). The dual point built
from Z alone, ``V = s (-grad L(yhat(Z)))``, is only first-order accurate: its gap is about the
square root of the true suboptimality. So the verifier also computes a dual point of its own: the
torch proximal-gradient solver, warm-started at Z, is run on the whole problem (bounded in time)
and its best dual point is a candidate. Any dual-feasible point gives a valid bound, and every
candidate is projected and scaled into the feasible set by the core before it is used, so the
refinement can only tighten the certificate, never make it lie.

Stopping rule of the refinement: with ``Z_r`` the refined iterate and ``g_r`` its own gap,
``D(V_r) >= p* - g_r``, so the certificate of Z is at most ``(P(Z) - P(Z_r)) + g_r``; refinement stops
once ``g_r <= max(1e-13 max(1, |P(Z)|), 0.1 (P(Z) - P(Z_r)))``, where the reported gap is within 10%
of ``P(Z) - P(Z_r) <= P(Z) - p*``, the true suboptimality (or at the floor, or at ``refine_time``).
"""
import time

from solvers.proxgrad import ProxGrad

from .core.certificate import assemble, best_dual
from .core.errors import InvalidInputError
from .core.validation import check_positive, check_tol

REFINE_FLOOR = 1e-13  # relative gap of the refined point below which refinement stops


def refine_dual(problem, Z, time_limit=10.0, floor=REFINE_FLOOR):
    """A dual point for ``Z`` computed by the verifier (see the module docstring).

    Returns ``(V, seconds, status)``: V of shape (N, n_outputs) (not yet scaled: the certificate
    makes it feasible), the wall time, and how the refinement ended.
    """
    start = time.perf_counter()
    P_Z = float(problem.primal_objective(Z))
    scale = max(1.0, abs(P_Z))

    def stop(primal, dual):
        return primal - dual <= max(floor * scale, 0.1 * (P_Z - primal))

    out = ProxGrad().solve(problem, tol=floor, init=Z, time_limit=time_limit, max_iter=10**7, stop=stop,
                           screen_norms="auto")
    return out.V, time.perf_counter() - start, out.status


def certify(problem, Z, V=None, tol=1e-6, refine=True, refine_time=10.0):
    """Certify coefficients ``Z`` of ``problem``, from any solver.

    Parameters
    ----------
    problem : ConvexProblem, from :func:`cvxtransformer.make_problem`
    Z : ndarray of the program's shape: (n, d) for (8), (c, n, d) for (10), (h, c, n, d) for (12),
        (d^2, dc) for "mhsa", (P, d^2, dc) for "gated_mhsa"
    V : optional candidate dual point (N, n_outputs) (or (N,) with one output), e.g. a solver's
        multipliers; it is made feasible here and used only if it gives a better bound
    tol : the relative gap below which the solution is reported ``certified`` (0 < tol < 1)
    refine : True: compute a refined dual point (see the module docstring), unless the gap is
        already at the floor 1e-13; "auto": only when the gap is above ``tol``; False: never
    refine_time : seconds allowed to the refinement

    Returns
    -------
    Certificate, with ``relative_gap = (P(Z) - D(V)) / max(1, |P(Z)|)`` at the best dual point,
    ``residual_relative_gap`` (from Z alone), ``refined_relative_gap`` and ``dual_source``.

    Example
    -------
    >>> import numpy as np, cvxtransformer as ct
    >>> X = np.random.default_rng(0).standard_normal((30, 4, 3))
    >>> P = ct.make_problem(X, X[:, 1, 0], program=8, beta=1.0)
    >>> cert = ct.certify(P, np.zeros((4, 3)))
    >>> cert.certified, cert.dual_objective <= cert.primal_objective
    (False, True)
    """
    tol = check_tol(tol)
    Z = problem.program.check_Z(Z)
    candidates = {}
    if V is not None:
        candidates["given"] = problem.program.check_V(V)
    if refine not in (True, False, "auto"):
        raise InvalidInputError(f"refine: expected True, False or 'auto', got {refine!r}")
    refine_time = check_positive("refine_time", refine_time)
    refinement = None
    if refine:
        primal, _, dual = best_dual(problem, Z, candidates.get("given"))
        gap = (primal - dual) / max(1.0, abs(primal))
        if gap <= (tol if refine == "auto" else REFINE_FLOOR):
            refinement = (0.0, "not needed: the gap is already at " + ("tol" if refine == "auto" else "the floor"))
        else:
            V_ref, seconds, status = refine_dual(problem, Z, refine_time)
            candidates["refined"] = V_ref
            refinement = (seconds, status)
    return assemble(problem, Z, candidates, tol, refinement)
