"""The smooth part ``f(Z) = sum_i L(yhat_i(Z), y_i)`` of a (sub)problem, in two representations.

Both keep, for an iterate ``x``, its *image* (``A x`` from the data, or ``x H`` from the Gram
matrix), so that the image of an extrapolated point is a linear combination of known images
and every iteration of the accelerated proximal gradient needs one product with the data
(or the Gram matrix) forward and one adjoint.

* :class:`DataSmooth`: any loss and any program, from the program's torch operator (chunks of
  samples); the layout is the operator's; the image is ``yhat`` of shape (N, n_outputs).
* :class:`GramSmooth`: a quadratic loss on an operator that offers ``gram`` (programs (8), (10),
  (12)), from ``H = A_l^T A_l`` (F, F) and ``B = A^T T`` (c, F), ``F = |J| |K| d``: an iteration
  costs F^2 c, independent of N; layout ``(c, |J|, |K|, d)`` (groups stay on the last axis). ``H``
  may also couple the outputs, (cF, cF): the Newton model of a loss that is not separable over
  outputs (:mod:`.prox_newton`).

Each offers ``image(x)``, ``grad(y, iy) -> (g, state)`` with ``state`` the dual information at
``y``, ``value(x, ix)`` (float64), ``dual_value(state, s)`` = D(s V_y) (float64) and, for a
quadratic loss, ``curvature(d, ixn, iy) = ||A d||^2`` and ``support_system(J, K)`` (the Gram
matrix of a support, for the Newton polish of :mod:`.newton`).

On a shard of a distributed solve (``op.shards`` set) the sums over samples (``value``,
``dual_value``, ``curvature``, the Lipschitz estimate) are summed over the shards; ``A^T V`` and
Gram matrices are summed by the operator itself.
"""
import torch

from cvxtransformer.core.arrays import F64


class DataSmooth:
    """``f`` from the data: ``image(x) = A x``; ``grad = -A^T V`` with ``V = -grad L``."""

    def __init__(self, op, loss, T, max_gram_work=0.0):
        self.op, self.loss, self.T = op, loss, T
        self.quadratic = loss.quadratic
        self.max_gram_work = max_gram_work  # multiply-adds allowed for a support Gram (polish)
        # on a shard, f(y) rides on the all-reduce of A^T V(y) (the loss of one shard: ShardedLoss.loss)
        fuse = op.shards is not None and not self.quadratic and op.dtype == F64 and hasattr(loss, "shards")
        self._local, self._fy = (loss.loss if fuse else None), None

    def from_canonical(self, x):
        """Canonical coefficients of the operator -> this layout (the same)."""
        return x.contiguous()

    def to_canonical(self, x):
        return x

    def image(self, x):
        return self.op.forward(x)

    def grad(self, y, iy):
        V = self.loss.dual_variable(iy, self.T)
        if self._local is None:
            return self.op.adjoint(V).neg_(), V
        self.op.shards.carry(self._local.value(iy, self.T))
        g = self.op.adjoint(V).neg_()
        self._fy = (iy, self.op.shards.carried)
        return g, V

    def value(self, x, ix):
        if self._fy is not None and self._fy[0] is ix:
            return self._fy[1]
        return self.loss.value(ix, self.T)

    def curvature(self, d, ixn, iy):
        r = (ixn - iy).reshape(-1)
        if self.op.shards is not None:
            return self.op.shards.sum_value(torch.dot(r, r))
        return torch.dot(r, r)

    def dual_value(self, V, s):
        return self.loss.dual_objective(V, self.T, s)

    def support_system(self, J, K):
        """(H, A^T T) of the gates J and tokens K of this op (quadratic loss, operators with a Gram
        matrix, and a support small enough; else None)."""
        if not self.quadratic or not hasattr(self.op, "gram") or \
                self.op.N_total * (len(J) * len(K) * self.op.d) ** 2 > self.max_gram_work:
            return None
        return self.op.restrict(J, K).gram(self.T)

    def lipschitz_guess(self, g):
        """Lower estimate of the Lipschitz constant of grad f: curvature along ``g``."""
        Ag = self.op.forward(g)
        num = torch.sum(Ag * Ag, dtype=F64)
        num = float(num if self.op.shards is None else self.op.shards.sum_value(num))
        den = float(torch.sum(g * g, dtype=F64))
        return self.loss.lipschitz * num / den if den > 0 else 1.0


def principal(H, idx):
    """The rows and columns ``idx`` (increasing) of H: H itself, not a copy, when they are all of them."""
    return H if len(idx) == H.shape[0] else H.index_select(0, idx).index_select(1, idx)


class GramSmooth:
    """``f(x) = 1/2 tt - <B, x> + 1/2 <x, x H>``: the squared loss ``1/2 ||A x - T||^2`` (``tt = ||T||^2``)
    or any convex quadratic ``1/2 ||R x - t||^2`` (``H = R^T R``, ``B = R^T t``, ``tt = ||t||^2``);
    image ``x H`` (c, F). ``H`` (F, F) is shared by the outputs, or (cF, cF) couples them
    (``coupled``: ``x`` is then flattened whole).

    Layout: ``(c, |J|, |K|, d)`` (groups on the last axis, the outputs first: an image is one product), or,
    with ``canonical``, the operator's own ``(|J|, c, |K|, d)`` for a regulariser whose blocks span the
    outputs (a nuclear norm of each token's ``c x d`` matrix); the image then transposes on the way."""

    quadratic = True

    def __init__(self, H, B, tt, hJ, nK, d, canonical=False):
        self.H, self.B, self.tt = H, B, float(tt)
        self.c, self.F = B.shape
        self.coupled = H.shape[0] != self.F
        self.canonical = canonical
        self.shape = (self.c, hJ, nK, d)
        self.B4 = B.view(self.shape).transpose(0, 1) if canonical else B.view(self.shape)

    def from_canonical(self, x4):
        """``(|J|, c, |K|, d) -> (c, |J|, |K|, d)`` (canonical: unchanged)."""
        return x4.contiguous() if self.canonical else x4.transpose(0, 1).contiguous()

    def to_canonical(self, x):
        return x if self.canonical else x.transpose(0, 1)

    def image(self, x):
        if self.canonical:
            return (x.transpose(0, 1).reshape(self.c, -1) @ self.H).view(self.shape).transpose(0, 1)
        return (x.reshape(-1, self.H.shape[0]) @ self.H).view(self.shape)

    def support_system(self, J, K):
        """Rows and columns of H, and columns of B, of the gates J and tokens K."""
        _, hJ, nK, d = self.shape
        idx = ((J[:, None, None] * nK + K[None, :, None]) * d + torch.arange(d, device=J.device)).reshape(-1)
        return principal(self.H, idx), self.B.index_select(1, idx)

    def grad(self, y, iy):
        return iy - self.B4, (y, iy)

    def value(self, x, ix):
        return 0.5 * self.tt - torch.sum(self.B4 * x, dtype=F64) + 0.5 * torch.sum(x * ix, dtype=F64)

    def curvature(self, d, ixn, iy):
        return torch.dot(d.reshape(-1), (ixn - iy).reshape(-1))

    def dual_value(self, state, s):
        """D(s V_y) with ``V_y = T - A y``: ``<V_y, T> = tt - <B, y>``, ``||V_y||^2 = tt - 2<B, y> + <y, y H>``."""
        y, iy = state
        by = torch.sum(self.B4 * y, dtype=F64)
        yHy = torch.sum(y * iy, dtype=F64)
        return s * (self.tt - by) - 0.5 * s * s * (self.tt - 2.0 * by + yHy)

    def lipschitz_guess(self, g, iterations=20):
        """``1.05 lambda_max(H)`` by power iteration, until the estimate moves by less than 1% (backtracking
        guards the rest)."""
        v = torch.randn(1, self.H.shape[0], dtype=self.H.dtype, device=self.H.device,
                        generator=torch.Generator(device=self.H.device).manual_seed(0))
        lam = 0.0
        for _ in range(iterations):
            w = v @ self.H
            lam, last = float(torch.linalg.vector_norm(w)), lam
            if lam == 0.0:
                return 1.0
            if lam - last <= 0.01 * lam:  # ||H v|| only grows along the iteration (v a unit vector)
                break
            v = w / lam
        return 1.05 * lam
