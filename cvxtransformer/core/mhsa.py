"""Program (6) of Sahiner et al. (poster ``003``): convex linear multi-head self-attention (docs/conventions.md).

With ``G_i = X_i^T X_i`` (d x d) and ``Z`` in ``R^{d^2 x dc}`` made of blocks ``Z^{(k,l)}`` (d x c),

    Yhat_i = sum_{k,l} G_i[k, l] X_i Z^{(k,l)}                      (n x c)
    P(Z)   = sum_i L(Yhat_i, Y_i) + beta ||Z||_*

Row ``(k, a)`` of Z is ``k*d + a`` and column ``(l, b)`` is ``l*c + b``; one head ``(W1, W2)`` is
``Z = u v^T`` with ``u[k*d + a] = W1[a, k]``, ``v[l*c + b] = W2[l, b]``. Targets are sequences
``(N, n, c)`` (outputs ``(t, b)`` flattened row-major, ``n_outputs = n*c``), or one target per
sequence through the mean-pooled output ``1/n sum_t Yhat_i[t]`` (``n_outputs = c``).

Computation: ``M_i = sum_{k,l} G_i[k,l] Z^{(k,l)}`` is one product of the (N, d^2) matrix of the
``G_i`` with Z rearranged to ``((k,l), (a,b))``, then ``Yhat_i = X_i M_i``: O(N d^3 c) per map,
no d^3-wide design. The CVXPY face uses the design ``Phi`` (rows ``x_it (x) G_i``, d^3 columns).

Example
-------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.standard_normal((4, 3, 2))
>>> p = LinearMHSAProgram(X, c=1, pooled=False)
>>> W1, W2 = rng.standard_normal((2, 2)), rng.standard_normal((2, 1))
>>> Z = np.einsum("ak,lb->kalb", W1, W2).reshape(4, 2)        # one head
>>> bool(np.allclose(p.forward(Z), (X @ W1 @ X.transpose(0, 2, 1) @ X @ W2).reshape(4, 3)))
True
"""
import numpy as np
import torch

from .arrays import F64
from .programs import CHUNK_BYTES, Program
from .regularizers import NuclearNorm

EXACT_NORM_FEATURES = 1000  # the operator norm is computed exactly up to d^3 = this


def _blocks_to_kl(Z, d, c):
    """Z (d^2, dc) in ((k,a), (l,b)) -> ((k,l), (a,b))."""
    return Z.reshape(d, d, d, c).permute(0, 2, 1, 3).reshape(d * d, d * c)


def _kl_to_blocks(S, d, c):
    """((k,l), (a,b)) -> ((k,a), (l,b)), shape (d^2, dc)."""
    return S.reshape(d, d, d, c).permute(0, 2, 1, 3).reshape(d * d, d * c)


class MHSAOperator:
    """The map ``Z -> Yhat`` of program (6) in torch, by chunks of samples.

    ``X`` (N, n, d) in the op's dtype on its storage device (or streamed, :mod:`.data`); ``pooled``:
    mean-pooled output; ``c``: outputs per token; ``shards``: None, or the data shards of a
    distributed solve (``adjoint`` and the norms are then summed over them). Coefficients are
    (d^2, dc) tensors; outputs (N, n*c) or (N, c).
    """

    def __init__(self, X, pooled, c, device, chunk=None, shards=None):
        self.X, self.pooled, self.c, self.device, self.shards = X, pooled, c, device, shards
        self.N, self.n, self.d = X.shape
        self.dtype = X.dtype
        d = self.d
        self.shape = (d * d, d * c)
        self.n_outputs = c if pooled else self.n * c
        if chunk is None:
            row = X.element_size() * (self.n * d + 2 * d * d + 2 * d * c + self.n_outputs)
            chunk = max(256, int(CHUNK_BYTES // row))
        self.chunk = max(1, min(int(chunk), self.N))
        self.bounds = [(s, min(s + self.chunk, self.N)) for s in range(0, self.N, self.chunk)]

    @property
    def N_total(self):
        """Samples of the whole problem (all shards)."""
        return self.N if self.shards is None else self.shards.total

    @property
    def streams(self):
        """Whether every product reads the data from outside the device (a memory map, or host memory)."""
        return not isinstance(self.X, torch.Tensor) or self.X.device != self.device

    def _data(self, s, e):
        """(X rows on the device, G_i flattened (rows, d^2), the readout rows P X_i)."""
        Xc = self.X[s:e].to(self.device, non_blocking=True)
        G = (Xc.transpose(1, 2) @ Xc).reshape(e - s, -1)
        R = Xc.mean(dim=1, keepdim=True) if self.pooled else Xc
        return G, R

    def forward(self, Z):
        d, c = self.d, self.c
        Zkl = _blocks_to_kl(Z, d, c)
        out = torch.empty(self.N, self.n_outputs, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            G, R = self._data(s, e)
            M = (G @ Zkl).view(e - s, d, c)
            out[s:e] = (R @ M).reshape(e - s, -1)
        return out

    def adjoint(self, V):
        d, c = self.d, self.c
        S = torch.zeros(d * d, d * c, dtype=self.dtype, device=self.device)
        rows_out = 1 if self.pooled else self.n
        for s, e in self.bounds:
            G, R = self._data(s, e)
            RV = R.transpose(1, 2) @ V[s:e].reshape(e - s, rows_out, c)  # (rows, d, c)
            S.addmm_(G.T, RV.reshape(e - s, d * c))
        if self.shards is not None:
            self.shards.sum_(S)
        return _kl_to_blocks(S, d, c)

    def forward_adjoint(self, Z, dual):
        """``Yhat = A Z``, ``V = dual(Yhat[s:e], s, e)`` and ``A^T V`` in one pass over the data."""
        d, c = self.d, self.c
        Zkl = _blocks_to_kl(Z, d, c)
        out = torch.empty(self.N, self.n_outputs, dtype=self.dtype, device=self.device)
        V = torch.empty_like(out)
        S = torch.zeros(d * d, d * c, dtype=self.dtype, device=self.device)
        rows_out = 1 if self.pooled else self.n
        for s, e in self.bounds:
            G, R = self._data(s, e)
            out[s:e] = (R @ (G @ Zkl).view(e - s, d, c)).reshape(e - s, -1)
            V[s:e] = dual(out[s:e], s, e)
            RV = R.transpose(1, 2) @ V[s:e].reshape(e - s, rows_out, c)
            S.addmm_(G.T, RV.reshape(e - s, d * c))
        if self.shards is not None:
            self.shards.sum_(S)
        return out, V, _kl_to_blocks(S, d, c)

    def operator_norm_bound(self):
        """An upper bound on ``||A||_2``, float: the smaller of the Frobenius norm of the design and
        ``sqrt(max_i lambda_max((P X_i)^T P X_i) * lambda_max(sum_i g_i g_i^T))`` (``g_i = vec G_i``)."""
        frob, top, GG = 0.0, 0.0, torch.zeros(self.d ** 2, self.d ** 2, dtype=F64, device=self.device)
        for s, e in self.bounds:
            G, R = self._data(s, e)
            G, R = G.to(F64), R.to(F64)
            C = R.transpose(1, 2) @ R
            frob += float(torch.sum(torch.sum(G * G, dim=1) * torch.diagonal(C, dim1=1, dim2=2).sum(dim=1)))
            top = max(top, float(torch.linalg.eigvalsh(C)[:, -1].max()))
            GG += G.T @ G
        if self.shards is not None:
            frob = float(self.shards.sum_(torch.tensor([frob], dtype=F64)))
            top = float(self.shards.max_(torch.tensor([top], dtype=F64)))
            self.shards.sum_(GG)
        lam = float(torch.linalg.eigvalsh(GG)[-1])
        return min(frob, top * lam) ** 0.5 if self.N_total else 0.0  # ||A|| = ||Phi|| (c outputs share Phi)

    def operator_norm(self):
        """``||A||_2``: exact (eigenvalue of the d^3 x d^3 Gram matrix) when d^3 <= 1000, else
        :meth:`operator_norm_bound`. Either is a valid upper bound for screening."""
        d = self.d
        if d ** 3 > EXACT_NORM_FEATURES:
            return self.operator_norm_bound()
        H = torch.zeros(d ** 3, d ** 3, dtype=F64, device=self.device)
        for s, e in self.bounds:
            G, R = self._data(s, e)
            Phi = (R.to(F64)[:, :, :, None, None] * G.to(F64).view(e - s, 1, 1, d, d)).permute(0, 1, 3, 2, 4)
            Phi = Phi.reshape(-1, d ** 3)  # rows (i, t), columns (k, a, l)
            H += Phi.T @ Phi
        if self.shards is not None:
            self.shards.sum_(H)
        return float(torch.linalg.eigvalsh(H)[-1]) ** 0.5


class LinearMHSAProgram(Program):
    """Program (6) of Sahiner et al.: linear multi-head self-attention as a nuclear-norm program.

    Parameters
    ----------
    X : ndarray of shape (N, n, d)
    c : outputs per token (sequence targets) or per sequence (``pooled``)
    pooled : the output is the mean over tokens (one target per sequence)
    """

    name = "mhsa"
    label = "program (6) (linear MHSA)"
    regularizer_class = NuclearNorm
    degree = 3  # yhat_i = sum_kl G_i[k, l] X_i Z^(k,l) with G_i = X_i^T X_i: cubic in X

    def __init__(self, X, c, pooled):
        super().__init__(X)
        self.N, self.n, self.d = X.shape
        self.c, self.pooled = int(c), bool(pooled)
        self.n_outputs = self.c if self.pooled else self.n * self.c
        self.shape = self.canonical_shape = (self.d * self.d, self.d * self.c)
        self._norm = None

    @property
    def n_blocks(self):
        """Number of singular directions, ``min(d^2, dc)``."""
        return min(self.shape)

    def on(self, X):
        """The same program on other data ``X`` (N', n, d)."""
        return LinearMHSAProgram(np.asarray(X, dtype=float), self.c, self.pooled)

    def _make_operator(self, Xs, device, chunk):
        return MHSAOperator(Xs, self.pooled, self.c, device, chunk, self.shards)

    def block_norms(self):
        """``||A||_2`` (an upper bound when d^3 > 1000), cached: what the rank screening needs."""
        if self._norm is None:
            self._norm = self.operator().operator_norm()
        return self._norm

    # --- CVXPY faces: the variable is Z itself ------------------------------------------------------
    def design(self):
        """Dense design ``Phi`` of shape (N*n, d^3) (rows (i, t)) or (N, d^3) (pooled), columns (k, a, l)."""
        X = self.X
        G = np.einsum("ita,itb->iab", X, X)
        R = X.mean(axis=1, keepdims=True) if self.pooled else X
        return np.einsum("ita,ikl->itkal", R, G).reshape(-1, self.d ** 3)

    def cvxpy_variable(self):
        import cvxpy as cp

        return cp.Variable(self.shape, name="Z")

    def cvxpy_forward(self, Z):
        import cvxpy as cp

        out = self.design() @ cp.reshape(Z, (self.d ** 3, self.c), order="C")
        return cp.reshape(out, (self.N, self.n_outputs), order="C")

    def cvxpy_adjoint(self, V):
        import cvxpy as cp

        rows = cp.reshape(V, (self.design().shape[0], self.c), order="C")
        return cp.reshape(self.design().T @ rows, self.shape, order="C")

    @staticmethod
    def cvxpy_blocks(Z):
        return Z

    @staticmethod
    def from_cvxpy(Z):
        return np.asarray(Z, dtype=float).copy()

    to_cvxpy = from_blocks = from_cvxpy
