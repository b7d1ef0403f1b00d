"""Float64 certificate checks for the torch backend (docs/conventions.md, Certificates), celer-style.

At every check the whole problem is evaluated in float64 at ``x`` with the verifier's own
function (:func:`cvxtransformer.core.certificate.scaled_residual`): ``P(x)``, the dual point
``V = -grad L(A x)`` scaled into the dual feasible set, ``D``, and the gap against the best dual
point seen so far. This is the quantity the verifier recomputes from the returned Z, so the
backend stops exactly when the verifier will certify.

When the operator streams its data (a memory map, or host memory feeding a GPU), ``yhat``, the
dual point and ``A^T V`` are computed in one pass over the data (``forward_adjoint``): a check costs
one read of the data, as an iteration's adjoint does.

On the CPU in float64 (the program's own operator, not sharded), a check with nothing at hand is the
verifier's :func:`~cvxtransformer.core.certificate.residual_of` itself, on the iterate as numpy: the
verifier remembers it, so ``cvxtransformer.solve``'s certificate of the point returned (the point
checked last) is that computation, not a second one.
"""
import math
import time
from dataclasses import dataclass

import torch

import numpy as np

from cvxtransformer.core.arrays import F64
from cvxtransformer.core.certificate import relative_gap, residual_of, scaled_residual


@dataclass
class CheckResult:
    primal: float
    dual: float
    gap: float
    relative_gap: float
    G: torch.Tensor  # A^T V(x), unscaled, canonical layout: the working set's scores
    seconds: float


class Certifier:
    """Float64 evaluation of the whole problem; keeps the best dual point.

    Parameters
    ----------
    problem : ConvexProblem
    op : the program's float64 torch operator on the solve's device
    T : tensor (N, n_outputs) float64, encoded targets
    """

    def __init__(self, problem, op, T):
        self.problem, self.op, self.T = problem, op, T
        # the verifier's own function (and operator) where it is the same computation
        self.verifier = (op.device.type == "cpu" and op.dtype == F64 and problem.program.shards is None
                         and op is problem.program.operator("cpu", F64) and not getattr(op, "streams", False))
        self.dual_best, self.V_best, self.G_best = -math.inf, None, None
        self.best_is_last = False  # whether the best dual point is the residual of the point checked last

    def check(self, x, Yhat=None, G=None):
        """Certify ``x`` (canonical, float64); ``Yhat = A x`` in float64 when already known. ``G``: x is 0 and ``G``
        the scores ``A^T (-grad L(0))`` that :meth:`~cvxtransformer.core.problem.ConvexProblem.beta_max` computed;
        P(0) and the dual norm of G are then the problem's own (computed with them), and the dual objective at the
        scaled ``V = -grad L(0)`` is the only computation."""
        t0 = time.perf_counter()
        p = self.problem
        forward, adjoint = self.op.forward, self.op.adjoint
        if G is not None:
            V = p.loss.dual_variable(torch.zeros_like(self.T), self.T)
            worst = float(p.beta_max())
            s = p.beta / worst if worst > p.beta else 1.0
            primal, dual = p.loss_at_zero(), p.loss.dual_objective(V, self.T, s)
        elif Yhat is None and self.verifier:  # the verifier's computation (copies: its arrays stay its own)
            primal, V, s, dual, G = residual_of(p, x.numpy().reshape(p.program.shape))
            V, G = torch.from_numpy(np.array(V)), torch.from_numpy(np.array(G)).reshape(x.shape)
        else:
            if Yhat is None and getattr(self.op, "streams", False):
                Yhat, _, G1 = self.op.forward_adjoint(x, lambda Y, s, e: p.loss.dual_variable(Y, self.T[s:e]))
                adjoint = lambda V: G1  # noqa: E731  (V = -grad L(yhat), row by row: the same V)
            primal, V, s, dual, G = scaled_residual(p.loss, p.regularizer, forward, adjoint, self.T, x, Yhat)
        primal, dual = float(primal), float(dual)
        self.best_is_last = dual > self.dual_best
        if self.best_is_last:
            self.dual_best, self.V_best, self.G_best = dual, s * V, s * G
        gap = primal - self.dual_best
        rel = relative_gap(primal, self.dual_best)
        return CheckResult(primal, self.dual_best, gap, rel, G, time.perf_counter() - t0)

    def radius(self, gap):
        """Radius of the gap-safe sphere around the best dual point."""
        return math.sqrt(2.0 * max(gap, 0.0) / self.problem.loss.strong_concavity)
