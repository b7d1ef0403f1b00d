"""Newton polish on a fixed support, for the squared loss in Gram form.

Once proximal gradient has found the support S (the nonzero groups), the optimum restricted
to S minimizes the smooth function

    phi(z) = 1/2 z^T H_SS z - b_S^T z + beta sum_{g in S} ||z_g||,

whose Hessian is ``H_SS + beta blockdiag((I - u_g u_g^T) / ||z_g||)``, ``u_g = z_g / ||z_g||``.
A few damped Newton steps reach it to rounding; whether it is the optimum of the whole problem
is then decided by the certificate (groups off S must satisfy ``||(A^T V)_g|| <= beta``), never
assumed. This replaces the slow tail of accelerated gradient on ill-conditioned data.
"""
import math
import time

import numpy as np
import torch
from scipy.linalg import get_lapack_funcs

from cvxtransformer.core.certificate import relative_gap

from .fista import gap_at
from .smooth import principal

POLISH_GAP = 1e-2  # relative gap below which a stable support (a larger one) is polished
# A support of at most SMALL_SUPPORT features (in each Newton system) is polished when first seen, whatever the gap
# (its Cholesky costs about one iteration's calls), the groups that a Newton step carries through 0 dropped on the
# way (newton_on_support's drop): the support of first order after a few iterations still holds groups that are 0
# at the optimum, and the drops find the optimum's from there ((8) squared, N=1,000, n=8, d=16, 0.1 beta_max, six
# seeds: polished at iteration 2, the first check of a Gram form, at a gap of 0.3 to 0.6, which ends the solve:
# 2.9-3.0 ms of CPU at rho=0.8 where a polish from a gap of 0.05, at iteration 15, took 4.8-5.3 ms; at rho=0,
# 2.6-2.9 ms against 3.7-4.0. N=400, d=6: gaps of 0.9 to 2.6 there, polished at once 2.1 ms, from a gap below 1
# at iteration 5 or 10, 2.3-2.8 ms). A support that is not the optimum's costs a few Newton steps: the
# certificate judges the point, and first order goes on from the better one.
SMALL_SUPPORT, SMALL_POLISH_GAP = 256, math.inf
# The polish takes POLISH_ITERATIONS Newton steps at most (a support that is not the optimum's fails only when a
# group leaves it, after every step; from a gap below 0.05 a right one takes 2 to 5, to rounding: the gap of the
# scaled residual is about the square root of what is left, so no earlier stop); each step on a large support is
# a Cholesky factorisation, float32 refined once in float64 ((12) squared, N=20,000, 8 gates, 0.01 beta_max,
# 976 features: a polish 121 -> 10 ms, one on a support not yet the optimum's 208 -> 97 ms).
POLISH_ITERATIONS = 8
MAX_FEATURES = 1536  # largest support (features) polished: one Cholesky costs F_S^3 / 3
# A full Newton step whose decrement is at most SETTLED (relative to phi) ends the solve: Newton's quadratic rate
# (relative decrements, r_next ~ C r^2: C measured 0.003 to 1.2 on (8) squared, N=1,000, n=8, d=16 at rho 0 and 0.8)
# leaves the next one below phi's rounding (1e-15) for C up to 1e3, so the step that would only find it there, a
# factorisation, is not taken
SETTLED = 1e-9
ROUNDED_DECREMENT = 1e-10  # relative Newton decrement below which phi's rounding may hide any decrease


class _Device:
    """The Newton iteration's array calls on a torch device (a GPU)."""

    zeros_like, einsum = staticmethod(torch.zeros_like), staticmethod(torch.einsum)

    @staticmethod
    def flatnonzero(a):
        return torch.nonzero(a).flatten()

    @staticmethod
    def arange(n, like):
        return torch.arange(n, device=like.device)

    @staticmethod
    def eye(d, like):
        return torch.eye(d, dtype=like.dtype, device=like.device)

    @staticmethod
    def norms(z, keepdim=False):
        return torch.linalg.vector_norm(z, dim=-1, keepdim=keepdim)

    @staticmethod
    def cast(a, dtype):
        return a.to(dtype)

    @staticmethod
    def precision(a):
        return a.dtype

    principal = staticmethod(principal)

    @staticmethod
    def factor(H, blocks, dtype):
        """Cholesky factor of ``H + blockdiag(blocks)`` (``blocks`` (m, d, d)) in ``dtype``, or None where it is not
        positive definite in that precision."""
        m, d = blocks.shape[:2]
        hess = H.to(dtype, copy=True)
        hess.view(m, d, m, d).diagonal(dim1=0, dim2=2).add_(blocks.permute(1, 2, 0).to(dtype))
        chol, info = torch.linalg.cholesky_ex(hess)
        return chol if int(info) == 0 else None

    @staticmethod
    def solve(chol, rhs):
        return torch.cholesky_solve(rhs.to(chol.dtype)[:, None], chol)[:, 0]


class _Host:
    """The same calls in numpy, with LAPACK's (scipy's) Cholesky: on the CPU, where each torch call costs a few
    microseconds more than numpy's (a Newton step makes about 40) and torch's factorisation took 1.4 to 1.7 times
    LAPACK's at every size measured (48 to 2,048 features, float32 and float64, one thread; on two threads 12
    times at 512). One thread, 8 groups of 16 features on 1,000 correlated samples: a Newton solve to rounding
    0.43 ms against 1.0 ms in torch; with drops down to one group, 0.44 ms against 1.6 ms."""

    zeros_like, einsum, flatnonzero = staticmethod(np.zeros_like), staticmethod(np.einsum), staticmethod(np.flatnonzero)

    @staticmethod
    def arange(n, like):
        return np.arange(n)

    @staticmethod
    def eye(d, like):
        return np.eye(d, dtype=like.dtype)

    @staticmethod
    def norms(z, keepdim=False):
        return np.sqrt(np.square(z).sum(-1, keepdims=keepdim))

    @staticmethod
    def cast(a, dtype):
        return a.astype(_NUMPY[dtype], copy=False)

    @staticmethod
    def precision(a):
        return _TORCH[a.dtype]

    @staticmethod
    def principal(H, idx):
        return H if len(idx) == H.shape[0] else H[idx[:, None], idx]

    @staticmethod
    def factor(H, blocks, dtype):
        m, d = blocks.shape[:2]
        hess = H.astype(_NUMPY[dtype], order="C")  # a copy: its transpose is the Fortran array LAPACK factors in place
        i = np.arange(m)
        hess.reshape(m, d, m, d)[i, :, i, :] += blocks
        potrf, = get_lapack_funcs(("potrf",), (hess,))
        chol, info = potrf(hess.T, lower=0, overwrite_a=1, clean=0)  # the upper factor of hess.T = hess
        return chol if info == 0 else None

    @staticmethod
    def solve(chol, rhs):
        potrs, = get_lapack_funcs(("potrs",), (chol,))
        return potrs(chol, rhs.astype(chol.dtype, copy=False), lower=0)[0]


_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}
_TORCH = {np.dtype(v): k for k, v in _NUMPY.items()}


def _host(t):
    """Whether the Newton iteration on tensors like ``t`` runs on the host in numpy (:class:`_Host`): on the CPU."""
    return t.device.type == "cpu"


def newton_on_support(H, b, z, beta, iterations=20, stop=0.0, deadline=None, factor=None, drop=False):
    """Minimize phi over the support; ``z`` (m, d) has nonzero rows, ``H`` (m*d, m*d), ``b`` (m*d,).

    Stops at rounding, or after the step whose Newton decrement ``grad^T hess^-1 grad`` (about twice
    ``phi(z) - min phi`` before it) was ``<= stop``: the step itself leaves a gap of the order of
    its square; or after a full step whose decrement was ``<= SETTLED |phi|`` (the next one would be at
    phi's rounding); or at ``deadline`` (``time.perf_counter()``), with the point reached.

    ``factor``: the precision of the Cholesky factorisation (default H's). A lower one (float32:
    twice the speed) is followed by one step of iterative refinement in H's precision, and falls
    back to H's where the Hessian is not positive definite in it; phi, its gradient and the line
    search keep H's precision, so only the step is inexact (the rate of an inexact Newton method).

    ``drop``: the groups that the full Newton step carries through 0 (``<z_g + step_g, z_g> < 0``) leave the
    support (their rows set to 0), and Newton goes on with the others from the point their full step reaches
    (the larger support's Newton step: closer to the optimum than its start, 1 factorisation fewer on most of
    the six seeds of (8) squared, N=1,000, n=8, d=16; from the point reached where a row would be 0 there): a
    support found early by first order, still holding groups that are 0 at the optimum, is then polished all
    the same (an active-set method without additions: a group dropped wrongly makes the point the optimum of a
    smaller support, which the caller's certificate judges, as it judges every point; the Polisher keeps it
    only where it lowers P, and first order brings the group back). Measured on (8) squared, N=1,000, 0.1 beta_max, six
    seeds: this rule 4.6-5.1 ms at rho=0.8, against 4.9-5.9 ms dropping only the groups whose 0 satisfies their
    KKT condition given the others (a group that does not stops the polish or forces a line search through a
    kink) and 5.8-5.9 ms without drops (the support polished once stable).

    Tensors on the CPU are iterated on as numpy arrays (:class:`_Host`, no copy), on a GPU in torch.
    Returns the new (m, d) rows (a tensor on z's device), or None when a group would leave the support (the
    support was not the optimal one; with ``drop``, when no group is left) or the Hessian is not positive
    definite.
    """
    host = _host(z)
    ops = _Host if host else _Device
    H, b, rows = (H.numpy(), b.numpy(), z.numpy()) if host else (H, b, z)
    out = _on_support(ops, H, b, rows, beta, iterations, stop, deadline, factor, drop)
    return torch.from_numpy(out) if host and out is not None else out


def _on_support(ops, H, b, z, beta, iterations, stop, deadline, factor, drop):
    """:func:`newton_on_support` on ``ops``'s arrays."""
    if not drop:
        return _newton(ops, H, b, z, beta, iterations, stop, deadline, factor, False)
    d, rows = z.shape[1], z
    alive, arange = ops.arange(z.shape[0], z), ops.arange(d, z)
    while len(alive):
        idx = (alive[:, None] * d + arange).reshape(-1)
        found = _newton(ops, ops.principal(H, idx), b[idx], rows, beta, iterations, stop, deadline, factor, True)
        if not isinstance(found, tuple):
            if found is None:
                return None
            out = ops.zeros_like(z)
            out[alive] = found
            return out
        leaving, rows = found  # on from the point reached, without the groups that leave
        alive, rows = alive[~leaving], rows[~leaving]
    return None


def _newton(ops, H, b, z, beta, iterations, stop, deadline, factor, crossing):
    """:func:`newton_on_support`'s iterations on ``ops``'s arrays; ``crossing``: where the full step carries
    groups through 0, return ``(leaving, z)`` (those groups, a boolean mask, and the point reached) instead of
    stepping."""
    m, d = z.shape
    eye = ops.eye(d, z)
    work = ops.precision(H)
    low = factor is not None and factor != work
    Hz = H @ z.reshape(-1)  # follows the steps: phi along a step is a quadratic in t plus the norms
    norms = ops.norms(z, keepdim=True)  # follow the steps too
    norm_sum = float(norms.sum())
    value = float(0.5 * z.reshape(-1) @ Hz - b @ z.reshape(-1)) + beta * norm_sum
    for _ in range(iterations):
        if deadline is not None and time.perf_counter() >= deadline:
            return z
        u = z / norms
        smooth_grad = Hz - b
        grad = smooth_grad + beta * u.reshape(-1)
        blocks = (eye - u[:, :, None] * u[:, None, :]) * (beta / norms[:, :, None])
        chol = ops.factor(H, blocks, factor) if low else None
        low = chol is not None
        if not low:
            chol = ops.factor(H, blocks, work)
            if chol is None:
                return None
        step = -ops.cast(ops.solve(chol, grad), work)
        if low:  # one step of iterative refinement in H's precision
            residual = grad + H @ step + ops.einsum("gij,gj->gi", blocks, step.reshape(m, d)).reshape(-1)
            step = step - ops.cast(ops.solve(chol, residual), work)
        decrease = float(grad @ step)
        if -decrease <= 1e-15 * max(1.0, abs(value)):
            return z
        step = step.reshape(m, d)
        ahead = z + step  # the full step
        if crossing:  # the groups the full step carries through 0 leave
            leaving = (ahead * z).sum(-1) < 0
            if bool(leaving.any()):  # the others go on from their full step (nonzero rows), a step closer than z
                return leaving, ahead if bool((ops.norms(ahead[~leaving]) > 0).all()) else z
        Hs = H @ step.reshape(-1)
        linear, curvature = float(smooth_grad @ step.reshape(-1)), float(step.reshape(-1) @ Hs)
        t = 1.0
        while t > 1e-4:
            trial = ahead if t == 1.0 else z + t * step
            trial_norms = ops.norms(trial, keepdim=True)
            if bool((trial_norms > 0).all()):
                trial_sum = float(trial_norms.sum())
                change = t * linear + 0.5 * t * t * curvature + beta * (trial_sum - norm_sum)  # phi(trial) - phi(z)
                if change <= 1e-4 * t * decrease:
                    break
            t *= 0.5
        else:  # no decrease: a decrement at phi's rounding is convergence, a larger one a failed support
            return z if -decrease <= ROUNDED_DECREMENT * max(1.0, abs(value)) else None
        z, norms, value, norm_sum, Hz = trial, trial_norms, value + change, trial_sum, Hz + t * Hs
        if -decrease <= stop or (t == 1.0 and -decrease <= SETTLED * max(1.0, abs(value))):
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
    host = _host(x)  # on the CPU, in numpy (no copy): the calls of newton_on_support's _Host
    ops = _Host if host else _Device
    x4 = sm.to_canonical(x)
    xs = x4.numpy() if host else x4  # (|J|, c, |K|, d)
    hJ, c, nK, d = xs.shape
    nz = ops.norms(xs) > 0  # (|J|, c, |K|)
    J, K = ops.flatnonzero(nz.any((1, 2))), ops.flatnonzero(nz.any((0, 1)))
    if len(J) == 0 or len(J) * len(K) * d > max_features:
        return None
    system = sm.support_system(*((torch.from_numpy(J), torch.from_numpy(K)) if host else (J, K)))
    if system is None:
        return None
    H, B = (a.numpy() for a in system) if host else system
    sub = xs[J][:, :, K]  # (J', c, K', d)
    out, arange = ops.zeros_like(sub), ops.arange(d, xs)
    for l in range(c):
        groups = sub[:, l].reshape(-1, d)  # (J' K', d), order (j, k)
        S = ops.flatnonzero(ops.norms(groups) > 0)
        if len(S) == 0:
            continue
        idx = (S[:, None] * d + arange).reshape(-1)
        z = _on_support(ops, ops.cast(ops.principal(H, idx), work), ops.cast(B[l][idx], work),
                        ops.cast(groups[S], work), beta, iterations, stop, deadline, factor, drop)
        if z is None:
            return None
        rows = ops.zeros_like(groups)
        rows[S] = ops.cast(z, ops.precision(rows))
        out[:, l] = rows.reshape(len(J), len(K), d)
    full = ops.zeros_like(xs)
    full[J[:, None], :, K[None, :]] = out.swapaxes(1, 2)  # (J', K', c, d): the advanced indices' axes come first
    return sm.from_canonical(torch.from_numpy(full) if host else full)


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

    ``unchecked``: where the caller's certified check costs about what the subproblem's gap does (few samples),
    :meth:`unchecked` polishes a small support at the first check, before that gap, and the point is returned
    without it: the caller's certificate judges it (a polish that was not the optimum costs that check and a
    round, and the support, remembered, is not polished again).
    """

    def __init__(self, deadline=None, unchecked=False):
        self.tried, self.last_support, self.deadline, self.unchecked_first = set(), None, deadline, unchecked

    @staticmethod
    def _support(sm, x):
        """The support of x, its key, and whether its largest Newton system is small."""
        support = torch.linalg.vector_norm(x, dim=-1) > 0
        # the largest Newton system: each output's own (layout (c, |J|, |K|, d)), or all of them where H couples them
        size = int(support.sum()) if getattr(sm, "coupled", True) else int(support.flatten(1).sum(1).max())
        return support, support.cpu().numpy().tobytes(), size * x.shape[-1] <= SMALL_SUPPORT

    def _polish(self, sm, reg, x, small, key):
        self.tried.add(key)
        # a small system is factored in float64 at once: float32 saves nothing there, its refinement costs calls
        return polish(sm, x, reg.beta, iterations=POLISH_ITERATIONS, deadline=self.deadline,
                      factor=None if small else torch.float32, drop=True)

    def unchecked(self, sm, reg, x):
        """``(x, image)`` of the polish of a small support not polished before, or None (an unchecked Polisher only)."""
        if not self.unchecked_first:
            return None
        _, key, small = self._support(sm, x)
        if not small or key in self.tried:
            return None
        xc = self._polish(sm, reg, x, small, key)
        return None if xc is None else (xc, sm.image(xc))

    def __call__(self, sm, reg, x, primal, gap, tol, on_check, iteration):
        support, key, small = self._support(sm, x)
        stable = self.last_support is not None and torch.equal(support, self.last_support)
        self.last_support = support
        # a small support is polished when first seen, the groups that leave it dropped on the way; a large one
        # once stable (each Newton step a Cholesky of its size)
        if gap >= (SMALL_POLISH_GAP if small else POLISH_GAP) or not (stable or small) or key in self.tried:
            return None
        xc = self._polish(sm, reg, x, small, key)
        if xc is None:
            return None
        ixc, pc, dc = gap_at(sm, reg, xc)
        if on_check is not None:
            on_check(iteration, pc, dc)
        if pc >= primal:
            return None
        return xc, ixc, pc, relative_gap(pc, dc) <= tol
