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

Example: the units recovered from the program's solution make a network that attains the optimum

>>> import numpy as np, cvxtransformer as ct
>>> rng = np.random.default_rng(0)
>>> X = rng.standard_normal((20, 4, 3))
>>> res = ct.solve(P := ct.make_problem(X, X[:, :2, :], program="mixer", beta=1.0, gates=2))
>>> net = GatedMixer.from_weights(ct.recover_weights(P, res.Z), P.program.G, d=3)
>>> objective = net.objective(net.encode_inputs(X), P.T, "squared", 1.0).item()
>>> bool(abs(objective - res.certificate.primal_objective) < 1e-8)
True
"""
import math

import numpy as np
import torch

from ..core.mixer import MixerReduction, MixerUnits, channel_gates
from .units import GatedUnits, Units


class ReluMixer(Units):
    """The token-mixing MLP with a ReLU and ``m`` hidden units (module docstring).

    Parameters
    ----------
    n, d : tokens and channels of the inputs
    c : outputs of the encoded targets: ``n_out d`` per channel, or ``n_out`` (``pooled``)
    units : the number m of hidden units
    pooled : mean-pool the outputs over the channels (one target per sequence)
    """

    name = "relu_mixer"
    weight_names = ("w1", "w2")

    def __init__(self, n, d, c, units, pooled=False, seed=0, init_scale=1.0, dtype=torch.float64, device="cpu"):
        super().__init__(n, d, c, units, pooled, ("d", d, "per-channel targets"), dtype, device, count="units")
        self.n_out = self.per_row
        rng = np.random.default_rng(seed)
        w1 = init_scale * rng.standard_normal((self.m, n)) / math.sqrt(n)
        w2 = init_scale * rng.standard_normal((self.m, self.n_out)) / math.sqrt(max(self.m, 1))
        self._set_parameters(w1=w1, w2=w2)

    def _mix(self, scores):
        """Outputs from the units' gated scores (N, m, d)."""
        out = torch.einsum("ija,jo->ioa", scores, self.w2)
        return out.mean(dim=2) if self.pooled else out.reshape(out.shape[0], -1)

    def scores(self, X):
        """``w1_j^T x_ia`` of shape (N, m, d)."""
        return torch.einsum("jt,ita->ija", self.w1, X)

    def forward(self, X):
        return self._mix(torch.relu(self.scores(X)))

    def weight_shapes(self):
        return [(self.n,), (self.n_out,)]

    def effective_coefficients(self):
        raise TypeError("relu_mixer: no convex program has coefficients for it (its gates move with w1)")


class GatedMixer(GatedUnits, ReluMixer):
    """The token-mixing MLP with fixed gates: unit j on gate ``gate[j]`` of ``G`` (P, n) (default
    ``j mod P``). The "mixer" program on the same gates is its convex equivalent."""

    name = "mixer"
    gating = ("G", "gate vectors", MixerUnits, channel_gates, MixerReduction.sum_units)

    def __init__(self, n, d, c, units, G, gate=None, pooled=False, seed=0, **options):
        """``options``: ``init_scale``, ``dtype``, ``device``, as :class:`ReluMixer`."""
        super().__init__(n, d, c, units, pooled, seed, **options)
        self._set_gate_array(G, (n,), gate)

    def forward(self, X, D):
        return self._mix(self.scores(X) * D[:, self.gate, :])

    @classmethod
    def from_weights(cls, units, G, d, pooled=False, **kwargs):
        """The network of :class:`~cvxtransformer.core.mixer.MixerUnits` (e.g. recovered from the program)
        on inputs of d channels."""
        n, n_out = units.w1.shape[1], units.w2.shape[1]
        return cls(n, d, n_out if pooled else n_out * d, 0, G, pooled=pooled, **kwargs).set_weights(
            units.w1, units.w2, gate=units.gate)


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
