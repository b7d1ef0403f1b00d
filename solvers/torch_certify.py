"""Float64 certificate checks for the torch backend (SPEC.md, Certificates), celer-style.

At every check the whole problem is evaluated in float64 at ``x``: ``P(x)``, the dual point
``V = -grad L(A x)`` scaled into the dual feasible set, ``D``, and the gap against the best
dual point seen so far. This is the quantity the verifier recomputes from the returned Z, so
the backend stops exactly when the verifier will certify. Gap-safe screening (the sphere test
of :func:`cvxtransformer.certificate.gap_safe_zero_groups`) discards groups proved zero.
"""
import math
import time
import weakref
from dataclasses import dataclass

import torch

from .torch_losses import torch_loss
from .torch_ops import group_operator_norms, make_data_op

F64 = torch.float64
_OPNORMS = weakref.WeakKeyDictionary()  # Program -> (h, n) tensor of ||A_g||, shared along a path


@dataclass
class Check:
    primal: float
    dual: float
    gap: float
    relative_gap: float
    grad_norms: torch.Tensor  # (h, c, n): ||(A^T V(x))_g||, unscaled, for working sets
    seconds: float


class Certifier:
    """Float64 evaluation of the full problem; keeps the best dual point and the screened groups.

    Parameters
    ----------
    problem : ConvexProblem
    op : DataOp over every gate and token, float64 (the original data)
    T : tensor (N, c) float64, encoded targets
    norms : "exact" or "auto", see :meth:`operator_norms`
    """

    def __init__(self, problem, op, T, norms="auto"):
        self.problem, self.op, self.T = problem, op, T
        self.norms, self.frobenius = norms, None
        self.tloss = torch_loss(problem.loss)
        self.beta = problem.beta
        self.mu = problem.loss.strong_concavity
        h, c, n, _ = problem.program.canonical_shape
        self.dual_best, self.V_best, self.gn_best = -math.inf, None, None
        self.screened = torch.zeros(h, c, n, dtype=torch.bool, device=op.device)

    def forward(self, x4):
        """``A x`` in float64, from the tokens and gates where ``x`` is nonzero only."""
        h, c, n, d = x4.shape
        nz = torch.linalg.vector_norm(x4, dim=-1) > 0  # (h, c, n)
        J = torch.nonzero(nz.any(dim=(1, 2))).flatten()
        K = torch.nonzero(nz.any(dim=(0, 1))).flatten()
        if len(J) == 0:
            return torch.zeros(self.op.N, c, dtype=F64, device=self.op.device)
        if len(J) * len(K) > 0.5 * h * n:
            return self.op.forward(x4)
        sub = make_data_op(self.op.X, self.op.mask, c, J, K, self.op.device, F64)
        return sub.forward(x4.index_select(0, J).index_select(2, K))

    def check(self, x4, Yhat=None):
        """Certify ``x4`` (h, c, n, d) float64; ``Yhat = A x4`` in float64 when already known."""
        t0 = time.perf_counter()
        if Yhat is None:
            Yhat = self.forward(x4)
        V = self.tloss.neg_grad(Yhat, self.T)
        gn = torch.linalg.vector_norm(self.op.adjoint(V), dim=-1)
        gmax = float(torch.max(gn))
        s = 1.0 if gmax <= self.beta else self.beta / gmax
        dual = float(self.tloss.dual_value(V, self.T, s))
        primal = float(self.tloss.value(Yhat, self.T)) + self.beta * float(
            torch.sum(torch.linalg.vector_norm(x4, dim=-1), dtype=F64))
        if dual > self.dual_best:
            self.dual_best, self.V_best, self.gn_best = dual, s * V, s * gn
        gap = primal - self.dual_best
        return Check(primal, self.dual_best, gap, gap / max(1.0, abs(primal)), gn,
                     time.perf_counter() - t0)

    def screen(self, gap):
        """Gap-safe sphere test at the best dual point; returns the number of groups screened."""
        radius = math.sqrt(2.0 * max(gap, 0.0) / self.mu)
        self.screened |= self.gn_best + radius * self.operator_norms()[:, None, :] < self.beta
        return int(self.screened.sum())

    def norms_known(self):
        """Whether exact operator norms will be used (asked for, or cached for this program)."""
        return self.norms == "exact" or self.problem.program in _OPNORMS

    def operator_norms(self):
        """``||A_g||`` per block (h, n): exact (cached per program, e.g. along a path) when
        ``norms="exact"`` or already known, else the cheaper upper bound ``||A_g||_F``."""
        program = self.problem.program
        if program not in _OPNORMS and self.norms == "exact":
            _OPNORMS[program] = group_operator_norms(self.op).cpu()
        if program in _OPNORMS:
            return _OPNORMS[program].to(self.op.device)
        if self.frobenius is None:
            op, acc = self.op, 0.0
            for s, e in op.bounds:
                sq = torch.linalg.vector_norm(op._x(s, e).view(e - s, op.nK, op.d), dim=-1).square_()
                acc = acc + (sq.sum(dim=0)[None] if op.mask is None else op.mask[s:e].T @ sq)
            self.frobenius = torch.sqrt(acc)
        return self.frobenius
