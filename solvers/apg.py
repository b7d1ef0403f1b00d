"""Accelerated proximal gradient (FISTA) with backtracking and adaptive restart.

Minimizes ``f(x) + beta * sum_g ||x_g||`` over one (sub)problem given by a smooth part from
:mod:`solvers.smooth`. The prox is group soft-thresholding. The step ``1/L`` is safe: ``L``
only grows, and a step is accepted only when the quadratic upper bound holds at the new point
(for the squared loss, ``||A d||^2 <= L ||d||^2``, computed from images already at hand).
Momentum restarts when it points against the last step (O'Donoghue & Candes, gradient scheme).

For the squared loss in Gram form, once the support is stable and the gap small, a Newton
polish on the support (:mod:`solvers.newton`) replaces the slow tail of the iterations.

The gap of the subproblem is free: ``P(x)`` from the image of ``x``, and the dual point
``V_y = -grad L(A y)`` whose adjoint ``-grad f(y)`` was computed for the step, scaled into
the dual feasible set.
"""
import math
import time

import torch

from .newton import polish

F64 = torch.float64
POLISH_GAP = 1e-2  # relative gap below which a stable support is polished by Newton (Gram form)


class Budget:
    """Iterations and seconds left to a solve; shared by every inner solve."""

    def __init__(self, max_iter, time_limit):
        self.iterations = 0
        self.max_iter = max_iter
        self.deadline = None if time_limit is None else time.perf_counter() + time_limit

    def spent(self):
        if self.iterations >= self.max_iter:
            return "max_iter"
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return "time_limit"
        return None


def group_shrink(z, threshold):
    """Group soft-thresholding of ``z`` (groups on the last axis), ``threshold > 0``."""
    norms = torch.linalg.vector_norm(z, dim=-1, keepdim=True)
    return z * torch.clamp_min(1.0 - threshold / norms, 0.0)  # norm 0: 1 - inf, clamped to 0


def _dot(a, b):
    return float(torch.dot(a.view(-1), b.view(-1)))


def _gap_terms(sm, x, ix, fx, g, state, beta):
    """P(x), D(s V_y) and the support of x (boolean, groups)."""
    norms = torch.linalg.vector_norm(x, dim=-1)
    primal = (float(sm.value(x, ix)) if fx is None else fx) + beta * float(torch.sum(norms, dtype=F64))
    gmax = float(torch.max(torch.linalg.vector_norm(g, dim=-1)))
    dual = float(sm.dual_value(state, 1.0 if gmax <= beta else beta / gmax))
    return primal, dual, norms > 0


def _polish(sm, x, beta, primal, tol, on_check, iteration):
    """Newton on the support of ``x`` (Gram form): (x, image, primal, certified) if it improves P."""
    xc = polish(sm, x, beta)
    if xc is None:
        return None
    ixc = sm.image(xc)
    gc, state = sm.grad(xc, ixc)
    pc, dc, _ = _gap_terms(sm, xc, ixc, None, gc, state, beta)
    if on_check is not None:
        on_check(iteration, pc, dc)
    if pc >= primal:
        return None
    return xc, ixc, pc, (pc - dc) / max(1.0, abs(pc)) <= tol


def apg(sm, x, beta, L, tol, budget, check_every=10, on_check=None, slack=1e-9, stall_checks=30):
    """Run FISTA on ``sm`` from ``x`` until the relative gap of the subproblem is <= ``tol``.

    Parameters
    ----------
    sm : DataSmooth or GramSmooth
    x : tensor in ``sm``'s layout, the starting point
    beta : float, the group-lasso weight
    L : float, a starting estimate of the Lipschitz constant of grad f
    tol : relative gap of the subproblem at which to stop
    budget : :class:`Budget`
    on_check : callable(iterations, primal, dual) called at every gap check (progress, history)
    slack : relative slack of the backtracking test (rounding of the working dtype)

    Returns
    -------
    x, its image, L, reason: ``"converged"``, ``"stalled"`` (the gap stopped decreasing at this precision)
    or the budget that ran out.
    """
    ix = sm.image(x)
    y, iy, t = x, ix, 1.0
    best, stale = math.inf, 0
    tried, last_support = set(), None  # supports already polished
    while True:
        reason = budget.spent()
        if reason:
            return x, ix, L, reason
        g, state = sm.grad(y, iy)
        fy = None if sm.quadratic else float(sm.value(y, iy))
        while True:
            xn = group_shrink(torch.add(y, g, alpha=-1.0 / L), beta / L)
            ixn = sm.image(xn)
            d = xn - y
            dd = _dot(d, d)
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
            L = max(1.1 * need, 1.25 * L)
        budget.iterations += 1
        if budget.iterations % check_every == 0:
            primal, dual, support = _gap_terms(sm, xn, ixn, fxn, g, state, beta)
            gap = (primal - dual) / max(1.0, abs(primal))
            if on_check is not None:
                on_check(budget.iterations, primal, dual)
            if gap <= tol:
                return xn, ixn, L, "converged"
            stale = stale + 1 if gap > 0.99 * best else 0
            best = min(best, gap)
            if stale >= stall_checks:
                return xn, ixn, L, "stalled"
            key = support.cpu().numpy().tobytes()
            if (gap < POLISH_GAP and last_support is not None and key not in tried
                    and torch.equal(support, last_support) and sm.quadratic):
                tried.add(key)  # a support is polished once
                found = _polish(sm, xn, beta, primal, tol, on_check, budget.iterations)
                if found is not None and found[3]:
                    return found[0], found[1], L, "converged"
                if found is not None:  # a better point: restart from it
                    xn, ixn = found[0], found[1]
                    x, ix, y, iy, t = xn, ixn, xn, ixn, 1.0
                    continue
            last_support = support
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
