"""Regularization path: any program over a decreasing grid of beta, warm-started.

Each beta is solved by the torch backend (``solver="fista"``, the default) from the solution at the
previous beta (or from scratch by a CVXPY solver, ``solver="clarabel"`` or ``"scs"``, which take no
warm start), with gap-safe screening: blocks whose dual constraint is certified slack by the sphere test
(:func:`cvxtransformer.core.certificate.gap_safe_screen`) are discarded (exactly zero at every
optimum): groups for the group lasso, singular directions (a proved rank bound) for the nuclear
norm. The operator norms the test needs are computed once for the whole path. Every point is
certified by the verifier, as any :func:`cvxtransformer.solve` result.
"""
import sys
import time
from dataclasses import dataclass

import numpy as np

from cvxtransformer.solvers import get_solver

from .core.errors import invalid
from .core.problem import check_problem
from .core.result import SolveResult
from .core.validation import check_array, check_bool, check_fraction, check_int, check_positive
from .solving import solve


@dataclass
class PathPoint:
    """One beta of a path.

    Attributes
    ----------
    beta : the regularization weight
    result : the certified :class:`SolveResult` at this beta
    screened : number of blocks that gap-safe screening discarded (groups, or singular directions)
    screened_mask : boolean array of those blocks (the program's group shape, or one entry per
        singular direction in decreasing order; one row of them per gate for a gated nuclear-norm family)
    n_blocks : total number of blocks (groups h*c*n, or min(d^2, dc) singular directions, P times
        for a gated nuclear-norm family with P gates)
    seconds : wall time of this beta (solve and verification)
    """

    beta: float
    result: SolveResult
    screened: int
    screened_mask: np.ndarray
    n_blocks: int
    seconds: float

    @property
    def relative_gap(self):
        return self.result.certificate.relative_gap

    @property
    def certified(self):
        return self.result.certified

    def summary(self):
        c = self.result.certificate
        return dict(beta=self.beta, relative_gap=c.relative_gap, certified=c.certified,
                    screened=self.screened, n_blocks=self.n_blocks, support=c.support_size,
                    iterations=self.result.iterations, seconds=self.seconds)


MAX_BETAS = 10**6  # the longest grid beta_grid makes (each beta is a solve)


def beta_grid(beta_max, n_betas=10, ratio=1e-2):
    """``n_betas`` values from ``beta_max`` down to ``ratio * beta_max``, geometrically spaced."""
    beta_max = check_positive("beta_max", beta_max)
    n_betas = check_int("n_betas", n_betas, 1, MAX_BETAS)
    ratio = check_fraction("ratio", ratio, "a number in (0, 1): beta_min / beta_max")
    return beta_max * np.geomspace(1.0, ratio, n_betas)


def solve_path(problem, betas=None, n_betas=10, ratio=1e-2, tol=1e-6, progress=False, solver="fista", **options):
    """Solve ``problem`` for every beta of a decreasing grid, warm-started, with screening.

    Parameters
    ----------
    problem : ConvexProblem (its own beta is ignored)
    betas : decreasing positive values; default :func:`beta_grid` (``n_betas`` from beta_max
        down to ``ratio * beta_max``); values are sorted in decreasing order
    tol : relative duality gap certified at every beta (``atol=...`` in ``options``: an absolute gap
        that certifies too, as for :func:`cvxtransformer.solve`)
    progress : print one line per beta (and the backend's progress) on stderr
    solver : "fista" (the torch backend: warm starts, operator norms computed once for the whole path),
        or "clarabel" or "scs" (CVXPY: each beta solved from scratch)
    options : passed to the backend (for fista: device, dtype, max_iter, time_limit, ...); ``max_iter``
        and ``time_limit`` bound each point of the path

    Returns
    -------
    list of :class:`PathPoint`, one per beta, in decreasing order of beta.

    Example
    -------
    >>> import numpy as np, cvxtransformer as ct
    >>> X = np.random.default_rng(0).standard_normal((50, 4, 3))
    >>> P = ct.make_problem(X, X[:, 0, 0], program=8, beta=1.0)
    >>> path = ct.solve_path(P, n_betas=4)
    >>> all(point.certified for point in path)
    True
    """
    beta_max = check_problem(problem).beta_max()
    progress = check_bool("progress", progress)
    takes = get_solver(solver).options  # what the backend takes of the path's own options
    own = {k: v for k, v in (("screen_norms", "exact"), ("progress", progress)) if k in takes}
    if betas is None:
        betas = beta_grid(beta_max, n_betas, ratio)
    betas = check_array("betas", betas, what="a list of numbers > 0", finite=False, nonempty=False).ravel()
    if betas.size == 0 or not np.all(np.isfinite(betas)) or np.any(betas <= 0):
        raise invalid("betas", "a non-empty list of finite numbers > 0", repr(betas.tolist()))
    options = dict(options, **own)
    points, Z = [], None
    for beta in np.sort(betas)[::-1]:
        sub = problem.with_beta(float(beta))
        t0 = time.perf_counter()
        warm = {"init": Z} if "init" in takes else {}
        result = solve(sub, solver=solver, tol=tol, **warm, **options)
        seconds = time.perf_counter() - t0
        mask = result.screened
        points.append(PathPoint(float(beta), result, int(mask.sum()), mask, mask.size, seconds))
        Z = result.Z
        if progress:
            s = points[-1].summary()
            print(f"path beta {beta:.4g} ({beta / beta_max:.3g} beta_max): rel gap {s['relative_gap']:.2e}, "
                  f"screened {s['screened']}/{s['n_blocks']}, support {s['support']}, {seconds:.2f}s", file=sys.stderr)
    return points
