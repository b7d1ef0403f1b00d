"""The multi-head self-attention networks of Sahiner et al. (arXiv 2205.08078), as torch modules with the
weight-decay objectives of docs/conventions.md; the programs are in :mod:`cvxtransformer.core.mhsa`.

* :class:`LinearMHSA`, network (5): ``f(X_i) = sum_j X_i W1j X_i^T X_i W2j``,
  penalty ``beta/2 sum_j (||W1j||^2 + ||W2j||^2)``, at every token (sequence targets) or
  mean-pooled; program (6) is its convex equivalent;
* :class:`GatedMHSA`, the gated-ReLU network: the heads of (5), the scores of head j
  masked by the fixed gate ``D_g(j)(X)[t, s] = 1[x_t^T H_g x_s >= 0]``,
  ``f(X_i) = sum_j (D_g(j)(X_i) * (X_i W1j X_i^T)) X_i W2j``; the gated program is its convex
  equivalent;
* :class:`ReluMHSA`, the same heads with a real ReLU on the scores,
  ``f(X_i) = sum_j relu(X_i W1j X_i^T) X_i W2j``: no fixed gate, so no convex program bounds it.

These modules live here, not in the families' core modules, because the networks' base class
(:class:`~.networks.Network`) is a layer above the core.

Example
-------
>>> import numpy as np, cvxtransformer as ct
>>> X = np.random.default_rng(0).standard_normal((20, 3, 2))
>>> P = ct.make_problem(X, X[:, :, :1], program="mhsa", beta=1.0)
>>> res = ct.solve(P)
>>> net = LinearMHSA.from_weights(ct.recover_weights(P, res.Z), n=3)
>>> bool(abs(net.objective(net.encode_inputs(X), P.T, "squared", 1.0).item() - res.certificate.primal_objective) < 1e-8)
True
"""
import math

import numpy as np
import torch

from ..core.mhsa import GatedMHSAHeads, GatedMHSAReduction, LinearMHSAReduction, MHSAHeads, attention_masks
from .units import GatedUnits, Units


class LinearMHSA(Units):
    """Linear multi-head self-attention network (5) of Sahiner et al. with ``m`` heads.

    ``f(X_i) = sum_j X_i W1j X_i^T X_i W2j`` (n x c_token), at every token (sequence targets,
    ``c = n * c_token``, outputs ``(t, l)`` flattened row-major) or mean-pooled over tokens
    (``pooled=True``, ``c = c_token``). Parameters ``W1`` (m, d, d) and ``W2`` (m, d, c_token);
    penalty ``beta/2 sum_j (||W1j||_F^2 + ||W2j||_F^2)``. Program (6) is its convex equivalent:
    P(Z*) is a lower bound on this objective for every m.
    """

    name = "linear_mhsa"
    weight_names = ("W1", "W2")

    def __init__(self, n, d, c, heads, pooled=False, seed=0, init_scale=1.0, dtype=torch.float64, device="cpu"):
        super().__init__(n, d, c, heads, pooled, ("n", n, "sequence targets"), dtype, device)
        self.c_token, m = self.per_row, self.m
        rng = np.random.default_rng(seed)
        self._set_parameters(W1=init_scale * rng.standard_normal((m, d, d)) / d,
                             W2=init_scale * rng.standard_normal((m, d, self.c_token)) / math.sqrt(d * max(m, 1)))

    def forward(self, X):
        G = X.transpose(1, 2) @ X
        out = torch.einsum("ita,jak,ikb,jbc->itc", X, self.W1, G, self.W2)
        return out.mean(dim=1) if self.pooled else out.reshape(X.shape[0], -1)

    def weight_shapes(self):
        return [(self.d, self.d), (self.d, self.c_token)]

    def to_weights(self):
        return MHSAHeads(**self.arrays())

    @classmethod
    def from_weights(cls, heads, n, pooled=False, **kwargs):
        """The network of :class:`MHSAHeads` (e.g. recovered from program (6)) on sequences of n tokens."""
        m, d, c_token = heads.W2.shape
        c = c_token if pooled else n * c_token
        return cls(n, d, c, 0, pooled=pooled, **kwargs).set_weights(heads.W1, heads.W2)

    @torch.no_grad()
    def effective_coefficients(self):
        """The coefficients Z (d^2, d c_token) of program (6) that this network implements:
        ``Z[(k,a), (l,b)] = sum_j W1j[a, k] W2j[l, b]`` (the output equals the program's map at Z,
        and ``beta ||Z||_* <=`` the penalty; :meth:`cvxtransformer.core.mhsa.LinearMHSAReduction.coefficients`)."""
        a = self.arrays()
        return LinearMHSAReduction.sum_heads(a["W1"], a["W2"])


# ----------------------------------------------------------------------------- gated-ReLU and ReLU MHSA
class _ScoredMHSA(LinearMHSA):
    """Heads of (5) whose attention scores ``X_i W1j X_i^T`` pass through a function before they
    weigh the values: ``f(X_i) = sum_j phi_j(X_i W1j X_i^T) X_i W2j``; subclasses set phi."""

    def _attend(self, X, scores):
        """``sum_j scores_j X W2j`` with ``scores`` (N, n, m, n) (query t, head j, key s)."""
        out = torch.einsum("itjs,isl,jlb->itb", scores, X, self.W2)
        return out.mean(dim=1) if self.pooled else out.reshape(X.shape[0], -1)

    def scores(self, X):
        """``(X_i W1j X_i^T)[t, s]`` of shape (N, n, m, n)."""
        return torch.einsum("ita,jak,isk->itjs", X, self.W1, X)


class GatedMHSA(GatedUnits, _ScoredMHSA):
    """Gated-ReLU multi-head self-attention with ``m`` heads, head j on the fixed gate ``gate[j]``.

    ``f(X_i) = sum_j (D_g(j)(X_i) * (X_i W1j X_i^T)) X_i W2j`` with ``D_g(X)[t, s] = 1[x_t^T H_g x_s >= 0]``
    (:func:`cvxtransformer.core.mhsa.attention_masks`); ``H`` (P, d, d): the gates of the gated
    program; ``gate`` (m,) ints in [0, P) (default ``j mod P``). Parameters, outputs and penalty as
    :class:`LinearMHSA`. The gated MHSA program is its convex equivalent: P(Z*) is a lower bound on
    this objective for every m, attained once each gate g holds rank(Z*_g) heads.
    """

    name = "gated_mhsa"
    gating = ("H", "gate matrices", GatedMHSAHeads, attention_masks, GatedMHSAReduction.sum_heads)

    def __init__(self, n, d, c, heads, H, gate=None, pooled=False, seed=0, init_scale=1.0, dtype=torch.float64,
                 device="cpu"):
        super().__init__(n, d, c, heads, pooled, seed, init_scale, dtype, device)
        self._set_gate_array(H, (d, d), gate)

    def forward(self, X, D):
        return self._attend(X, self.scores(X) * D[:, :, self.gate, :])

    @classmethod
    def from_weights(cls, heads, H, n, pooled=False, **kwargs):
        """The network of :class:`GatedMHSAHeads` (e.g. recovered from the gated program) on its gates ``H``."""
        m, d, c_token = heads.W2.shape
        c = c_token if pooled else n * c_token
        return cls(n, d, c, 0, H, pooled=pooled, **kwargs).set_weights(heads.W1, heads.W2, gate=heads.gate)


class ReluMHSA(_ScoredMHSA):
    """Multi-head self-attention with a ReLU on the scores, ``m`` heads:
    ``f(X_i) = sum_j relu(X_i W1j X_i^T) X_i W2j``. Parameters, outputs and penalty as
    :class:`LinearMHSA`. Its masks move with W1, so no convex program of this package bounds it: the
    gated program's optimum on random gates is a comparison point for it, not a bound."""

    name = "relu_mhsa"

    def forward(self, X):
        return self._attend(X, torch.relu(self.scores(X)))

    def effective_coefficients(self):
        raise TypeError("relu_mhsa: no convex program has coefficients for it (its masks move with W1)")


# ----------------------------------------------------------------------------- compare's builders
# (named by the reductions' ``models``: cvxtransformer.core.reductions.Reduction)
def linear_mhsa_model(problem, heads, sequence, seed):
    """Network (5) on the data of ``problem`` for ``compare``."""
    N, n, d = problem.program.X.shape
    return LinearMHSA(n, d, problem.T.shape[1], heads, pooled=not sequence, seed=seed)


def gated_mhsa_model(problem, heads, sequence, seed):
    """The gated MHSA network on the gates of ``problem``'s program, for ``compare`` (``heads`` may carry
    each head's gate: ``heads.gate``)."""
    p = problem.program
    return GatedMHSA(p.n, p.d, problem.T.shape[1], heads, p.H, gate=getattr(heads, "gate", None),
                     pooled=not sequence, seed=seed)


def relu_mhsa_model(problem, heads, sequence, seed):
    """The ReLU MHSA network on the data of ``problem``, for ``compare``."""
    N, n, d = problem.program.X.shape
    return ReluMHSA(n, d, problem.T.shape[1], heads, pooled=not sequence, seed=seed)
