"""A program family defined and registered in a user's own file: program (8) with a weight per token
in the regulariser,

    minimize  sum_i L(yhat_i, y_i) + beta * sum_k w_k ||Z_k||,    yhat_i = sum_k <Z_k, X_ik>,

solved with Clarabel and the torch backend, certified, its network recovered and certified, and compared
with networks (9) and (3) trained by Adam (``ct.compare``: the family joins them as program (8) does).

The weights enter by a change of variables, so every existing face is reused exactly: with
``Z'_k = w_k Z_k`` and ``X'_ik = X_ik / w_k`` the program is program (8) on X' with the plain group
lasso (``<Z'_k, X'_ik> = <Z_k, X_ik>`` and ``||Z'_k|| = w_k ||Z_k||``); the solution in the user's
coordinates is ``Z_k = Z'_k / w_k``, and the recovered heads are those of network (9) on X'. The
class below only builds the program from the data (``build``, ``on``) and names itself; ``register``
checks it against the contract (docs/architecture.md).

Run: ``python docs/examples/custom_family.py``.
"""
import numpy as np

import cvxtransformer as ct
from cvxtransformer.core.attention import AttentionProgram, Proposition1
from cvxtransformer.core.registry import register

NAME = "token_weighted"


def token_weighted_family(weights):
    """A program class for per-token weights ``weights`` (n,), all > 0, registered as :data:`NAME`."""
    weights = np.asarray(weights, dtype=float)

    class TokenWeighted(AttentionProgram):
        label = "program (8) with token weights"

        @classmethod
        def check_targets(cls, name, y):
            super().check_targets(8, y)  # one output per sample, as program (8)

        @classmethod
        def build(cls, name, X, y, T):
            return cls(X, T.shape[1])

        def __init__(self, X, n_outputs):
            super().__init__(8, np.asarray(X, dtype=float) / weights[None, :, None], n_outputs)
            self.name = NAME

        def on(self, X):
            return TokenWeighted(X, self.c)

    register(NAME, TokenWeighted, Proposition1, ("squared", "logistic"))
    return TokenWeighted


def main(seed=0):
    rng = np.random.default_rng(seed)
    N, n, d = 60, 4, 3
    X = rng.standard_normal((N, n, d))
    y = X[:, 0, 0] - 0.5 * X[:, 2, 1] + 0.1 * rng.standard_normal(N)
    weights = np.array([1.0, 4.0, 0.5, 2.0])
    token_weighted_family(weights)

    P = ct.make_problem(X, y, program=NAME, loss="squared", beta=1.0)
    P = P.with_beta(0.2 * P.beta_max())
    results = {solver: ct.solve(P, solver, tol=1e-8) for solver in ("clarabel", "fista")}
    for solver, result in results.items():
        c = result.certificate
        print(f"{solver:>8s}: P = {c.primal_objective:.10f}  D = {c.dual_objective:.10f}  "
              f"relative gap {c.relative_gap:.1e}  certified {c.certified}")
    Zp = results["clarabel"].Z
    again = ct.certify(P, Zp)  # the verifier, from Z alone
    heads = ct.recover_weights(P, Zp)
    network = ct.certify_network(P, heads)
    Z = Zp / weights[:, None]  # the user's coordinates
    print(f"certify: relative gap {again.relative_gap:.1e}; {heads.heads} heads recovered; network objective "
          f"{network.objective:.10f}, certified gap to the global optimum {network.gap:.1e}")
    print("token norms ||Z_k||:", np.round(np.linalg.norm(Z, axis=1), 6))
    comparison = ct.compare(P, steps=300, seed=seed)  # networks (9) and (3) on X', by Adam
    for run in comparison.models.values():
        gap = "not bounded" if run.certified_gap is None else f"certified gap {run.certified_gap:.3g}"
        print(f"compare: {run.label}: objective {run.objective:.6f}, {gap}")
    return dict(X=X, y=y, weights=weights, beta=P.beta, Z=Z, results=results, certificate=again,
                network=network, comparison=comparison)


if __name__ == "__main__":
    main()
