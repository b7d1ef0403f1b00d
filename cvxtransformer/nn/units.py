"""What the networks of heads (or hidden units) with weight decay share, whatever their family: the
weights stacked on a first axis of m heads, the penalty ``beta/2`` times the sum of their squares, the
outputs per row of a sample or pooled, and, on fixed gates, each head's gate. The families' networks
(the modules the reductions' ``models`` name) build on :class:`Units` and :class:`GatedUnits`.
"""
import numpy as np
import torch

from ..core.errors import invalid
from ..core.validation import check_int
from .networks import Network, _array, _checked_gate, _tensor


class Units(Network):
    """A network of m heads whose weights (``weight_names``, each stacked on a first axis of m) carry the
    weight decay ``beta/2 sum_k ||W_k||^2``; outputs per row of a sample (``c`` = rows x the outputs of
    a row) or mean-pooled over the rows (``pooled``). ``rows = (name, size, what)`` names the rows in
    messages; :attr:`per_row` is the outputs of a row. ``heads``: m; ``count``: its name ("heads",
    "units")."""

    weight_names = ()

    def __init__(self, n, d, c, heads, pooled, rows, dtype=torch.float64, device="cpu", count="heads"):
        super().__init__(n, d, c, dtype, device)
        self.m = check_int(count, heads, 0)
        self.pooled = bool(pooled)
        name, size, what = rows
        if not self.pooled and c % size:
            raise invalid("c", f"a multiple of {name} = {size} for {what}", repr(c))
        self.per_row = c if self.pooled else c // size

    def _set_parameters(self, **arrays):
        for name, a in arrays.items():
            setattr(self, name, torch.nn.Parameter(_tensor(a, self.dtype, self.device)))

    @property
    def heads(self):
        return getattr(self, self.weight_names[0]).shape[0]

    def penalty(self, beta):
        return 0.5 * beta * sum(torch.sum(getattr(self, k) ** 2) for k in self.weight_names)

    def arrays(self):
        return {k: getattr(self, k).detach().cpu().numpy().astype(float) for k in self.weight_names}

    def weight_shapes(self):
        """The shape of each weight without its first axis (m), in the order of ``weight_names``."""
        raise NotImplementedError

    @torch.no_grad()
    def set_weights(self, *weights):
        """Set the weights (in the order of ``weight_names``, each (m, ...) of :meth:`weight_shapes`)."""
        weights = [_array(w) for w in weights]
        shapes = [(len(weights[0]),) + s for s in self.weight_shapes()] if weights[0].ndim else []
        if [w.shape for w in weights] != shapes:
            wanted = " and ".join("(m, " + ", ".join(map(str, s)) + ")" for s in self.weight_shapes())
            raise invalid(", ".join(self.weight_names), f"shapes {wanted}", " and ".join(str(w.shape) for w in weights))
        self._set_parameters(**dict(zip(self.weight_names, weights)))
        return self


class GatedUnits(Units):
    """:class:`Units` on fixed gates, each head on one (``gate``, ints in [0, P), default ``j mod P``) of a
    gate array (P, ...). ``gating`` says how: ``(name, kind, heads dataclass, masks, sum_units)``: the
    attribute holding the gate array (e.g. ``"H"``) and what it holds (in messages), the reduction's heads
    dataclass (the weights and ``gate``), ``masks(X, gate array)`` (tensors: the gates' masks, an input
    of ``forward``) and ``sum_units(*weights, gate, P)`` (the coefficients the weights implement)."""

    gating = None

    @property
    def gate_array(self):
        return getattr(self, self.gating[0])

    def _set_gate_array(self, array, shape, gate):
        """Check the gate array (P, *shape), P >= 1, keep it, and set each head's gate."""
        name, kind = self.gating[:2]
        array = _array(array)
        if array.shape[1:] != tuple(shape) or array.ndim != 1 + len(shape) or array.shape[0] == 0:
            raise invalid(name, f"{kind} of shape (P, {', '.join(map(str, shape))}), P >= 1", f"shape {array.shape}")
        setattr(self, name, array)
        self._set_gate(gate)

    def _set_gate(self, gate):
        P = len(self.gate_array)
        self.gate = _checked_gate(np.arange(self.heads) % P if gate is None else gate, self.heads, P,
                                  f"{self.gating[1]} of {self.gating[0]}")

    def encode_inputs(self, X):
        (Xt,) = super().encode_inputs(X)
        return Xt, self.gating[3](Xt, torch.as_tensor(self.gate_array, dtype=self.dtype, device=self.device))

    @torch.no_grad()
    def set_weights(self, *weights, gate=None):
        """Set the weights (as :meth:`Units.set_weights`) and each head's gate (m,)."""
        super().set_weights(*weights)
        self._set_gate(gate)
        return self

    def arrays(self):
        return dict(super().arrays(), gate=self.gate.copy())

    def to_weights(self):
        return self.gating[2](**self.arrays())

    @torch.no_grad()
    def effective_coefficients(self):
        """The coefficients Z of the family's program on these gates that this network implements."""
        a = self.arrays()
        return self.gating[4](*(a[k] for k in self.weight_names), a["gate"], len(self.gate_array))
