"""The token-mixing networks of the MLP-Mixer layer (Tolstikhin et al., arXiv 2105.01601), as torch modules
with the weight-decay objective of docs/conventions.md (docs/mixer.md).

* :class:`GatedMixer`: m hidden units, unit j with token weights ``w1_j`` (n), output weights ``w2_j``
  (n_out) on the fixed gate ``gate[j]`` (a row of the program's ``G``),
  ``f(X_i)[:, a] = sum_j D_gate(j)(i, a) (w1_j^T x_ia) w2_j``; the "mixer" program
  (:mod:`cvxtransformer.core.mixer`) is its convex equivalent: P(Z*) bounds its objective for every m.
* :class:`ReluMixer`: the same units with a real ReLU, ``f(X_i)[:, a] = sum_j relu(w1_j^T x_ia) w2_j``: the
  gate is the unit's own sign and moves with ``w1_j``, so no convex program bounds it.

Outputs are per channel, ``(N, n_out d)`` ordered (o, a), or mean-pooled over the channels, ``(N, n_out)``;
penalty ``beta/2 sum_j (||w1_j||^2 + ||w2_j||^2)``. These modules live here, not in the family's core
module, because the networks' base class (:class:`~.networks.Network`) is a layer above the core.

Example
-------
>>> import numpy as np, cvxtransformer as ct
>>> X = np.random.default_rng(0).standard_normal((20, 4, 3))
>>> P = ct.make_problem(X, X[:, :2, :], program="mixer", beta=1.0, gates=2)
>>> res = ct.solve(P)
>>> net = GatedMixer.from_weights(ct.recover_weights(P, res.Z), P.program.G, d=3)
>>> bool(abs(net.objective(net.encode_inputs(X), P.T, "squared", 1.0).item() - res.certificate.primal_objective) < 1e-8)
True
"""
import math

import numpy as np
import torch

from ..core.errors import invalid
from ..core.mixer import MixerReduction, MixerUnits, channel_gates
from ..core.validation import check_int
from .networks import Network, _checked_gate, _tensor


class ReluMixer(Network):
    """The token-mixing MLP with a ReLU and ``m`` hidden units (module docstring).

    Parameters
    ----------
    n, d : tokens and channels of the inputs
    c : outputs of the encoded targets: ``n_out d`` per channel, or ``n_out`` (``pooled``)
    units : the number m of hidden units
    pooled : mean-pool the outputs over the channels (one target per sequence)
    """

    name = "relu_mixer"

    def __init__(self, n, d, c, units, pooled=False, seed=0, init_scale=1.0, dtype=torch.float64, device="cpu"):
        super().__init__(n, d, c, dtype, device)
        units = check_int("units", units, 0)
        self.pooled = bool(pooled)
        if not self.pooled and c % d:
            raise invalid("c", f"a multiple of d = {d} for per-channel targets", repr(c))
        self.n_out = c if self.pooled else c // d
        rng = np.random.default_rng(seed)
        w1 = init_scale * rng.standard_normal((units, n)) / math.sqrt(n)
        w2 = init_scale * rng.standard_normal((units, self.n_out)) / math.sqrt(max(units, 1))
        self.w1 = torch.nn.Parameter(_tensor(w1, dtype, device))
        self.w2 = torch.nn.Parameter(_tensor(w2, dtype, device))

    @property
    def heads(self):
        return self.w1.shape[0]

    def _mix(self, scores):
        """Outputs from the units' gated scores (N, m, d)."""
        out = torch.einsum("ija,jo->ioa", scores, self.w2)
        return out.mean(dim=2) if self.pooled else out.reshape(out.shape[0], -1)

    def scores(self, X):
        """``w1_j^T x_ia`` of shape (N, m, d)."""
        return torch.einsum("jt,ita->ija", self.w1, X)

    def forward(self, X):
        return self._mix(torch.relu(self.scores(X)))

    def penalty(self, beta):
        return 0.5 * beta * (torch.sum(self.w1 ** 2) + torch.sum(self.w2 ** 2))

    def arrays(self):
        return {"w1": self.w1.detach().cpu().numpy().astype(float), "w2": self.w2.detach().cpu().numpy().astype(float)}

    def effective_coefficients(self):
        raise TypeError("relu_mixer: no convex program has coefficients for it (its gates move with w1)")


class GatedMixer(ReluMixer):
    """The token-mixing MLP with fixed gates: unit j on gate ``gate[j]`` of ``G`` (P, n) (default
    ``j mod P``). The "mixer" program on the same gates is its convex equivalent."""

    name = "mixer"

    def __init__(self, n, d, c, units, G, gate=None, pooled=False, seed=0, init_scale=1.0, dtype=torch.float64,
                 device="cpu"):
        super().__init__(n, d, c, units, pooled, seed, init_scale, dtype, device)
        G = np.asarray(G, dtype=float)
        if G.ndim != 2 or G.shape[1] != n or G.shape[0] == 0:
            raise invalid("G", f"gate vectors of shape (P, {n}), P >= 1", f"shape {G.shape}")
        self.G = G
        self._set_gate(np.arange(self.heads) % G.shape[0] if gate is None else gate)

    def _set_gate(self, gate):
        self.gate = _checked_gate(gate, self.heads, self.G.shape[0], "gate vectors of G")

    def encode_inputs(self, X):
        (Xt,) = super().encode_inputs(X)
        return Xt, channel_gates(Xt, torch.as_tensor(self.G, dtype=self.dtype, device=self.device))

    def forward(self, X, D):
        return self._mix(self.scores(X) * D[:, self.gate, :])

    def arrays(self):
        return dict(super().arrays(), gate=self.gate.copy())

    def to_weights(self):
        a = self.arrays()
        return MixerUnits(a["w1"], a["w2"], a["gate"])

    @torch.no_grad()
    def set_weights(self, w1, w2, gate=None):
        """Set the units (``w1`` (m, n), ``w2`` (m, n_out)) and their gates (m,)."""
        w1, w2 = np.asarray(w1, dtype=float), np.asarray(w2, dtype=float)
        m = w1.shape[0] if w1.ndim == 2 else -1
        if w1.shape != (m, self.n) or w2.shape != (m, self.n_out):
            raise invalid("w1, w2", f"shapes (m, {self.n}) and (m, {self.n_out})", f"{w1.shape} and {w2.shape}")
        self.w1 = torch.nn.Parameter(_tensor(w1, self.dtype, self.device))
        self.w2 = torch.nn.Parameter(_tensor(w2, self.dtype, self.device))
        self._set_gate(np.arange(m) % self.G.shape[0] if gate is None else gate)
        return self

    @classmethod
    def from_weights(cls, units, G, d, pooled=False, **kwargs):
        """The network of :class:`~cvxtransformer.core.mixer.MixerUnits` (e.g. recovered from the program)
        on inputs of d channels."""
        n, n_out = units.w1.shape[1], units.w2.shape[1]
        return cls(n, d, n_out if pooled else n_out * d, 0, G, pooled=pooled, **kwargs).set_weights(
            units.w1, units.w2, units.gate)

    @torch.no_grad()
    def effective_coefficients(self):
        """The coefficients Z (P, n_out, n) of the program that this network implements
        (:meth:`cvxtransformer.core.mixer.MixerReduction.sum_units`)."""
        a = self.arrays()
        return MixerReduction.sum_units(a["w1"], a["w2"], a["gate"], self.G.shape[0])


# compare's builders (named by MixerReduction.models); per channel or pooled as the program is
def gated_model(problem, heads, sequence, seed):
    """The gated token-mixing network on the gates of ``problem``'s program, for ``compare``."""
    p = problem.program
    return GatedMixer(p.n, p.d, problem.T.shape[1], heads, p.G, gate=getattr(heads, "gate", None), pooled=p.pooled,
                      seed=seed)


def relu_model(problem, heads, sequence, seed):
    """The ReLU token-mixing MLP on the data of ``problem``, for ``compare``."""
    p = problem.program
    return ReluMixer(p.n, p.d, problem.T.shape[1], heads, pooled=p.pooled, seed=seed)
