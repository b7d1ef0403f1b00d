"""CVXPY backends: program (8)/(10)/(12) or its dual, solved with Clarabel or SCS."""
import time

import cvxpy as cp

from cvxtransformer.cvx import BUILDERS
from cvxtransformer.errors import MissingDependencyError, SolverError

from . import BackendOutput

INSTALL = {"CLARABEL": "pip install clarabel", "SCS": "pip install scs"}


def _settings(name, tol, options):
    """Solver tolerances tight enough for a certified relative gap of ``tol`` (overridable)."""
    if name == "CLARABEL":
        eps = min(1e-9, 1e-2 * tol)
        settings = dict(tol_gap_abs=eps, tol_gap_rel=eps, tol_feas=eps, tol_ktratio=1e-7,
                        max_iter=500)
    else:
        eps = min(1e-6, 1e-2 * tol)
        settings = dict(eps_abs=eps, eps_rel=eps, max_iters=200_000)
    settings.update(options)
    return settings


def _solve(name, problem, form, tol, verbose, **options):
    if name not in cp.installed_solvers():
        raise MissingDependencyError(f"solver: {name.lower()} is not installed; {INSTALL[name]}")
    t0 = time.perf_counter()
    built = BUILDERS[form](problem)
    t1 = time.perf_counter()
    try:
        built.problem.solve(solver=name, verbose=verbose, **_settings(name, tol, options))
    except cp.error.SolverError as exc:
        raise SolverError(f"solver: {name.lower()} failed on the {form} of program "
                          f"({problem.program.number}) ({exc}); try the other solver, "
                          "a larger beta, or rescaled data") from None
    t2 = time.perf_counter()
    status = built.problem.status
    if status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE, cp.USER_LIMIT):
        raise SolverError(f"solver: {name.lower()} returned status {status!r} on the {form} of "
                          f"program ({problem.program.number}); try the other solver")
    try:
        Z4, V = built.extract_Z(), built.extract_V()
    except (TypeError, AttributeError):
        raise SolverError(f"solver: {name.lower()} returned no solution (status {status!r}); "
                          "try the other solver") from None
    stats = built.problem.solver_stats
    return BackendOutput(Z4=Z4, V=V, status=status, build_seconds=t1 - t0, solve_seconds=t2 - t1,
                         iterations=getattr(stats, "num_iters", None))


def solve_clarabel(problem, form="primal", tol=1e-8, verbose=False, **options):
    """Solve with Clarabel (interior point); ``options`` are Clarabel settings."""
    return _solve("CLARABEL", problem, form, tol, verbose, **options)


def solve_scs(problem, form="primal", tol=1e-4, verbose=False, **options):
    """Solve with SCS (operator splitting); ``options`` are SCS settings."""
    return _solve("SCS", problem, form, tol, verbose, **options)
