"""The gated-ReLU multi-head self-attention program of Sahiner et al. (docs/gated_mhsa.md,
docs/conventions.md): the nonlinear attention with the ReLU on the scores replaced by fixed gates.

P gate matrices ``H_g`` (d x d); the mask of gate g on sample i is ``D_g(X_i)[t, s] = 1[x_t^T H_g x_s >= 0]``
(query t, key s). With the per-query gated Gram matrices ``G^g_{i,t} = sum_s D_g(X_i)[t, s] x_s x_s^T``
and one ``Z_g`` (d^2, dc) per gate, in the index convention of program (6),

    Yhat_i[t, b] = sum_g sum_{a,k,l} X_i[t, a] G^g_{i,t}[k, l] Z_g[(k,a), (l,b)]
    P(Z)         = sum_i L(Yhat_i, Y_i) + beta sum_g ||Z_g||_*

Z has shape (P, d^2, dc); targets (N, n, c) are per token, all others per sequence through the
mean-pooled output. One gate open everywhere (``H = 0``: ``x_t^T 0 x_s = 0 >= 0``) is program (6).
The program is :class:`~.mhsa.LinearMHSAProgram` with gates: its torch operator is the one of
program (6) with masks (:class:`~.mhsa.MHSAOperator`), its regulariser the same
:class:`~.regularizers.NuclearNorm`, summed over the stack, and its CVXPY faces those of program (6)
with a design of P d^3 columns (gate, k, a, l).

:class:`GatedMHSAReduction` (Sahiner et al.): the gated-ReLU multi-head self-attention network
``sum_j (D_g(j)(X) * (X W1j X^T)) X W2j`` <-> this program: the heads of each ``Z_g``, as for program
(6), on gate g (:class:`GatedMHSAHeads`). This module registers the family; it is built on program
(6)'s module (:mod:`cvxtransformer.core.mhsa`: operator, program, SVD heads), its one dependency on another family.

Example
-------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.standard_normal((4, 3, 2))
>>> H = rng.standard_normal((2, 2, 2))
>>> p = GatedMHSAProgram(X, c=1, pooled=False, H=H)
>>> W1, W2 = rng.standard_normal((2, 2)), rng.standard_normal((2, 1))
>>> Z = np.zeros(p.shape); Z[1] = np.einsum("ak,lb->kalb", W1, W2).reshape(4, 2)   # one head on gate 1
>>> D = (X @ H[1] @ X.transpose(0, 2, 1) >= 0)
>>> bool(np.allclose(p.forward(Z), ((D * (X @ W1 @ X.transpose(0, 2, 1))) @ X @ W2).reshape(4, 3)))
True
"""
from dataclasses import dataclass

import numpy as np
import torch

from .arrays import to_tensor
from .errors import invalid
from .mhsa import (TARGETS, LinearMHSAProgram, MHSAOperator, _mhsa_weights, _svd_heads, _weight_decay_objective,
                   sum_gated_heads)
from .reductions import ALL_LOSSES, Reduction
from .registry import register
from .validation import check_gate_arrays, check_gates_memory, check_int

__all__ = ["GatedMHSAHeads", "GatedMHSAProgram", "GatedMHSAReduction", "attention_masks", "sample_gate_matrices"]


def sample_gate_matrices(gates, d, seed=0):
    """Gate matrices ``H`` of shape (P, d, d), i.i.d. N(0, 1)."""
    return np.random.default_rng(seed).standard_normal((gates, d, d))


def attention_masks(X, H):
    """The masks ``D[i, t, g, s] = 1[x_it^T H_g x_is >= 0]`` of shape (N, n, P, n), in X's dtype, from
    tensors ``X`` (N, n, d) and ``H`` (P, d, d) (ndarrays: float64, returned as an ndarray). The one
    implementation of the masks: the operators, the reduction and the networks all call it."""
    if not isinstance(X, torch.Tensor):
        return attention_masks(to_tensor(X), to_tensor(H)).numpy()
    N, n, d = X.shape
    XH = torch.einsum("ita,gab->itgb", X, H).reshape(N, -1, d)
    return (XH @ X.transpose(1, 2) >= 0).to(X.dtype).view(N, n, H.shape[0], n)


class GatedMHSAOperator(MHSAOperator):
    """The map ``Z -> Yhat`` of the gated program in torch, by chunks of samples, for the gates ``H``
    (a tensor (P, d, d) in the op's dtype on its device; a working set restricts it to some gates).

    Per chunk of r samples it forms the key features ``x_s x_s^T`` (r, n, d^2) and the masks of every
    gate (r, n, P n); never the gated Gram matrices of all N samples at once. The masks are computed in
    the op's dtype (in float32 a score within rounding of 0 may open a gate the float64 map keeps
    closed: float32 iterations solve a problem that near, and the float64 certificate says how near).
    Coefficients (P, d^2, dc); see :class:`~.mhsa.MHSAOperator` for the rest.
    """

    def __init__(self, X, pooled, c, device, H, chunk=None, shards=None):
        self.H, self.gates = H, H.shape[0]
        super().__init__(X, pooled, c, device, chunk, shards)

    @property
    def shape(self):
        return (self.gates, self.d ** 2, self.d * self.c)

    def _row_elements(self):
        n, d, c, P = self.n, self.d, self.c, self.gates
        return n * (d + d * d + 2 * P * n + 2 * P * d * c + 2 * d * c) + self.n_outputs

    def _form(self, s, e):
        """(X rows (r, n, d), key features ``x_s x_s^T`` (r, n, d^2), masks (r, n, P*n) in (g, s) order)."""
        Xc = self.X[s:e].to(self.device, non_blocking=True)
        r, n, d = Xc.shape
        K = (Xc[:, :, :, None] * Xc[:, :, None, :]).reshape(r, n, d * d)
        return Xc, K, attention_masks(Xc, self.H).view(r, n, -1)

    def restrict(self, J):
        """The operator of the gates J (an index tensor) of this one; the data is not copied."""
        H = self.H.index_select(0, torch.as_tensor(J, device=self.H.device))
        return GatedMHSAOperator(self.X, self.pooled, self.c, self.device, H, self.chunk_arg, self.shards)


class GatedMHSAProgram(LinearMHSAProgram):
    """The gated-ReLU multi-head self-attention program: a nuclear norm per gate (module docstring).

    Parameters
    ----------
    X : ndarray of shape (N, n, d)
    c : outputs per token (sequence targets) or per sequence (``pooled``)
    pooled : the output is the mean over tokens (one target per sequence)
    H : ndarray of shape (P, d, d), the gate matrices
    """

    name = "gated_mhsa"
    label = "gated-ReLU MHSA program"
    support_label = "rank, summed over the gates"
    gate_array_kinds = {"H": "gate matrices"}

    @classmethod
    def build(cls, name, X, y, T, H=None, gates=None, gate_seed=0):
        """The program on validated data (``make_problem``): the gates ``H`` (P, d, d), checked, or
        sampled from ``gates`` (default 8) and ``gate_seed``."""
        d = X.shape[2]
        if H is None:
            gates = check_int("gates", 8 if gates is None else gates, 1)
            c = y.shape[2] if y.ndim == 3 else T.shape[1]  # per gate: H_g, Z's slice (d^2 x dc) and 3 copies
            check_gates_memory(gates, 8 * (d * d + 4 * d ** 3 * c))
            H = sample_gate_matrices(gates, d, check_int("gate_seed", gate_seed))
        else:
            H = check_gate_arrays("H", H, (d, d), "gate matrix", f"tokens of dimension d = {d}")
        per_token = y.ndim == 3
        return cls(X, y.shape[2] if per_token else T.shape[1], not per_token, H)

    def __init__(self, X, c, pooled, H):
        super().__init__(X, c, pooled)
        self.H = np.asarray(H, dtype=float)
        self.gates = self.H.shape[0]
        self.shape = self.canonical_shape = (self.gates, self.d ** 2, self.d * self.c)

    def gate_arrays(self):
        """The gate matrices H (P, d, d): with X they define the map (checked for scale, and agreed on
        by every process of a distributed solve)."""
        return {"H": self.H}

    @property
    def n_blocks(self):
        """Number of singular directions, ``P min(d^2, dc)``."""
        return self.gates * min(self.shape[1:])

    def on(self, X):
        """The same program (same gates) on other data ``X`` (N', n, d)."""
        return GatedMHSAProgram(np.asarray(X, dtype=float), self.c, self.pooled, self.H)

    def _make_operator(self, Xs, device, chunk):
        H = torch.as_tensor(self.H, dtype=Xs.dtype).to(device)
        return GatedMHSAOperator(Xs, self.pooled, self.c, device, H, chunk, self.shards)

    cvxpy_formulations = ("direct",)  # no factored map (the gates mask the G_i); compressed for the squared loss
    design_gram = None  # linear MHSA's Gram matrix from the G_i does not hold gated: from the design rows

    def design(self, start=0, stop=None):
        """Dense design of the samples ``start:stop``: shape (rows*n, P d^3) (rows (i, t)) or (rows, P d^3)
        (pooled), columns (g, k, a, l), so that the map is ``design @ Z.reshape(P d^3, c)``."""
        op = self.operator()
        stop = self.N if stop is None else min(stop, self.N)
        parts = []
        for s in range(start, stop, op.chunk):
            Xc, K, D = op._form(s, min(s + op.chunk, stop))
            parts.append(torch.cat([op._design_rows(Xc, op._query_grams(K, D, g)) for g in range(self.gates)], 1))
        if not parts:
            return np.zeros((0, self.gates * self.d ** 3))
        return torch.cat(parts).numpy()


@dataclass
class GatedMHSAHeads:
    """Heads of the gated-ReLU multi-head self-attention network.

    W1 : ndarray of shape (m, d, d); W2 : ndarray of shape (m, d, c); gate : ndarray (m,) of ints,
    each head's gate (an index into the program's ``H``).
    ``f(X_i) = sum_j (D_gate(j)(X_i) * (X_i W1j X_i^T)) X_i W2j`` (n x c), mean-pooled over tokens for
    one target per sequence.
    """

    W1: np.ndarray
    W2: np.ndarray
    gate: np.ndarray
    form: str = "balanced"

    @property
    def heads(self):
        return self.W1.shape[0]


class GatedMHSAReduction(Reduction):
    """Sahiner et al.'s gated-ReLU theorem: the gated MHSA network <-> the gated program, gate by gate.

    For any heads, ``Z_g = sum_{j: gate(j) = g} u_j v_j^T`` (:meth:`coefficients`) gives the same outputs
    and ``||Z_g||_* <= sum_j ||W1j|| ||W2j|| <= sum_j (||W1j||^2 + ||W2j||^2) / 2``; the SVD of each
    ``Z_g`` gives heads that attain it (:meth:`invert`). So P(Z*) is the optimum of the network with
    these gates once each gate g holds ``rank(Z*_g)`` heads (``sum_g rank(Z*_g)`` in all), and a lower
    bound for any number of heads.
    """
    heads = GatedMHSAHeads

    networks = {"gated_mhsa": "gated_mhsa"}
    equations = {"gated_mhsa": "(gated MHSA)"}
    models = {
        "gated_mhsa": dict(equation="(gated MHSA)", build="cvxtransformer.nn.mhsa:gated_mhsa_model",
                           network="cvxtransformer.nn.mhsa:GatedMHSA",
                           heads="per_gate_ranks", default=True, colour="tab:blue"),
        "relu_mhsa": dict(equation="(ReLU MHSA)", build="cvxtransformer.nn.mhsa:relu_mhsa_model",
                          network="cvxtransformer.nn.mhsa:ReluMHSA",
                          heads="around_rank", bounded=False, default=True, colour="tab:brown",
                          note="the ReLU network has the gated network's heads and weight decay, but masks that "
                               "move with W1: the gated program's optimum is no bound for it, and objective - "
                               "convex optimum < 0 means it does better than any network on these fixed gates"),
    }

    @staticmethod
    def invert(problem, Z, form="balanced"):
        """``rank(Z_g)`` heads on each gate g from the SVD of ``Z_g``, balanced as for program (6)."""
        GatedMHSAReduction.check_form(form)
        p = problem.program
        Z = np.asarray(Z, dtype=float)
        ranks = problem.regularizer.ranks(Z)
        heads = [_svd_heads(Z[g], int(r), p.d, p.c) for g, r in enumerate(ranks)]
        return GatedMHSAHeads(W1=np.concatenate([h[0] for h in heads]), W2=np.concatenate([h[1] for h in heads]),
                              gate=np.repeat(np.arange(len(ranks)), ranks))

    @staticmethod
    def coefficients(problem, heads):
        """The coefficients Z (P, d^2, d c) that the network with ``heads`` implements on the program's
        gates: ``Z_g[(k,a), (l,b)] = sum_{j: gate(j) = g} W1j[a, k] W2j[l, b]``. The network's output is
        the program's ``forward(Z)`` and ``beta sum_g ||Z_g||_* <=`` its penalty."""
        p = problem.program
        if not isinstance(heads, GatedMHSAHeads):
            raise invalid("weights", f"GatedMHSAHeads (W1, W2, gate), the heads of the gated MHSA network, for "
                          f"{p.label}", type(heads).__name__)
        GatedMHSAReduction.check_form(heads.form, "weights.form")
        W1, W2 = _mhsa_weights(p, heads)
        m, gate = len(W1), np.asarray(heads.gate)
        if gate.shape != (m,) or (m and (gate.dtype.kind not in "iu" or gate.min() < 0 or gate.max() >= p.gates)):
            raise invalid("weights.gate", f"{m} integers in [0, {p.gates}) (one gate of H per head)",
                          f"shape {gate.shape}, dtype {gate.dtype}")
        return sum_gated_heads(W1, W2, gate, p.gates)

    @staticmethod
    def sum_heads(W1, W2, gate, gates):
        """``Z_g[(k,a), (l,b)] = sum_{j: gate(j) = g} W1j[a, k] W2j[l, b]`` of shape (gates, d^2, d c),
        unchecked (:func:`~.mhsa.sum_gated_heads`): behind :meth:`coefficients` and
        ``GatedMHSA.effective_coefficients``."""
        return sum_gated_heads(W1, W2, gate, gates)

    @staticmethod
    def predict(X, heads, H, pooled, chunk=1024):
        """Outputs of the gated network, ``sum_j (D_gate(j)(X_i) * (X_i W1j X_i^T)) X_i W2j``: (N, n*c) per
        token, or (N, c) mean-pooled; float64, by chunks of samples (``X`` may be a memory map)."""
        N, n, _ = X.shape
        c = heads.W2.shape[2]
        out = np.empty((N, c) if pooled else (N, n * c))
        for s in range(0, N, chunk):
            Xc = np.asarray(X[s:s + chunk], dtype=float)
            D = attention_masks(Xc, H)[:, :, heads.gate, :]                        # (r, t, j, s)
            scores = np.einsum("ita,jak,isk->itjs", Xc, heads.W1, Xc, optimize=True) * D
            Y = np.einsum("itjs,isl,jlb->itb", scores, Xc, heads.W2, optimize=True)
            out[s:s + chunk] = Y.mean(axis=1) if pooled else Y.reshape(len(Xc), n * c)
        return out

    @staticmethod
    def objective(problem, heads):
        """``sum_i L(f(X_i), Y_i) + beta/2 sum_j (||W1j||_F^2 + ||W2j||_F^2)`` with the program's gates."""
        p = problem.program
        return _weight_decay_objective(problem, GatedMHSAReduction.predict(p.X, heads, p.H, p.pooled), heads)


# cases (testing.CASES): each loss once, to keep the grids fast (its pooled squared case is in tests/test_gated_mhsa.py)
register("gated_mhsa", GatedMHSAProgram, GatedMHSAReduction, ALL_LOSSES, ("H", "gates", "gate_seed"),
         cases=(("squared", "sequence"), ("cross_entropy", "classes"), ("logistic", "binary")),
         estimator=("GatedMHSA", "Gated-ReLU multi-head self-attention program, a nuclear norm per gate", TARGETS))
