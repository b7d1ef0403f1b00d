"""A program family in a user's own file, on the design base: a bilinear attention readout.

The network: m heads, head j with token weights ``w1_j`` (n), a value vector ``w2_j`` (d) and the output
``out_j`` it feeds, ``yhat_il = sum_{j: out_j = l} w1_j^T X_i w2_j``, with ordinary weight decay
``beta/2 sum_j (||w1_j||^2 + ||w2_j||^2)``. With ``Z_l = sum_{j: out_j = l} w1_j w2_j^T`` (n x d) the outputs
are ``yhat_il = <Z_l, X_i>`` and ``sum_l ||Z_l||_* <= sum_j ||w1_j|| ||w2_j|| <=`` the penalty / beta, with
equality at the heads of the SVD of each ``Z_l`` (balanced: ``w1 = sqrt(s) u``, ``w2 = sqrt(s) v``). So the
convex program

    minimize  sum_i L(yhat_i, y_i) + beta sum_l ||Z_l||_*,      Z of shape (c, n, d)

has the network's optimum once output l has ``rank(Z*_l)`` heads, and bounds it below for any heads.

On :class:`~cvxtransformer.core.design.DesignProgram` the family is its design row (X_i flattened), the
layout of Z (outputs on axis 0) and its reduction; the torch operator, the CVXPY faces, the adjoint and
the block norms are derived. ``register_family`` registers it (the package's entry point of
``cvxtransformer.families`` may name it: then the command line takes ``--program bilinear`` too).

Run: ``python docs/examples/bilinear_family.py``.
"""
from dataclasses import dataclass

import numpy as np
import torch

import cvxtransformer as ct
from cvxtransformer.core.design import DesignProgram
from cvxtransformer.core.reductions import Heads, Reduction, checked_gate, checked_weights, weight_decay_objective
from cvxtransformer.core.registry import register
from cvxtransformer.core.regularizers import NuclearNorm
from cvxtransformer.nn.networks import Network


class BilinearProgram(DesignProgram):
    name, label, support_label = "bilinear", "bilinear readout program", "rank, summed over the outputs"
    regularizer_class = NuclearNorm

    @classmethod
    def build(cls, name, X, y, T):
        return cls(X, T.shape[1])

    def __init__(self, X, c):
        super().__init__(X, shape=(c,) + X.shape[1:], outputs=(0,))  # Z[l] reads output l

    def features(self, X, J=None):  # the design row of sample i: X_i flattened, columns (k, e)
        return X.reshape(len(X), -1)


@dataclass
class BilinearHeads(Heads):
    w1: np.ndarray  # (m, n) token weights
    w2: np.ndarray  # (m, d) value vectors
    out: np.ndarray  # (m,) the output each head feeds
    form: str = "balanced"


class BilinearReduction(Reduction):
    heads = BilinearHeads

    @classmethod
    def invert(cls, problem, Z, form="balanced"):
        cls.check_form(form)
        ranks = problem.regularizer.ranks(Z)
        U, s, Vh = np.linalg.svd(Z, full_matrices=False)
        keep = np.arange(s.shape[1]) < ranks[:, None]
        root = np.sqrt(s[keep])[:, None]
        return BilinearHeads(U.transpose(0, 2, 1)[keep] * root, Vh[keep] * root, np.repeat(np.arange(len(Z)), ranks))

    @classmethod
    def coefficients(cls, problem, heads):
        c, n, d = problem.program.shape
        heads = cls.check_heads(problem, heads, "(w1, w2, out), the heads of the bilinear network,")
        w1, w2 = checked_weights(problem.program.label, {"w1": heads.w1, "w2": heads.w2}, [(-1, n), (-1, d)])
        out = checked_gate(heads.out, len(w1), c, "each head's output", "weights.out")
        Z = np.zeros((c, n, d))
        np.add.at(Z, out, w1[:, :, None] * w2[:, None])
        return Z

    @staticmethod
    def objective(problem, heads):
        Yhat = np.einsum("ikd,jk,jd->ij", problem.program.X, heads.w1, heads.w2) @ np.eye(len(problem.T[0]))[heads.out]
        return weight_decay_objective(problem, Yhat, heads, ("w1", "w2"))


def register_family():
    register("bilinear", BilinearProgram, BilinearReduction, ("squared", "logistic", "cross_entropy"))


class BilinearNetwork(Network):
    """The network as a torch module (``Network``'s interface), for ``ct.compare(..., networks=...)``."""

    def __init__(self, n, d, c, heads, seed=0):
        super().__init__(n, d, c)
        rng = np.random.default_rng(seed)
        self.w1 = torch.nn.Parameter(torch.tensor(rng.standard_normal((heads, n)) / n ** 0.5))
        self.w2 = torch.nn.Parameter(torch.tensor(rng.standard_normal((heads, d)) / d ** 0.5))
        self.out = np.arange(heads) % c

    def forward(self, X):
        return torch.einsum("ikd,jk,jd->ij", X, self.w1, self.w2) @ torch.eye(self.c, dtype=X.dtype)[self.out]

    def penalty(self, beta):
        return beta / 2 * (self.w1.square().sum() + self.w2.square().sum())

    def arrays(self):
        return {"w1": self.w1.detach().numpy().copy(), "w2": self.w2.detach().numpy().copy(), "out": self.out}

    def to_weights(self):
        return BilinearHeads(**self.arrays())


def main(seed=0):
    register_family()
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((80, 5, 3))
    Z0 = np.einsum("lk,le->lke", rng.standard_normal((2, 5)), rng.standard_normal((2, 3)))  # rank one per output
    y = np.einsum("ikd,lkd->il", X, Z0) + 0.1 * rng.standard_normal((80, 2))
    P = ct.make_problem(X, y, program="bilinear", beta=1.0)
    P = P.with_beta(0.2 * P.beta_max())
    results = {f"{s} {f}": ct.solve(P, s, form=f, tol=1e-8)
               for s, f in (("clarabel", "primal"), ("clarabel", "dual"), ("scs", "primal"), ("scs", "dual"),
                            ("fista", "primal"))}
    for name, r in results.items():
        print(f"{name:>16s}: P = {r.certificate.primal_objective:.10f}, relative gap {r.certificate.relative_gap:.1e}, "
              f"ranks {P.regularizer.ranks(r.Z).tolist()}")
    heads = ct.recover_weights(P, results["clarabel primal"].Z)
    network = ct.certify_network(P, heads)
    print(f"{heads.heads} heads recovered: network objective {network.objective:.10f}, certified gap {network.gap:.1e}")
    comparison = ct.compare(P, networks={"bilinear": BilinearNetwork(5, 3, 2, heads=4, seed=seed)}, steps=300)
    for run in comparison.models.values():
        print(f"compare: {run.label}: objective {run.objective:.6f}, certified gap {run.certified_gap:.3g}")
    return dict(X=X, y=y, beta=P.beta, results=results, network=network, comparison=comparison)


if __name__ == "__main__":
    main()
