"""The multi-head self-attention families of Sahiner et al. (docs/mhsa.md, docs/gated_mhsa.md,
docs/conventions.md): program (6), linear attention (``"mhsa"``), and its gated-ReLU program
(``"gated_mhsa"``), of which program (6) is the case of one gate open everywhere. One module for the two:
the gated program subclasses program (6)'s class and reuses its torch operator, its regulariser and its
heads.

**Program (6)** (poster ``003``). With ``G_i = X_i^T X_i`` (d x d) and ``Z`` in ``R^{d^2 x dc}`` made of
blocks ``Z^{(k,l)}`` (d x c),

    Yhat_i = sum_{k,l} G_i[k, l] X_i Z^{(k,l)}                      (n x c)
    P(Z)   = sum_i L(Yhat_i, Y_i) + beta ||Z||_*

Row ``(k, a)`` of Z is ``k*d + a`` and column ``(l, b)`` is ``l*c + b``; one head ``(W1, W2)`` is
``Z = u v^T`` with ``u[k*d + a] = W1[a, k]``, ``v[l*c + b] = W2[l, b]``. Targets are sequences
``(N, n, c)`` (outputs ``(t, b)`` flattened row-major, ``n_outputs = n*c``), or one target per
sequence through the mean-pooled output ``1/n sum_t Yhat_i[t]`` (``n_outputs = c``).

Computation: ``M_i = sum_{k,l} G_i[k,l] Z^{(k,l)}`` is one product of the (N, d^2) matrix of the
``G_i`` with Z rearranged to ``((k,l), (a,b))``, then ``Yhat_i = X_i M_i``: O(N d^3 c) per map,
no d^3-wide design. The CVXPY face uses the design ``Phi`` (rows ``x_it (x) G_i``, d^3 columns).

:class:`LinearMHSAReduction` (Sahiner et al.): the linear multi-head self-attention network (5)
<-> program (6). From the SVD ``Z = sum_j s_j u_j v_j^T``, head j (:class:`MHSAHeads`) is
``W1j[a, k] = sqrt(s_j) u_j[k*d + a]``, ``W2j[l, b] = sqrt(s_j) v_j[l*c + b]``.

**The gated-ReLU program**: the nonlinear attention with the ReLU on the scores replaced by fixed gates.
P gate matrices ``H_g`` (d x d); the mask of gate g on sample i is ``D_g(X_i)[t, s] = 1[x_t^T H_g x_s >= 0]``
(query t, key s). With the per-query gated Gram matrices ``G^g_{i,t} = sum_s D_g(X_i)[t, s] x_s x_s^T``
and one ``Z_g`` (d^2, dc) per gate, in the index convention of program (6),

    Yhat_i[t, b] = sum_g sum_{a,k,l} X_i[t, a] G^g_{i,t}[k, l] Z_g[(k,a), (l,b)]
    P(Z)         = sum_i L(Yhat_i, Y_i) + beta sum_g ||Z_g||_*

Z has shape (P, d^2, dc); targets (N, n, c) are per token, all others per sequence through the
mean-pooled output. One gate open everywhere (``H = 0``: ``x_t^T 0 x_s = 0 >= 0``) is program (6).
:class:`GatedMHSAProgram` is :class:`LinearMHSAProgram` with gates: its torch operator is the one of
program (6) with masks (:class:`GatedMHSAOperator`, a :class:`MHSAOperator`), its regulariser the same
:class:`~.regularizers.NuclearNorm`, summed over the stack, and its CVXPY faces those of program (6)
with a design of P d^3 columns (gate, k, a, l).

:class:`GatedMHSAReduction` (Sahiner et al.): the gated-ReLU multi-head self-attention network
``sum_j (D_g(j)(X) * (X W1j X^T)) X W2j`` <-> this program: the heads of each ``Z_g``, as for program
(6), on gate g (:class:`GatedMHSAHeads`).

This module registers both families.

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

The gated program, one head on gate 1 of two:

>>> H = rng.standard_normal((2, 2, 2))
>>> q = GatedMHSAProgram(X, c=1, pooled=False, H=H)
>>> Zg = np.zeros(q.shape); Zg[1] = Z
>>> D = (X @ H[1] @ X.transpose(0, 2, 1) >= 0)
>>> bool(np.allclose(q.forward(Zg), ((D * (X @ W1 @ X.transpose(0, 2, 1))) @ X @ W2).reshape(4, 3)))
True

Through ``make_problem``, by name (targets (N, n, c) per token: c = 2, so Z is (d^2, dc) = (4, 4) per gate):

>>> from cvxtransformer.core.problem import make_problem
>>> make_problem(X, X, program="mhsa", beta=0.5).program.shape
(4, 4)
>>> make_problem(X, X, program="gated_mhsa", beta=0.5, gates=2).program.shape
(2, 4, 4)
"""
from dataclasses import dataclass

import numpy as np
import torch

from .arrays import F64, to_tensor
from .programs import ChunkedOperator, Program
from .reductions import (ALL_LOSSES, Heads, Reduction, by_chunks, checked_gate, checked_weights, gated_models,
                         weight_decay_objective)
from .registry import register
from .regularizers import NuclearNorm
from .validation import check_gate_arrays, check_int

__all__ = ["LinearMHSAProgram", "LinearMHSAReduction", "MHSAHeads", "GatedMHSAHeads", "GatedMHSAProgram",
           "GatedMHSAReduction", "attention_masks", "sample_gate_matrices"]

EXACT_NORM_FEATURES = 1000  # the operator norm is computed exactly up to d^3 = this
EXACT_NORM_BYTES = 2**28      # ... and while the d^3 x d^3 Gram matrices of every gate fit in this


def _blocks_to_kl(Z, d, c):
    """Z (P, d^2, dc) in ((k,a), (l,b)), one matrix per gate -> (d^2, P d c) in ((k,l), (g,a,b))."""
    P = Z.shape[0]
    return Z.reshape(P, d, d, d, c).permute(1, 3, 0, 2, 4).reshape(d * d, P * d * c)


def _kl_to_blocks(S, d, c):
    """(d^2, P d c) in ((k,l), (g,a,b)) -> (P, d^2, dc) in ((k,a), (l,b))."""
    P = S.shape[1] // (d * c)
    return S.reshape(d, d, P, d, c).permute(2, 0, 3, 1, 4).reshape(P, d * d, d * c)


class MHSAOperator(ChunkedOperator):
    """The map ``Z -> Yhat`` of program (6) in torch, by chunks of samples; with gates (the subclass
    :class:`GatedMHSAOperator`) that of the gated-ReLU program, whose case of one gate
    open everywhere program (6) is.

    Gate g maps its coefficients ``Z_g`` (d^2, dc) to

        Yhat_i[t] += x_it^T sum_s D_g(X_i)[t, s] M_{i,s},     M_{i,s} = sum_{k,l} K_{i,s}[k, l] Z_g^{(k,l)}  (d x c)

    with the key features ``K_{i,s} = x_is x_is^T``. With no mask (program (6)) the keys are summed
    first: one key per sample, ``K_i = G_i = X_i^T X_i``, and ``Yhat_i = R_i M_i`` with ``R_i = X_i``, or
    its mean over tokens for pooled outputs. One product ``K Z`` serves every gate (Z rearranged to
    ``((k,l), (g,a,b))``); the masks and the readout are batched products.

    ``X`` (N, n, d) in the op's dtype on its storage device (or streamed, :mod:`.data`); ``pooled``:
    mean-pooled output; ``c``: outputs per token; ``shards``: None, or the data shards of a
    distributed solve (``adjoint`` and the norms are then summed over them). Coefficients are
    (d^2, dc) tensors (gated: (P, d^2, dc)); outputs (N, n*c) or (N, c). The products are
    :class:`~.programs.ChunkedOperator`'s.
    """

    gates = 1  # coefficient matrices (one per gate)

    def __init__(self, X, pooled, c, device, chunk=None, shards=None):
        self.pooled, self.c = pooled, c
        n, d = X.shape[1:]
        super().__init__(X, device, c if pooled else n * c, chunk, shards)
        self._readin_shape = (d * d, self.gates * d * c)

    @property
    def shape(self):
        """Shape of the coefficients: (d^2, dc)."""
        return (self.d ** 2, self.d * self.c)

    def _row_elements(self):
        """Temporaries per sample of a chunk, in elements."""
        d, c = self.d, self.c
        return self.n * d + 2 * d * d + 2 * d * c + self.n_outputs

    def restrict(self, J):
        """The operator of the gates J (an index tensor along the first axis); one matrix is one gate: this one."""
        if len(J) != 1 or int(J[0]) != 0:
            raise IndexError(f"gates {J} of an operator of one gate")
        return self

    def _form(self, s, e):
        """The data of samples s:e: (X rows (r, n, d) on the device, key features K (r, m, d^2), masks
        (r, n, P*m) or None); here one key per sample, ``G_i``, and no mask."""
        Xc = self.X[s:e].to(self.device, non_blocking=True)
        return Xc, (Xc.transpose(1, 2) @ Xc).reshape(e - s, 1, -1), None

    def _outputs(self, data, Zkl):
        """``Yhat`` of a chunk (r, n_outputs) from its data and Z in ((k,l), (g,a,b)) layout."""
        Xc, K, D = data
        r, m = K.shape[:2]
        d, c = self.d, self.c
        M = K.reshape(r * m, d * d) @ Zkl  # (r*m, P*d*c)
        if D is None:
            R = Xc.mean(dim=1, keepdim=True) if self.pooled else Xc
            return (R @ M.view(r, d, c)).reshape(r, -1)
        M = M.view(r, m, -1, d * c).transpose(1, 2).reshape(r, -1, d * c)  # (r, P*m, dc)
        Y = (Xc.reshape(-1, 1, d) @ (D @ M).view(-1, d, c)).view(r, self.n, c)
        return Y.mean(dim=1) if self.pooled else Y.reshape(r, -1)

    def _readin(self, data, Vc):
        """The chunk's ``K^T Q`` summand of ``A^T V`` in ((k,l), (g,a,b)) layout (d^2, P*d*c)."""
        Xc, K, D = data
        r, m = K.shape[:2]
        d, c, n = self.d, self.c, self.n
        if D is None:
            R = Xc.mean(dim=1, keepdim=True) if self.pooled else Xc
            Q = (R.transpose(1, 2) @ Vc.reshape(r, R.shape[1], c)).reshape(r, d * c)
        else:
            Vt = (Vc / n)[:, None, :].expand(r, n, c) if self.pooled else Vc.view(r, n, c)
            B = (Xc[:, :, :, None] * Vt[:, :, None, :]).reshape(r, n, d * c)
            Q = (D.transpose(1, 2) @ B).view(r, -1, m, d * c).transpose(1, 2).reshape(r * m, -1)
        return K.reshape(r * m, d * d).T @ Q

    def _weights(self, Z):
        return _blocks_to_kl(Z.reshape(-1, self.d * self.d, self.d * self.c), self.d, self.c)

    def _from_readin(self, S):
        return _kl_to_blocks(S, self.d, self.c).reshape(self.shape)

    # --- operator norms (gap-safe screening), per gate ----------------------------------------------
    @staticmethod
    def _query_grams(K, D, g):
        """The Gram matrices of the queries of gate g: ``G_i`` (r, 1, d^2) for every token (no mask), or
        ``G^g_{i,t} = sum_s D_g[t, s] x_s x_s^T`` (r, n, d^2)."""
        if D is None:
            return K
        m = K.shape[1]
        return D[:, :, g * m:(g + 1) * m] @ K

    def _design_rows(self, Xc, Gq):
        """The design rows of a chunk for one gate, float64 (rows (i, t), or i pooled; columns (k, a, l)):
        ``x_t (x) G_t``, averaged over t when pooled."""
        r, q, d = Gq.shape[0], Gq.shape[1], self.d
        R = Xc.mean(dim=1, keepdim=True) if self.pooled and q == 1 else Xc
        Phi = (R.to(F64)[:, :, :, None, None] * Gq.to(F64).view(r, q, 1, d, d)).permute(0, 1, 3, 2, 4)
        if self.pooled and q > 1:
            Phi = Phi.mean(dim=1, keepdim=True)
        return Phi.reshape(-1, d ** 3)

    def _norm_terms(self, Xc, Gq):
        """Of one gate's rows of a chunk (float64): ``||Phi||_F^2``, the largest ``lambda_max(R^T R)`` of
        the readout ``R`` of one Gram matrix, and ``sum g g^T`` over its Gram matrices ``g``."""
        Xc, Gq = Xc.to(F64), Gq.to(F64)
        n = Xc.shape[1]
        if Gq.shape[1] == 1:  # rows R_i (x) G_i
            R = Xc.mean(dim=1, keepdim=True) if self.pooled else Xc
            C = R.transpose(1, 2) @ R
            frob = float(torch.sum(torch.sum(Gq[:, 0] ** 2, dim=1) * torch.diagonal(C, dim1=1, dim2=2).sum(dim=1)))
            top = float(torch.linalg.eigvalsh(C)[:, -1].max())
        elif self.pooled:  # rows 1/n sum_t x_t (x) G_t: Cauchy-Schwarz over t
            frob = float(torch.sum((Xc @ Xc.transpose(1, 2)) * (Gq @ Gq.transpose(1, 2)))) / n ** 2
            top = float(torch.sum(Xc ** 2, dim=(1, 2)).max()) / n ** 2
        else:  # rows x_t (x) G_t
            sq = torch.sum(Xc ** 2, dim=2)
            frob = float(torch.sum(sq * torch.sum(Gq ** 2, dim=2)))
            top = float(sq.max())
        g = Gq.reshape(-1, self.d ** 2)
        return frob, top, g.T @ g

    def operator_norm_bounds(self):
        """Upper bounds on ``||A_g||_2`` of every gate, float64 tensor (P,): the smaller of the Frobenius
        norm of the gate's design and ``sqrt(max lambda_max(R^T R) * lambda_max(sum g g^T))`` over its
        Gram matrices g and their readouts R (Cauchy-Schwarz)."""
        P, d2 = self.gates, self.d ** 2
        frob, top = torch.zeros(P, dtype=F64), torch.zeros(P, dtype=F64)
        GG = torch.zeros(P, d2, d2, dtype=F64, device=self.device)
        for s, e in self.bounds:
            Xc, K, D = self._data(s, e)
            for g in range(P):
                f, t, gg = self._norm_terms(Xc, self._query_grams(K, D, g))
                frob[g] += f
                top[g] = max(float(top[g]), t)
                GG[g] += gg
        if self.shards is not None:
            self.shards.sum_(frob)
            self.shards.max_(top)
            self.shards.sum_(GG)
        lam = torch.linalg.eigvalsh(GG)[:, -1].cpu() if self.N_total else torch.zeros(P, dtype=F64)
        return torch.sqrt(torch.minimum(frob, top * lam).clamp_min(0.0))

    def operator_norms(self):
        """``||A_g||_2`` of every gate (float64 tensor (P,)): exact (the top eigenvalue of the d^3 x d^3
        Gram matrix of the gate's design) when d^3 <= 1000 and those fit in 256 MB, else
        :meth:`operator_norm_bounds`. Either is a valid upper bound for screening."""
        d, P = self.d, self.gates
        if d ** 3 > EXACT_NORM_FEATURES or P * d ** 6 * 8 > EXACT_NORM_BYTES:
            return self.operator_norm_bounds()
        H = torch.zeros(P, d ** 3, d ** 3, dtype=F64, device=self.device)
        for s, e in self.bounds:
            Xc, K, D = self._data(s, e)
            for g in range(P):
                Phi = self._design_rows(Xc, self._query_grams(K, D, g))
                H[g] += Phi.T @ Phi
        if self.shards is not None:
            self.shards.sum_(H)
        return torch.sqrt(torch.linalg.eigvalsh(H)[:, -1].clamp_min(0.0)).cpu()

    def operator_norm(self):
        """``||A||_2`` (an upper bound when d^3 > 1000), float: the largest of :meth:`operator_norms`."""
        return float(self.operator_norms().max())

    def operator_norm_bound(self):
        """An upper bound on ``||A||_2``, float (see :meth:`operator_norm_bounds`)."""
        return float(self.operator_norm_bounds().max())


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
    operator_class = MHSAOperator
    support_label = "rank"
    any_length = True
    degree = 3  # yhat_i = sum_kl G_i[k, l] X_i Z^(k,l) with G_i = X_i^T X_i: cubic in X

    @classmethod
    def build(cls, name, X, y, T):
        """The program on validated data (``make_problem``): per token for targets (N, n, c), else pooled."""
        per_token = y.ndim == 3
        return cls(X, y.shape[2] if per_token else T.shape[1], pooled=not per_token)

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
        """``||A_g||_2`` of each coefficient matrix (an upper bound when d^3 > 1000), shape ``shape[:-2]``
        (one number here, one per gate for the gated program), cached: what the rank screening needs."""
        if self._norm is None:
            self._norm = self.operator().operator_norms().numpy().reshape(self.shape[:-2])
        return self._norm

    # --- CVXPY faces: the variable is Z itself ------------------------------------------------------
    @property
    def cvxpy_formulations(self):
        """The CVXPY maps offered, preferred first (a subclass that changes the map must override this).
        The factored form has n times fewer coefficients than the design for per-token outputs; pooled,
        the design is already (N, d^3) and the factored form's extra variables only slow the solver."""
        return ("direct", "factored") if self.pooled else ("factored", "direct")

    def _readout(self, X):
        """``R_i``: the tokens (rows, n, d), or their mean (rows, 1, d) when pooled."""
        return X.mean(axis=1, keepdims=True) if self.pooled else X

    def design(self, start=0, stop=None):
        """Dense design ``Phi`` of samples ``start:stop``, shape (rows*n, d^3) (rows (i, t)) or (rows, d^3)
        (pooled), columns (k, a, l): the map is ``design @ Z.reshape(d^3, c)``. Only those rows of X are read."""
        X = np.asarray(self.X[start:stop], dtype=float)
        G = np.einsum("ita,itb->iab", X, X)
        return np.einsum("ita,ikl->itkal", self._readout(X), G).reshape(-1, self.d ** 3)

    def design_gram(self, start, stop, Y):
        """``(Phi^T Phi, Phi^T Y)`` of the design rows of samples ``start:stop`` (``Y``: their targets, one
        row per design row) without the design: row (i, t) is ``R_it (x) G_i``, so
        ``Phi^T Phi[(k,a,l), (k',a',l')] = sum_i C_i[a,a'] G_i[k,l] G_i[k',l']`` with ``C_i = R_i^T R_i``, summed
        over the d(d+1)/2 distinct entries of the symmetric ``G_i`` (2 N d^2 (d(d+1)/2)^2 operations against
        the design's N r d^6) and ``Phi^T Y[(k,a,l), b] = sum_i G_i[k,l] (R_i^T Y_i)[a,b]``."""
        d = self.d
        X = np.asarray(self.X[start:stop], dtype=float)
        R = self._readout(X)
        rows = len(X)
        C = np.einsum("ita,itb->iab", R, R).reshape(rows, d * d)
        G = np.einsum("ita,itb->iab", X, X)
        k, l = np.triu_indices(d)
        U = G[:, k, l]  # (rows, d(d+1)/2)
        UU = (U[:, :, None] * U[:, None, :]).reshape(rows, -1)
        H = (C.T @ UU).reshape(d, d, len(k), len(k))  # (a, a', u, u')
        index = np.zeros((d, d), dtype=int)
        index[k, l] = index[l, k] = np.arange(len(k))
        u = index[:, None, :]  # (k, 1, l): the distinct entry of (k, l)
        H = H[np.arange(d)[None, :, None, None, None, None], np.arange(d)[None, None, None, None, :, None],
              u[:, :, :, None, None, None], u[None, None, None]]  # (k, a, l, k', a', l')
        RY = np.einsum("ita,itb->iab", R, Y.reshape(rows, R.shape[1], -1)).reshape(rows, -1)
        B = np.einsum("ikl,ix->klx", G, RY).reshape(d, d, d, -1).transpose(0, 2, 1, 3)  # (k, a, l, b)
        return H.reshape(d ** 3, d ** 3), B.reshape(d ** 3, -1)

    def cvxpy_variable(self):
        import cvxpy as cp

        return cp.Variable(self.shape, name="Z")

    def cvxpy_forward(self, Z):
        """``Yhat`` (N, n_outputs) as a CVXPY expression: the dense design times Z."""
        import cvxpy as cp

        out = self.design() @ cp.reshape(Z, (-1, self.c), order="C")
        return cp.reshape(out, (self.N, self.n_outputs), order="C")

    def cvxpy_adjoint(self, V):
        """``A^T V`` (d^2, dc) as a CVXPY expression from V (N, n_outputs)."""
        import cvxpy as cp

        design = self.design()
        rows = cp.reshape(V, (design.shape[0], self.c), order="C")
        return cp.reshape(design.T @ rows, self.shape, order="C")

    # The factored form: M = G Z_kl with G the (N, d^2) matrix of the vec G_i and Z_kl the entries of Z in
    # ((k,l), (a,b)) order, then Yhat_i = R_i M_i. CVXPY multiplies affine factors out into one matrix,
    # so M (and, for the adjoint, R^T V) are variables: N d^3 c + N r d c coefficients (r = n per token,
    # 1 pooled) against the dense design's N r d^3 c.
    def _cvxpy_kl(self, Z):
        """A (d^2, dc) expression rearranged between ((k,a), (l,b)) and ((k,l), (a,b)) (its own inverse)."""
        import cvxpy as cp

        d, c = self.d, self.c
        return cp.reshape(cp.transpose(cp.reshape(Z, (d, d, d, c), order="C"), axes=(0, 2, 1, 3)),
                          (d * d, d * c), order="C")

    def _factors(self):
        """``G`` (N, d^2), the vectorised Gram matrices, and the block-diagonal readout (N*r, N*d), sparse."""
        import scipy.sparse as sp

        X = np.asarray(self.X, dtype=float)
        R = self._readout(X)
        r, d = R.shape[1], self.d
        rows = np.repeat(np.arange(self.N * r), d)
        cols = np.tile(np.arange(d), self.N * r) + np.repeat(np.arange(self.N) * d, r * d)
        readout = sp.csr_matrix((R.ravel(), (rows, cols)), shape=(self.N * r, self.N * d))
        return np.einsum("ita,itb->iab", X, X).reshape(self.N, d * d), readout

    def cvxpy_factored_size(self):
        """Nonzero coefficients of the factored map: N d^3 c (``G Z_kl``) + N r d c (the readout) + N d c."""
        r = 1 if self.pooled else self.n
        return self.N * self.d * self.c * (self.d ** 2 + r + 1)

    def cvxpy_factored_forward(self, Z):
        """``(Yhat, constraints)``: ``Yhat`` (N, n_outputs) = ``R_i M_i`` with the variable ``M == G Z_kl``."""
        import cvxpy as cp

        G, readout = self._factors()
        M = cp.Variable((self.N, self.d * self.c), name="M")
        out = readout @ cp.reshape(M, (self.N * self.d, self.c), order="C")
        return cp.reshape(out, (self.N, self.n_outputs), order="C"), [M == G @ self._cvxpy_kl(Z)]

    def cvxpy_factored_adjoint(self, V):
        """``(A^T V, constraints)``: ``A^T V`` (d^2, dc) = ``G^T P`` rearranged, with the variable
        ``P == R^T V`` (N, dc) (the readout's transpose, sample by sample)."""
        import cvxpy as cp

        G, readout = self._factors()
        P = cp.Variable((self.N, self.d * self.c), name="P")
        RV = readout.T @ cp.reshape(V, (readout.shape[0], self.c), order="C")
        return self._cvxpy_kl(G.T @ P), [P == cp.reshape(RV, (self.N, self.d * self.c), order="C")]

    @staticmethod
    def cvxpy_blocks(Z):
        return Z

    @staticmethod
    def from_cvxpy(Z):
        return np.asarray(Z, dtype=float).copy()

    to_cvxpy = from_blocks = from_cvxpy


@dataclass
class MHSAHeads(Heads):
    """Heads of the linear multi-head self-attention network (5).

    W1 : ndarray of shape (m, d, d); W2 : ndarray of shape (m, d, c).
    ``f(X_i) = sum_j X_i W1j X_i^T X_i W2j`` (n x c), mean-pooled over tokens for one target per sequence.
    """

    W1: np.ndarray
    W2: np.ndarray
    form: str = "balanced"


class LinearMHSAReduction(Reduction):
    """Sahiner et al.'s theorem: the linear MHSA network (5) <-> program (6)."""
    heads = MHSAHeads

    networks = {"linear_mhsa": "mhsa"}
    equations = {"mhsa": "(5)"}
    models = {"linear_mhsa": dict(equation="(5)", build="cvxtransformer.nn.mhsa:linear_mhsa_model",
                                  network="cvxtransformer.nn.mhsa:LinearMHSA",
                                  heads="around_rank", default=True, colour="tab:blue"),
              "softmax": {}}

    @classmethod
    def coefficients(cls, problem, heads):
        """The coefficients Z (d^2, d c) of program (6) that network (5) with ``heads`` implements:
        ``Z[(k,a), (l,b)] = sum_j W1j[a, k] W2j[l, b]``, i.e. ``Z = sum_j u_j v_j^T`` with
        ``u_j[k*d + a] = W1j[a, k]``, ``v_j[l*c + b] = W2j[l, b]``. The network's output is the program's
        ``forward(Z)`` and ``beta ||Z||_* <= beta sum_j ||W1j|| ||W2j|| <=`` its penalty."""
        heads = cls.check_heads(problem, heads, "(W1, W2), the heads of network (5),")
        return cls.sum_heads(*_mhsa_weights(problem.program, heads))

    @staticmethod
    def sum_heads(W1, W2):
        """``Z[(k,a), (l,b)] = sum_j W1j[a, k] W2j[l, b]`` of shape (d^2, d c), unchecked: the one-gate
        case of :func:`sum_gated_heads` (behind ``LinearMHSA.effective_coefficients``)."""
        return sum_gated_heads(W1, W2, np.zeros(len(W1), dtype=int), 1)[0]

    @classmethod
    def invert(cls, problem, Z, form="balanced"):
        """``m = rank(Z)`` heads (W1j, W2j) from the SVD of Z, balanced: ``beta/2 (||W1j||^2 + ||W2j||^2) = beta s_j``."""
        cls.check_form(form)
        return MHSAHeads(*_svd_heads(Z, problem.regularizer.rank(Z), problem.program.d, problem.program.c))

    @staticmethod
    def predict(X, heads, pooled, chunk=4096):
        """Outputs of network (5): (N, n*c) per token, or (N, c) mean-pooled; in float64, by chunks of
        samples (``X`` may be a memory map larger than memory)."""
        def outputs(Xc):
            G = np.einsum("ita,itb->iab", Xc, Xc)
            Y = np.einsum("ita,jak,ikb,jbc->itc", Xc, heads.W1, G, heads.W2, optimize=True)
            return Y.mean(axis=1) if pooled else Y.reshape(len(Xc), -1)

        return by_chunks(X, outputs, heads.W2.shape[2] * (1 if pooled else X.shape[1]), chunk)

    @staticmethod
    def objective(problem, heads):
        """``sum_i L(sum_j X_i W1j X_i^T X_i W2j, Y_i) + beta/2 sum_j (||W1j||_F^2 + ||W2j||_F^2)``."""
        Yhat = LinearMHSAReduction.predict(problem.program.X, heads, problem.program.pooled)
        return weight_decay_objective(problem, Yhat, heads, ("W1", "W2"))


def _mhsa_weights(program, heads):
    """``(W1 (m, d, d), W2 (m, d, c))`` of the heads as finite float arrays of the program's d and c;
    errors name the weights."""
    d, c = program.d, program.c
    return checked_weights(program.label, {"W1": heads.W1, "W2": heads.W2}, [(-1, d, d), (-1, d, c)])


def _svd_heads(Z, m, d, c):
    """The heads ``(W1 (m, d, d), W2 (m, d, c))`` of the m largest singular triplets of Z (d^2, dc):
    ``W1j[a, k] = sqrt(s_j) u_j[k*d + a]``, ``W2j[l, b] = sqrt(s_j) v_j[l*c + b]``."""
    U, s, Wh = np.linalg.svd(np.asarray(Z, dtype=float), full_matrices=False)
    root = np.sqrt(s[:m])
    W1 = (U[:, :m] * root).T.reshape(m, d, d).transpose(0, 2, 1)  # W1j[a, k] = u_j[k*d + a]
    W2 = (Wh[:m] * root[:, None]).reshape(m, d, c)                # W2j[l, b] = v_j[l*c + b]
    return W1, W2


def sum_gated_heads(W1, W2, gate, gates):
    """``Z_g[(k,a), (l,b)] = sum_{j: gate(j) = g} W1j[a, k] W2j[l, b]`` of shape (gates, d^2, d c) for heads
    ``W1`` (m, d, d), ``W2`` (m, d, c) on gates ``gate`` (m,), unchecked: the one implementation behind the
    coefficients of program (6) (one gate) and of its gated program."""
    m, d, c = W2.shape
    A, B = W1.transpose(0, 2, 1).reshape(m, d * d), W2.reshape(m, d * c)  # rows vec(W1j^T), vec(W2j)
    Z = np.zeros((gates, d * d, d * c))
    for g in range(gates):  # a sum of outer products as one product: no (m, d^2, d c) array
        on = gate == g
        Z[g] = A[on].T @ B[on]
    return Z


# the estimators' line on their targets (both families')
TARGETS = ("Targets (N, n, c) are per token; (N,) and (N, c) are per sequence (mean-pooled output). New X "
           "may have another number of tokens n.")
register("mhsa", LinearMHSAProgram, LinearMHSAReduction, ALL_LOSSES,
         cases=(("squared", "sequence"), ("squared", "vector"), ("cross_entropy", "classes"), ("logistic", "binary")),
         estimator=("MHSA", "Nuclear-norm program of linear multi-head self-attention", TARGETS))


# ---- the gated-ReLU program: program (6) with gates (module docstring)

def sample_gate_matrices(gates, d, seed=0):
    """Gate matrices ``H`` of shape (P, d, d), i.i.d. N(0, 1)."""
    return np.random.default_rng(seed).standard_normal((gates, d, d))


def attention_masks(X, H):
    """The masks ``D[i, t, g, s] = 1[x_it^T H_g x_is >= 0]`` of shape (N, n, P, n), in X's dtype, from
    tensors ``X`` (N, n, d) and ``H`` (P, d, d) (ndarrays: float64, returned as an ndarray). The one
    implementation of the masks: the operators, the reduction and the networks all call it.

    Ties: a score of exactly 0 opens the gate (``>= 0``). The diagonal scores ``x_t^T H x_t`` are
    computed as ``x_t^T S x_t`` with ``S = (H + H^T) / 2``, equal in exact arithmetic, so that a zero of
    exact arithmetic stays an exact zero in any dtype: with an antisymmetric H (``S = 0``) every diagonal
    gate is open, where the rounding of ``x_t^T (H x_t)`` closed about 30% of them. The other scores are
    the rounded products ``x_t^T (H x_s)``: a tie there is decided by their rounding."""
    if not isinstance(X, torch.Tensor):
        return attention_masks(to_tensor(X), to_tensor(H)).numpy()
    N, n, d = X.shape
    XH = torch.einsum("ita,gab->itgb", X, H).reshape(N, -1, d)
    scores = (XH @ X.transpose(1, 2)).view(N, n, H.shape[0], n)
    S = (H + H.transpose(1, 2)) / 2
    torch.diagonal(scores, dim1=1, dim2=3).copy_(torch.einsum("ita,gab,itb->igt", X, S, X))  # (N, P, n)
    return (scores >= 0).to(X.dtype)


class GatedMHSAOperator(MHSAOperator):
    """The map ``Z -> Yhat`` of the gated program in torch, by chunks of samples, for the gates ``H``
    (a tensor (P, d, d) in the op's dtype on its device; a working set restricts it to some gates).

    Per chunk of r samples it forms the key features ``x_s x_s^T`` (r, n, d^2) and the masks of every
    gate (r, n, P n); never the gated Gram matrices of all N samples at once. The masks are computed in
    the op's dtype (in float32 a score within rounding of 0 may open a gate the float64 map keeps
    closed: float32 iterations solve a problem that near, and the float64 certificate says how near).
    Coefficients (P, d^2, dc); see :class:`MHSAOperator` for the rest.
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
    """The gated-ReLU multi-head self-attention program: a nuclear norm per gate (module docstring). Its
    parameters are those of :class:`LinearMHSAProgram` and ``H``, an ndarray (P, d, d) of gate matrices."""

    name = "gated_mhsa"
    label = "gated-ReLU MHSA program"
    operator_class = GatedMHSAOperator
    support_label = "rank, summed over the gates"
    gate_array_kinds = {"H": "gate matrices"}

    @classmethod
    def build(cls, name, X, y, T, H=None, gates=None, gate_seed=0):
        """The program on validated data (``make_problem``): the gates ``H`` (P, d, d), checked, or
        sampled from ``gates`` (default 8) and ``gate_seed``."""
        d = X.shape[2]
        if H is None:
            gates = check_int("gates", 8 if gates is None else gates, 1)
            H = sample_gate_matrices(gates, d, check_int("gate_seed", gate_seed))
        else:
            H = check_gate_arrays("H", H, (d, d), "gate matrix", f"tokens of dimension d = {d}")
        per_token = y.ndim == 3
        return cls(X, y.shape[2] if per_token else T.shape[1], not per_token, H)

    @classmethod
    def gate_bytes(cls, X, y, T):
        """Per gate (measured against peaks in docs/benchmark_gate_memory.md): per chunk of samples (at
        most 256 with many gates) the masks (n x n: the scores, booleans, float64), the queries
        ``x_t^T H_g`` and a copy (2 n d) and the products with Z and their reordered copies (4 n d c);
        the recovered heads' evaluation (``GatedMHSAReduction.predict``, chunks of 1,024 samples: the
        queries and masks of every gate, then one head's gathered masks and scores, 8 n d + 41 n^2
        bytes a sample); H_g and Z's slice (d^2 x dc) with 7 copies."""
        N, n, d = X.shape
        c = y.shape[2] if y.ndim == 3 else T.shape[1]
        return (min(N, 256) * (17 * n * n + 16 * n * d + 32 * n * d * c) + min(N, 1024) * (8 * n * d + 41 * n * n)
                + 8 * (d * d + 8 * d ** 3 * c))

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
class GatedMHSAHeads(Heads):
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
    models = gated_models("cvxtransformer.nn.mhsa", ("gated_mhsa", "(gated MHSA)", "gated_mhsa_model", "GatedMHSA"),
                          ("relu_mhsa", "(ReLU MHSA)", "relu_mhsa_model", "ReluMHSA"),
                          note="the ReLU network has the gated network's heads and weight decay, but masks that move "
                               "with W1: the gated program's optimum is no bound for it, and objective - convex "
                               "optimum < 0 means it does better than any network on these fixed gates")

    @classmethod
    def invert(cls, problem, Z, form="balanced"):
        """``rank(Z_g)`` heads on each gate g from the SVD of ``Z_g``, balanced as for program (6)."""
        cls.check_form(form)
        Z, d, c = np.asarray(Z, dtype=float), problem.program.d, problem.program.c
        ranks = problem.regularizer.ranks(Z)
        heads = [_svd_heads(Z[g], int(r), d, c) for g, r in enumerate(ranks)]
        return GatedMHSAHeads(W1=np.concatenate([h[0] for h in heads]), W2=np.concatenate([h[1] for h in heads]),
                              gate=np.repeat(np.arange(len(ranks)), ranks))

    @staticmethod
    def coefficients(problem, heads):
        """The coefficients Z (P, d^2, d c) that the network with ``heads`` implements on the program's
        gates: ``Z_g[(k,a), (l,b)] = sum_{j: gate(j) = g} W1j[a, k] W2j[l, b]``. The network's output is
        the program's ``forward(Z)`` and ``beta sum_g ||Z_g||_* <=`` its penalty."""
        p = problem.program
        heads = GatedMHSAReduction.check_heads(problem, heads, "(W1, W2, gate), the heads of the gated MHSA network,")
        W1, W2 = _mhsa_weights(p, heads)
        return sum_gated_heads(W1, W2, checked_gate(heads.gate, len(W1), p.gates, "one gate of H per head"), p.gates)

    @staticmethod
    def sum_heads(W1, W2, gate, gates):
        """``Z_g[(k,a), (l,b)] = sum_{j: gate(j) = g} W1j[a, k] W2j[l, b]`` of shape (gates, d^2, d c),
        unchecked (:func:`sum_gated_heads`): behind :meth:`coefficients` and
        ``GatedMHSA.effective_coefficients``."""
        return sum_gated_heads(W1, W2, gate, gates)

    @staticmethod
    def predict(X, heads, H, pooled, chunk=1024):
        """Outputs of the gated network, ``sum_j (D_gate(j)(X_i) * (X_i W1j X_i^T)) X_i W2j``: (N, n*c) per
        token, or (N, c) mean-pooled; float64, by chunks of samples (``X`` may be a memory map)."""
        def outputs(Xc):
            D = attention_masks(Xc, H)[:, :, heads.gate, :]                        # (r, t, j, s)
            scores = np.einsum("ita,jak,isk->itjs", Xc, heads.W1, Xc, optimize=True) * D
            Y = np.einsum("itjs,isl,jlb->itb", scores, Xc, heads.W2, optimize=True)
            return Y.mean(axis=1) if pooled else Y.reshape(len(Xc), -1)

        c = heads.W2.shape[2]
        return by_chunks(X, outputs, c if pooled else X.shape[1] * c, chunk)

    @staticmethod
    def objective(problem, heads):
        """``sum_i L(f(X_i), Y_i) + beta/2 sum_j (||W1j||_F^2 + ||W2j||_F^2)`` with the program's gates."""
        p = problem.program
        return weight_decay_objective(problem, GatedMHSAReduction.predict(p.X, heads, p.H, p.pooled), heads,
                                      ("W1", "W2"))


# cases (testing.CASES): each loss once, to keep the grids fast (its pooled squared case is in tests/test_gated_mhsa.py)
register("gated_mhsa", GatedMHSAProgram, GatedMHSAReduction, ALL_LOSSES, ("H", "gates", "gate_seed"),
         cases=(("squared", "sequence"), ("cross_entropy", "classes"), ("logistic", "binary")),
         estimator=("GatedMHSA", "Gated-ReLU multi-head self-attention program, a nuclear norm per gate", TARGETS))
