"""Newton polish on a fixed support, for the squared loss in Gram form.

Once proximal gradient has found the support S (the nonzero groups), the optimum restricted
to S minimizes the smooth function

    phi(z) = 1/2 z^T H_SS z - b_S^T z + beta sum_{g in S} ||z_g||,

whose Hessian is ``H_SS + beta blockdiag((I - u_g u_g^T) / ||z_g||)``, ``u_g = z_g / ||z_g||``.
A few damped Newton steps reach it to rounding; whether it is the optimum of the whole problem
is then decided by the certificate (groups off S must satisfy ``||(A^T V)_g|| <= beta``), never
assumed. This replaces the slow tail of accelerated gradient on ill-conditioned data.
"""
import time

import torch

from cvxtransformer.core.certificate import relative_gap

from .fista import gap_at
from .smooth import principal

POLISH_GAP = 1e-2  # relative gap below which a stable support (a larger one) is polished
# A support of at most SMALL_SUPPORT features (in each Newton system) is polished from a gap of SMALL_POLISH_GAP
# when first seen (its Cholesky costs about one iteration's Python-level calls), the groups that a Newton step
# carries through 0 dropped on the way (newton_on_support's drop): the
# support of first order at a gap of a few percent still holds groups that are 0 at the optimum ((8) squared,
# N=1,000, n=8, d=16, 0.1 beta_max: 8 groups at iteration 15 where 3 remain, polished then instead of at 30 once
# stable, 5.9 -> 4.6 ms; at rho=0, 4.2 -> 3.4 ms). Not from a larger gap: Newton on a support far from the
# optimum's runs to its iteration limit (5 groups of 3 at 0.2 gap: 5 ms at N=1,000).
SMALL_SUPPORT, SMALL_POLISH_GAP = 256, 0.05
# The polish takes POLISH_ITERATIONS Newton steps at most (a support that is not the optimum's fails only when a
# group leaves it, after every step; from a gap below 0.05 a right one takes 2 to 5, to rounding: the gap of the
# scaled residual is about the square root of what is left, so no earlier stop); each step on a large support is
# a Cholesky factorisation, float32 refined once in float64 ((12) squared, N=20,000, 8 gates, 0.01 beta_max,
# 976 features: a polish 121 -> 10 ms, one on a support not yet the optimum's 208 -> 97 ms).
POLISH_ITERATIONS = 8
MAX_FEATURES = 1536  # largest support (features) polished: one Cholesky costs F_S^3 / 3
ROUNDED_DECREMENT = 1e-10  # relative Newton decrement below which phi's rounding may hide any decrease


def _factor(H, blocks, dtype):
    """Cholesky factor of ``H + blockdiag(blocks)`` (``blocks`` (m, d, d)) in ``dtype``, and its info."""
    m, d = blocks.shape[:2]
    hess = H.to(dtype, copy=True)
    hess.view(m, d, m, d).diagonal(dim1=0, dim2=2).add_(blocks.permute(1, 2, 0).to(dtype))
    return torch.linalg.cholesky_ex(hess)


def newton_on_support(H, b, z, beta, iterations=20, stop=0.0, deadline=None, factor=None, drop=False):
    """Minimize phi over the support; ``z`` (m, d) has nonzero rows, ``H`` (m*d, m*d), ``b`` (m*d,).

    Stops at rounding, or after the step whose Newton decrement ``grad^T hess^-1 grad`` (about twice
    ``phi(z) - min phi`` before it) was ``<= stop``: the step itself leaves a gap of the order of
    its square; or at ``deadline`` (``time.perf_counter()``), with the point reached.

    ``factor``: the precision of the Cholesky factorisation (default H's). A lower one (float32:
    twice the speed) is followed by one step of iterative refinement in H's precision, and falls
    back to H's where the Hessian is not positive definite in it; phi, its gradient and the line
    search keep H's precision, so only the step is inexact (the rate of an inexact Newton method).

    ``drop``: the groups that the full Newton step carries through 0 (``<z_g + step_g, z_g> < 0``) leave the
    support (their rows set to 0), and Newton goes on with the others from the point reached: a support found
    early by first order, still holding groups that are 0 at the optimum, is then polished all the same (an
    active-set method without additions: a group dropped wrongly makes the point the optimum of a smaller
    support, which the caller's certificate judges, as it judges every point; the Polisher keeps it only where
    it lowers P, and first order brings the group back). Measured on (8) squared, N=1,000, 0.1 beta_max, six
    seeds: this rule 4.6-5.1 ms at rho=0.8, against 4.9-5.9 ms dropping only the groups whose 0 satisfies their
    KKT condition given the others (a group that does not stops the polish or forces a line search through a
    kink) and 5.8-5.9 ms without drops (the support polished once stable).

    Returns the new (m, d) rows, or None when a group would leave the support (the support was
    not the optimal one; with ``drop``, when no group is left) or the Hessian is not positive definite.
    """
    if not drop:
        return _newton(H, b, z, beta, iterations, stop, deadline, factor, False)
    d, alive, rows = z.shape[1], torch.arange(z.shape[0], device=z.device), z
    while len(alive):
        idx = (alive[:, None] * d + torch.arange(d, device=z.device)).reshape(-1)
        found = _newton(principal(H, idx), b.index_select(0, idx), rows, beta, iterations, stop, deadline, factor, True)
        if not isinstance(found, tuple):
            return None if found is None else torch.zeros_like(z).index_copy_(0, alive, found)
        leaving, rows = found  # on from the point reached, without the groups that leave
        alive, rows = alive[~leaving], rows[~leaving]
    return None


def _newton(H, b, z, beta, iterations, stop, deadline, factor, crossing):
    """:func:`newton_on_support`'s iterations; ``crossing``: where the full step carries groups through 0,
    return ``(leaving, z)`` (those groups, a boolean mask, and the point reached) instead of stepping."""
    m, d = z.shape
    eye = torch.eye(d, dtype=z.dtype, device=z.device)
    low = factor is not None and factor != H.dtype
    Hz = H @ z.reshape(-1)  # follows the steps: phi along a step is a quadratic in t plus the norms
    norm_sum = float(torch.linalg.vector_norm(z, dim=-1).sum())
    value = float(0.5 * z.reshape(-1) @ Hz - b @ z.reshape(-1)) + beta * norm_sum
    for _ in range(iterations):
        if deadline is not None and time.perf_counter() >= deadline:
            return z
        norms = torch.linalg.vector_norm(z, dim=-1, keepdim=True)
        u = z / norms
        smooth_grad = Hz - b
        grad = smooth_grad + beta * u.reshape(-1)
        blocks = beta * (eye - u[:, :, None] * u[:, None, :]) / norms[:, :, None]
        if low:
            chol, info = _factor(H, blocks, factor)
            low = int(info) == 0
        if not low:
            chol, info = _factor(H, blocks, H.dtype)
            if int(info) != 0:
                return None
        step = -torch.cholesky_solve(grad.to(chol.dtype)[:, None], chol)[:, 0].to(H.dtype)
        if low:  # one step of iterative refinement in H's precision
            residual = grad + H @ step + torch.einsum("gij,gj->gi", blocks, step.view(m, d)).reshape(-1)
            step = step - torch.cholesky_solve(residual.to(chol.dtype)[:, None], chol)[:, 0].to(H.dtype)
        decrease = float(grad @ step)
        if -decrease <= 1e-15 * max(1.0, abs(value)):
            return z
        step = step.view(m, d)
        if crossing:  # the groups the full step carries through 0 leave
            leaving = torch.sum((z + step) * z, dim=-1) < 0
            if bool(leaving.any()):
                return leaving, z
        Hs = H @ step.reshape(-1)
        linear, curvature = float(smooth_grad @ step.reshape(-1)), float(step.reshape(-1) @ Hs)
        t = 1.0
        while t > 1e-4:
            trial = z + t * step
            trial_norms = torch.linalg.vector_norm(trial, dim=-1)
            if bool((trial_norms > 0).all()):
                trial_sum = float(trial_norms.sum())
                change = t * linear + 0.5 * t * t * curvature + beta * (trial_sum - norm_sum)  # phi(trial) - phi(z)
                if change <= 1e-4 * t * decrease:
                    break
            t *= 0.5
        else:  # no decrease: a decrement at phi's rounding is convergence, a larger one a failed support
            return z if -decrease <= ROUNDED_DECREMENT * max(1.0, abs(value)) else None
        z, value, norm_sum, Hz = trial, value + change, trial_sum, Hz + t * Hs
        if -decrease <= stop:
            return z
    return z


def polish(sm, x, beta, stop=0.0, max_features=MAX_FEATURES, iterations=20, deadline=None, factor=None,
           work=torch.float64, drop=False):
    """Newton polish of every output of an iterate ``x`` (in ``sm``'s layout) on its support.

    ``sm`` offers ``support_system(J, K)``: the Gram matrix (F', F') and ``A^T T`` (c, F') of the
    program restricted to its gates J and tokens K (local indices), features ordered (j, k, e).
    ``stop``: the Newton decrement at which each output's solve may stop (:func:`newton_on_support`);
    ``max_features``: the largest support polished; ``iterations``: Newton iterations at most, until
    ``deadline``; ``factor``: the precision of the factorisations (:func:`newton_on_support`); ``work``:
    the precision of the Newton iteration itself (phi, its gradient, the line search).
    Returns the polished iterate, or None (support too large, a failed Newton solve, or no
    Gram form of the loss).
    """
    if getattr(sm, "coupled", False):
        return _polish_coupled(sm, x, beta, stop, max_features, iterations, deadline, factor, work)
    x4 = sm.to_canonical(x)  # (|J|, c, |K|, d)
    hJ, c, nK, d = x4.shape
    nz = torch.linalg.vector_norm(x4, dim=-1) > 0  # (|J|, c, |K|)
    J = torch.nonzero(nz.any(dim=(1, 2))).flatten()
    K = torch.nonzero(nz.any(dim=(0, 1))).flatten()
    if len(J) == 0 or len(J) * len(K) * d > max_features:
        return None
    system = sm.support_system(J, K)
    if system is None:
        return None
    H, B = system
    sub = x4.index_select(0, J).index_select(2, K)  # (J', c, K', d)
    out = torch.zeros(c, len(J) * len(K), d, dtype=x.dtype, device=x.device)
    arange = torch.arange(d, device=x.device)
    for l in range(c):
        groups = sub[:, l].reshape(-1, d)  # (J' K', d), order (j, k)
        S = torch.nonzero(torch.linalg.vector_norm(groups, dim=-1) > 0).flatten()
        if len(S) == 0:
            continue
        idx = (S[:, None] * d + arange[None, :]).reshape(-1)
        z = newton_on_support(principal(H, idx).to(work), B[l].index_select(0, idx).to(work), groups[S].to(work), beta,
                              iterations, stop, deadline, factor, drop)
        if z is None:
            return None
        out[l, S] = z.to(x.dtype)
    out = out.view(c, len(J), len(K), d).transpose(0, 1)
    full = torch.zeros_like(x4)
    blockJ = torch.zeros(hJ, c, len(K), d, dtype=x.dtype, device=x.device).index_copy_(0, J, out)
    return sm.from_canonical(full.index_copy_(2, K, blockJ))


def _polish_coupled(sm, x, beta, stop, max_features, iterations, deadline, factor, work):
    """:func:`polish` when the Gram matrix couples the outputs: one Newton system over the nonzero
    groups of every output (``sm.H`` is (cF, cF), ``x`` in ``sm``'s layout (c, |J|, |K|, d))."""
    d = x.shape[-1]
    groups = x.reshape(-1, d)
    S = torch.nonzero(torch.linalg.vector_norm(groups, dim=-1) > 0).flatten()
    if len(S) == 0 or len(S) * d > max_features:
        return None
    idx = (S[:, None] * d + torch.arange(d, device=x.device)[None, :]).reshape(-1)
    z = newton_on_support(principal(sm.H, idx).to(work), sm.B.reshape(-1).index_select(0, idx).to(work),
                          groups[S].to(work), beta,
                          iterations, stop, deadline, factor)
    if z is None:
        return None
    return torch.zeros_like(groups).index_copy_(0, S, z.to(x.dtype)).view_as(x)


class Polisher:
    """Newton polish of a FISTA iterate once its support is stable (checked at every gap check).

    Each support is polished once; the polished point is kept only if it lowers P.
    ``__call__`` returns None or ``(x, image, primal, certified)``.
    """

    def __init__(self, deadline=None):
        self.tried, self.last_support, self.deadline = set(), None, deadline

    def __call__(self, sm, reg, x, primal, gap, tol, on_check, iteration):
        support = torch.linalg.vector_norm(x, dim=-1) > 0
        key = support.cpu().numpy().tobytes()
        stable = self.last_support is not None and torch.equal(support, self.last_support)
        self.last_support = support
        # the largest Newton system: each output's own (layout (c, |J|, |K|, d)), or all of them where H couples them
        size = int(support.sum()) if getattr(sm, "coupled", True) else int(support.flatten(1).sum(1).max())
        small = size * x.shape[-1] <= SMALL_SUPPORT  # a Cholesky of at most this size costs little
        # a small support is polished when first seen, the groups that leave it dropped on the way; a large one
        # once stable (each Newton step a Cholesky of its size)
        if gap >= (SMALL_POLISH_GAP if small else POLISH_GAP) or not (stable or small) or key in self.tried:
            return None
        self.tried.add(key)
        # a small system is factored in float64 at once: float32 saves nothing there, its refinement costs calls
        xc = polish(sm, x, reg.beta, iterations=POLISH_ITERATIONS, deadline=self.deadline,
                    factor=None if small else torch.float32, drop=True)
        if xc is None:
            return None
        ixc, pc, dc = gap_at(sm, reg, xc)
        if on_check is not None:
            on_check(iteration, pc, dc)
        if pc >= primal:
            return None
        return xc, ixc, pc, relative_gap(pc, dc) <= tol
