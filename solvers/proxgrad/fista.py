"""FISTA: accelerated proximal gradient with backtracking and adaptive restart, on any smooth
representation and any regulariser with a torch prox.

The subproblem's relative duality gap is checked every ``check_every`` iterations and the run
stops at ``tol``; a :class:`Budget` of iterations and seconds is shared by every inner solve.
In a distributed solve every decision is taken from numbers that are the same on every process
(sums over the shards, or replicated iterates); the clock is the one exception, so the processes
agree on it every ``SYNC_EVERY`` iterations.
"""
import math
import time

import torch

from cvxtransformer.core.certificate import relative_gap
from cvxtransformer.core.errors import SolverError

SYNC_EVERY = 10  # iterations between two agreements on the clock (distributed solves)
LIPSCHITZ_DECAY = 0.8  # after a step the curvature decided, L may shrink by this factor (backtracking only raises it)


class Budget:
    """Iterations and seconds left to a solve; shared by every inner solve and checked by every
    loop (iterations, backtracking). ``shards``: the data shards of a distributed solve, whose
    processes must run out of time at the same call (they agree every ``SYNC_EVERY`` calls, which
    every process makes in the same order)."""

    def __init__(self, max_iter, time_limit, shards=None):
        self.iterations = self.calls = 0
        self.max_iter = max_iter
        self.deadline = None if time_limit is None else time.perf_counter() + time_limit
        self.shards = shards
        self.reserve = 0.0  # seconds kept for the work after the loops (the driver's final check): they end earlier

    def local_deadline(self):
        """The deadline for loops whose iterations the processes need not agree on (one process:
        every loop; distributed: None, as a clock read on one process only could split the iterates)."""
        return self.deadline if self.shards is None else None

    def spent(self):
        if self.iterations >= self.max_iter:
            return "max_iter"
        if self.deadline is not None:
            self.calls += 1
            late = time.perf_counter() >= self.deadline - self.reserve
            if self.shards is not None:
                if (self.calls - 1) % SYNC_EVERY:  # calls 1, 1 + SYNC_EVERY, ...
                    return None
                late = self.shards.any_(late)
            if late:
                return "time_limit"
        return None


def overflow(what, value):
    """The error of a step that left float64's range: the data's magnitude is the usual cause."""
    return SolverError(f"solver: fista: {what} is {value} (float64 overflowed); rescale the data (X, y) toward unit "
                       "magnitude, or try --solver clarabel")


def _dot(a, b):
    return float(torch.dot(a.reshape(-1), b.reshape(-1)))


def gap_terms(sm, reg, x, ix, fx, g, state):
    """P(x) and D(s V) of the subproblem at x (float64 floats)."""
    primal = (float(sm.value(x, ix)) if fx is None else fx) + float(reg.value(x))
    gmax = float(reg.dual_norm(g))
    return primal, float(sm.dual_value(state, 1.0 if gmax <= reg.beta else reg.beta / gmax))


def gap_at(sm, reg, x):
    """The image of a point with no image at hand, and P and D of the subproblem there."""
    ix = sm.image(x)
    g, state = sm.grad(x, ix)
    return (ix,) + gap_terms(sm, reg, x, ix, None, g, state)


def fista(sm, x, reg, L, tol, budget, check_every=10, on_check=None, slack=1e-9, stall_checks=30, polish=None,
          floor=math.inf, rounding=0.0, ix=None, first_check=None):
    """Run FISTA on ``sm`` + ``reg`` from ``x`` until the subproblem's relative gap is <= ``tol``.

    Parameters
    ----------
    sm : a smooth representation (:mod:`.smooth`)
    x : tensor in ``sm``'s layout, the starting point
    reg : the regulariser (its torch ``prox``, ``value`` and ``dual_norm``)
    L : float, a starting estimate of the Lipschitz constant of grad f
    tol : relative gap of the subproblem at which to stop
    budget : :class:`Budget`
    on_check : callable(iterations, primal, dual) called at every gap check (progress, history)
    slack : relative slack of the backtracking test (rounding of the working dtype)
    polish : optional :class:`~.newton.Polisher` (the squared loss with the group lasso); an unchecked one's
        polish of a small support ends the run at a check, before its gap, with reason ``"converged"``: the
        caller's certified check judges that point
    floor : relative gap below which a gap that stops decreasing is blamed on the working precision;
        above it slow progress is only slow, and the budget ends the run
    rounding : gap (absolute) at which P's rounding decides, whatever the relative gap (near
        interpolation, p* far below P(0)): such a gap that stops decreasing is a stall too
    ix : ``sm.image(x)`` when already computed (a pass over the data otherwise)
    first_check : None, or the iterations of this run after which the gap is checked once besides every
        ``check_every`` (where a check is cheap and the polish may end the run early)

    Returns
    -------
    x, its image, L, reason: ``"converged"``, ``"stalled"`` (the gap stopped decreasing at this
    precision) or the budget that ran out.
    """
    ix = sm.image(x) if ix is None else ix
    first_check = None if first_check is None else budget.iterations + first_check
    y, iy, t = x, ix, 1.0
    best, stale = math.inf, 0
    if not math.isfinite(L):
        raise overflow("the Lipschitz estimate of the gradient", L)
    L = L if L > 0 else 1.0  # no curvature seen along the gradient: backtracking finds it
    while True:
        reason = budget.spent()
        if reason:
            return x, ix, L, reason
        g, state = sm.grad(y, iy)
        fy = None if sm.quadratic else float(sm.value(y, iy))
        while True:  # backtracking: L grows by 1.25 at least per pass, so it ends, at the latest by overflow
            xn = reg.prox(torch.add(y, g, alpha=-1.0 / L), 1.0 / L)
            ixn = sm.image(xn)
            d = xn - y
            dd = _dot(d, d)
            if not math.isfinite(dd):
                raise overflow("the squared length of a step", dd)
            if dd == 0.0:  # no move: nothing to test (the images may differ by rounding only)
                fxn = None if sm.quadratic else float(sm.value(xn, ixn))
                break
            if sm.quadratic:
                fxn = None
                need = float(sm.curvature(d, ixn, iy))
                ok = need <= L * dd * (1.0 + slack) + 1e-300
            else:
                fxn = float(sm.value(xn, ixn))
                excess = fxn - fy - _dot(g, d)
                need = 2.0 * excess / dd if dd > 0 else 0.0
                ok = excess <= 0.5 * L * dd + slack * abs(fy)
            if ok:
                break
            if not math.isfinite(need):
                raise overflow("the curvature along a step", need)
            L = max(1.1 * need, 1.25 * L)
            if not math.isfinite(L):
                raise overflow("the Lipschitz estimate of the gradient", L)
            reason = budget.spent()
            if reason:
                return x, ix, L, reason
        if not sm.quadratic and dd > 0.0 and 0.5 * L * dd > 100.0 * slack * abs(fy):  # the curvature decided
            L = max(LIPSCHITZ_DECAY * L, 1.1 * need)  # L follows a curvature that fell (near-separable classes)
        budget.iterations += 1
        if budget.iterations % check_every == 0 or budget.iterations == first_check:
            found = None if polish is None or budget.spent() else polish.unchecked(sm, reg, xn)
            if found is not None:  # a small support's polish, which the caller's certified check judges
                return found[0], found[1], L, "converged"
            primal, dual = gap_terms(sm, reg, xn, ixn, fxn, g, state)  # dual point V at y: feasible once scaled
            gap = relative_gap(primal, dual)
            if on_check is not None:
                on_check(budget.iterations, primal, dual)
            if gap <= tol:
                return xn, ixn, L, "converged"
            stale = stale + 1 if (floor > gap or primal - dual <= rounding) and gap > 0.99 * best else 0
            best = min(best, gap)
            if stale >= stall_checks:
                return xn, ixn, L, "stalled"
            if polish is not None and not budget.spent():
                found = polish(sm, reg, xn, primal, gap, tol, on_check, budget.iterations)
                if found is not None and found[3]:
                    return found[0], found[1], L, "converged"
                if found is not None:  # a better point: restart from it
                    xn, ixn = found[0], found[1]
                    x, ix, y, iy, t = xn, ixn, xn, ixn, 1.0
                    continue
        dx = xn - x
        if _dot(d, dx) < 0:  # restart: the momentum points uphill, <y - xn, xn - x> > 0
            t, y, iy = 1.0, xn, ixn
        else:
            t_next = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
            mom = (t - 1.0) / t_next
            y = torch.add(xn, dx, alpha=mom)
            iy = torch.add(ixn, ixn - ix, alpha=mom)
            t = t_next
        x, ix = xn, ixn
