"""The convex programs (8), (10), (12) (and their weight-decay forms) as a torch module, so that Adam can minimise P(Z) directly.

The paper trains its convex model (10) with the same optimiser as the networks (Adam, from
scratch) as well as exactly. :class:`ConvexAttention` holds the coefficients ``Z`` of a program
in its canonical shape (h, c, n, d) and plugs into :func:`cvxtransformer.nn.trainer.train` like
any network: ``yhat_il = sum_j M_ij <Z[j, l], X_i>`` (``M`` the gate mask of program (12), all
ones for (8)/(10)) and the penalty of the program's regulariser (``beta sum_g ||z_g||_2``, its group lasso,
or a nuclear norm per token), so its
objective is exactly P(Z) of docs/conventions.md and the verifier certifies it like any Z. Adam
sees a subgradient (0 on a zero group); it does not produce exact zeros, the proximal solvers do.

Example
-------
>>> import numpy as np, cvxtransformer as ct
>>> from cvxtransformer.nn.trainer import train
>>> X = np.random.default_rng(0).standard_normal((30, 4, 3))
>>> P = ct.make_problem(X, X[:, 1, :2], program=10, beta=2.0)
>>> run = train(ConvexAttention(P.program), X, P.T, "squared", 2.0, steps=200, lr=0.05)
>>> Z = run.network.arrays()["Z"]
>>> abs(run.objective - P.primal_objective(Z)) < 1e-9 * run.objective
True
"""
import numpy as np
import torch

from ..core.attention import gate_mask
from .networks import Network


class ConvexAttention(Network):
    """Coefficients Z of program (8), (10) or (12) (``program``, an :class:`AttentionProgram`),
    initialised at zero (the objective is convex: the start does not change the optimum).

    Parameters (torch): ``Z`` of shape (h, c, n, d). ``arrays()`` returns ``{"Z": ...}`` in the
    program's own shape; :meth:`effective_coefficients` returns Z (h, c, n, d), as for (9)/(11).
    """

    name = "convex"

    def __init__(self, program, dtype=torch.float64, device="cpu"):
        h, c, n, d = program.canonical_shape
        super().__init__(n, d, c, dtype, device)
        self.program = program
        self.Z = torch.nn.Parameter(torch.zeros(program.canonical_shape, dtype=dtype, device=device))

    @property
    def heads(self):
        """Groups h*c*n: through Proposition 1, Z is a network (9)/(11) with at most this many heads."""
        return self.program.n_blocks

    def encode_inputs(self, X):
        (Xt,) = super().encode_inputs(X)
        U1, U2 = getattr(self.program, "U1", None), getattr(self.program, "U2", None)
        M = np.ones((Xt.shape[0], 1)) if U1 is None else gate_mask(np.asarray(X, dtype=float), U1, U2)
        return Xt, torch.as_tensor(M, dtype=self.dtype, device=self.device)

    def forward(self, X, M):
        return torch.einsum("ij,jlkd,ikd->il", M, self.Z, X)

    def penalty(self, beta):
        return self.program.regularizer_class(beta).value(self.Z)

    def arrays(self):
        return {"Z": self.effective_coefficients().reshape(self.program.shape)}

    @torch.no_grad()
    def effective_coefficients(self):
        """Z of shape (h, c, n, d), an ndarray."""
        return self.Z.detach().cpu().numpy().astype(float)
