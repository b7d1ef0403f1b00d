"""The unfolded transformer: a torch module whose layers are descent steps on one energy.

Every layer applies the same (tied) symmetric weights, so the layers are the iterations of one
optimization of (Sections 3-5 of paper 004)

    E(Y) = E1(Y Wa) + E2(Y) [+ phi(Y)],   E1 with rho(z) = -exp(-z), R = lam/2 ||(Y - X) Wa||^2,

and one layer is (15)-(16) [-(17)]:

    U = MM step of E1 at Y        (lam = 0: U = softmax_beta(Y Wa^s Y^T) Y, exactly (15))
    Y+ = U Wf^s                   Wf^s = (1 - alpha2) I - alpha2 (Wf + Wf^T)/2     (16)
    Y+ = ReLU(Y+)                 with relu=True                                   (17)

``Wa^s = Wa Wa^T`` and ``sym(Wf)`` are symmetric by construction (Challenge 4 of the paper is
not addressed). With ``anchor="input"`` the anchor ``X`` of ``R`` is the input, which adds a
residual connection to the input to every layer (Section 6).
"""
import math

import torch

from ..core.errors import invalid
from ..core.validation import check_choice, check_int, check_positive
from . import _backend as B
from .energies import energy
from .steps import unfolded_step


class UnfoldedTransformer(torch.nn.Module):
    """``iterations`` layers of (15)-(16)[-(17)] with tied weights ``Wa`` (d, d), ``Wf`` (d, d).

    Input ``X`` of shape (n, d) or (B, n, d); :meth:`forward` returns ``Y^T`` of the same shape.

    Parameters
    ----------
    dim : d, the token dimension
    iterations : T >= 1, the number of layers
    alpha2 : step size of (16), > 0
    lam : weight of R in E1, >= 0
    anchor : ``"input"`` (R = lam/2 ||(Y - X) Wa||^2 with X the input) or ``None`` (X = 0)
    relu : apply the proximal step (17) after every layer (the input is then ReLU(X))
    scale_a, scale_f : initial ``Wa ~ N(0, scale_a^2 / d)``; ``Wf`` the symmetric part of
        ``N(0, scale_f^2 / d)`` (its eigenvalues lie in about ``[-2 scale_f, 2 scale_f]``)
    seed : seed of the initial weights (the global torch generator is untouched)

    Examples
    --------
    >>> net = UnfoldedTransformer(dim=4, iterations=3, seed=0)
    >>> X = torch.randn(2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    >>> E = net.energies(X)                      # (B, T + 1): E(Y^0), ..., E(Y^T)
    >>> E.shape, bool((E[:, 0] > E[:, -1]).all())
    (torch.Size([2, 4]), True)
    """

    def __init__(self, dim, iterations, alpha2=0.5, lam=1.0, anchor="input", relu=False, scale_a=1.0,
                 scale_f=0.25, seed=0, dtype=torch.float64):
        super().__init__()
        self.dim = check_int("dim", dim, 1)
        self.iterations = check_int("iterations", iterations, 1)
        self.alpha2 = check_positive("alpha2", alpha2)
        self.lam = B.nonneg("lam", lam)
        self.anchor = check_choice("anchor", anchor, ("input", None))
        if not isinstance(relu, bool):
            raise invalid("relu", "True or False", repr(relu))
        self.relu = relu
        scale_a, scale_f = check_positive("scale_a", scale_a), check_positive("scale_f", scale_f)
        gen = torch.Generator().manual_seed(check_int("seed", seed, 0))
        Wa = torch.randn(dim, dim, generator=gen, dtype=dtype) * (scale_a / math.sqrt(dim))
        Wf = torch.randn(dim, dim, generator=gen, dtype=dtype) * (scale_f / math.sqrt(dim))
        self.Wa = torch.nn.Parameter(Wa)
        self.Wf = torch.nn.Parameter(0.5 * (Wf + Wf.T))

    def _start(self, X):
        X = B.tokens("X", X)
        if X.shape[-1] != self.dim:
            raise invalid("X", f"tokens of dimension {self.dim} (shape (n, {self.dim}) or (B, n, {self.dim}))",
                          f"shape {tuple(X.shape)}")
        X = torch.as_tensor(X, dtype=self.Wa.dtype)
        return X.clip(0) if self.relu else X

    def _anchor(self, X):
        return X if self.anchor == "input" and self.lam else None

    def layer(self, Y, X):
        """One layer (15)-(16)[-(17)] from ``Y``, with the anchor taken from the input ``X``."""
        return unfolded_step(Y, self.Wa, self.Wf, self.alpha2, self.lam, self._anchor(X), self.relu)

    def trajectory(self, X):
        """``[Y^0, ..., Y^T]``: the input (``ReLU(X)`` with ``relu``) and every layer's output."""
        Y = self._start(X)
        out = [Y]
        for _ in range(self.iterations):
            out.append(self.layer(out[-1], Y))
        return out

    def forward(self, X):
        return self.trajectory(X)[-1]

    def energy(self, Y, X):
        """``E(Y)`` with this network's weights, for the input ``X`` (the anchor): float or (B,)."""
        X = self._start(X)
        return energy(Y, self.Wa, self.Wf, "exp", self.lam, self._anchor(X), self.relu)

    def energies(self, X):
        """``E(Y^t)`` for t = 0..T: shape (T + 1,) for X (n, d), (B, T + 1) for a batch."""
        X0 = self._start(X)
        values = [torch.as_tensor(self.energy(Y, X0)) for Y in self.trajectory(X)]
        return torch.stack(values, dim=-1)
