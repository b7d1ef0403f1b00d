"""``solve``: one entry point for every backend, returning a certified :class:`SolveResult`."""
import numpy as np

from .certificate import certify_canonical, dual_feasible_point, gap_safe_zero_groups
from .errors import invalid
from .result import SolveResult

FORMS = ("primal", "dual")


def solve(problem, solver="clarabel", form="primal", tol=1e-6, verbose=False, screen=True, **options):
    """Solve a :class:`ConvexProblem` and certify the solution.

    Parameters
    ----------
    problem : ConvexProblem, from :func:`cvxtransformer.make_problem`
    solver : "clarabel" or "scs" (CVXPY backends)
    form : "primal" solves program (8)/(10)/(12); "dual" solves (21)/(28)/(33) and reads Z back
        from the multipliers of the norm constraints
    tol : relative duality gap at which the result is ``certified`` (recomputed by the verifier)
    screen : set to exactly zero the groups that the gap-safe test proves zero at every
        optimum (interior-point and splitting solvers return tiny nonzero values there)
    options : passed to the backend (solver settings)

    For ``beta >= beta_max`` the solution ``Z = 0`` is known in closed form; it is returned
    without calling the solver and certified like any other.

    Example
    -------
    >>> import numpy as np, cvxtransformer as ct
    >>> X = np.random.default_rng(0).standard_normal((30, 4, 3))
    >>> P = ct.make_problem(X, X[:, 1, 0], program=8, beta=1.0)
    >>> ct.solve(P, "clarabel").certified
    True
    """
    from solvers import BACKENDS, get_backend

    if solver not in BACKENDS:
        raise invalid("solver", f"one of {sorted(BACKENDS)}", repr(solver))
    backend, forms = get_backend(solver)
    if form not in forms:
        raise invalid("form", f"one of {forms} for solver {solver!r}", repr(form))
    program = problem.program
    if problem.beta >= problem.beta_max():
        Z4, V, status, times, iterations, history = (np.zeros(program.canonical_shape), None,
                                                     "zero (beta >= beta_max)", (0.0, 0.0), 0, [])
    else:
        out = backend(problem, form=form, tol=tol, verbose=verbose, **options)
        Z4, V, status, iterations, history = out.Z4, out.V, out.status, out.iterations, out.history
        times = (out.build_seconds, out.solve_seconds)
        if screen:
            Z4 = screen_zero_groups(problem, Z4, V)
    cert = certify_canonical(problem, Z4, V, tol)
    V_out = cert.V[:, 0] if program.number == 8 else cert.V
    return SolveResult(program=program.number, loss=problem.loss.name, form=form, solver=solver,
                       beta=problem.beta, Z=program.from_canonical(Z4), V=V_out, status=status,
                       certificate=cert, build_seconds=times[0], solve_seconds=times[1],
                       iterations=iterations, U1=problem.U1, U2=problem.U2, history=history)


def screen_zero_groups(problem, Z4, V=None):
    """Set to zero the groups of ``Z4`` that the gap-safe test proves zero at the optimum."""
    candidates = [dual_feasible_point(problem, problem.residual_dual(Z4))]
    if V is not None:
        candidates.append(dual_feasible_point(problem, V))
    V_best = max(candidates, key=problem.dual_objective)
    gap = problem.primal_objective(Z4) - problem.dual_objective(V_best)
    zero = gap_safe_zero_groups(problem, V_best, gap)
    Z4 = Z4.copy()
    Z4[zero] = 0.0
    return Z4
