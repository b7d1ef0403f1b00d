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
import numpy as np
import torch

from .arrays import to_tensor
from .mhsa import LinearMHSAProgram, MHSAOperator
from .validation import check_gate_arrays, check_gates_memory, check_int


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
