"""The attention family of Ergen et al. (arXiv 2211.11052): programs (8), (10) and (12), their torch
operators, and Proposition 1, the reduction between them and the attention networks (6)/(9) and (11)
(docs/conventions.md). This module registers the three programs (:mod:`.registry`).

The linear maps of programs (8), (10) and (12) and their adjoints (docs/conventions.md): one object per program.

All three share one canonical coefficient shape ``(h, c, n, d)``:
``yhat_il = sum_j M_ij <Z[j, l], X_i>``. Program (10) is the case ``h = 1`` with a gate that is
always open, and program (8) is (10) with ``c = 1``. Each program keeps one public coefficient
shape, used by every function that takes or returns Z: ``(n, d)`` for (8), ``(c, n, d)`` for
(10), ``(h, c, n, d)`` for (12). The canonical shape is a view used inside the torch operator.

:class:`AttentionOperator` is the torch face of the map: chunks of samples, any device and
dtype, restricted to gates J and tokens K when a solver works on a subproblem. The numpy face
of :class:`AttentionProgram` (``forward``, ``adjoint``) runs the same operator on CPU float64.
When every token of X is a one-hot vector (token ids embedded as ``e_v``, as in the algorithmic
tasks) the program uses :class:`TokenOperator` instead: the same map by token lookups, about d
times fewer multiply-adds (the same numbers to rounding).

:class:`Proposition1` (Ergen et al.): the alternative attention network (6)/(9) <-> program (8)
or (10), the gated-ReLU network (11) <-> program (12). Every nonzero group ``z = Z[j, l, k]``
becomes one head with attention row ``w_1 = e_k`` (a vertex of the simplex), value vector
``w_2`` and output vector ``w_3``: balanced form ``w_2 = z / sqrt(||z||)``,
``w_3 = sqrt(||z||) e_l`` (penalty ``beta/2 (||w_2||^2 + ||w_3||_1^2)``), or Lemma-1 form
``w_2 = z / ||z||``, ``w_3 = ||z|| e_l`` (penalty ``beta ||w_3||_1``).

Example
-------
>>> import numpy as np
>>> X = np.random.default_rng(0).standard_normal((5, 3, 2))
>>> p = AttentionProgram(10, X, n_outputs=2)
>>> p.shape, p.forward(np.ones(p.shape)).shape
((2, 3, 2), (5, 2))
"""
import copy
from dataclasses import dataclass

import numpy as np
import torch
from scipy.linalg import get_blas_funcs

from .arrays import F64
from .contracts import GRAM_LAYOUT
from .data import StreamedRows, file_backed
from .errors import invalid
from .losses import project_rows_to_simplex
from .programs import CHUNK_BYTES, Program, _SampleOperator
from .reductions import ALL_LOSSES, Reduction
from .registry import register
from .regularizers import GroupLasso, TokenNuclearNorm
from .validation import check_array, check_int

__all__ = ["AttentionHeads", "AttentionProgram", "Proposition1", "WeightDecayProgram", "WeightDecayReduction",
           "gate_mask", "sample_gates"]


def sample_gates(gates, n, d, seed=0):
    """Gate vectors of program (12): ``U1`` of shape (h, n) and ``U2`` of shape (h, d), i.i.d. N(0, 1)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((gates, n)), rng.standard_normal((gates, d))


def gate_mask(X, U1, U2):
    """Gate mask ``M`` of shape (N, h): ``M_ij = 1[u_1j^T X_i u_2j >= 0]`` (ndarrays or tensors)."""
    if isinstance(X, torch.Tensor):
        return (torch.einsum("jk,ikd,jd->ij", U1, X, U2) >= 0).to(X.dtype)
    return (np.einsum("jk,ikd,jd->ij", U1, X, U2) >= 0).astype(float)


def gated_outputs(A, mask, h, c):
    """``yhat_il = sum_j M_ij A_i(j, l)`` from per-gate outputs ``A`` (rows, h*c); no mask: h = 1."""
    if mask is None:
        return A
    return torch.einsum("ijl,ij->il", A.view(-1, h, c), mask)


GATHER_BYTES = 2**19  # rows of tokens K gathered at a time (rows()): they stay in a core's cache for the products
PATTERN_BYTES = 2**28  # largest stack of Gram matrices, one per pattern of open gates (_patterns)
# forward reads only the gates and tokens where Z is nonzero (a restricted operator) where the whole product is more
# than this many multiply-adds: the restriction costs about 0.1 ms of calls, what a product this size takes (one
# CPU thread, N = 1,000 samples of 8 tokens of 16 features: 27 us whole, 116 us restricted to 3 tokens)
RESTRICT_WORK = 5e5


def token_runs(K):
    """``[(k0, k1, p)]``: the runs of consecutive tokens ``k0 .. k1 - 1`` of the index tensor K, each from position
    p of K (the tokens of a run are one contiguous slice of each row of X)."""
    K = [int(k) for k in K]
    runs, p = [], 0
    while p < len(K):
        q = p + 1
        while q < len(K) and K[q] == K[q - 1] + 1:
            q += 1
        runs.append((K[p], K[q - 1] + 1, p))
        p = q
    return runs


def gram_of(R):
    """``R^T R`` (F, F): on the CPU by BLAS's syrk (:func:`add_gram`: half the multiply-adds; torch has no such
    call), 1.6 to 2x faster than block-triangular torch products, one thread, (N, F) from (1,000, 128) to
    (1,000, 2,048) in float64."""
    if R.device.type != "cpu" or R.requires_grad:
        return R.T @ R
    H = torch.zeros(R.shape[1], R.shape[1], dtype=R.dtype)
    add_gram(H, R)
    return mirror_lower(H)


def add_gram(H, R):
    """``H += R^T R`` on the CPU into the lower triangle of ``H`` (C-contiguous, (F, F)) only, by BLAS's syrk in
    place (scipy); mirror it once the sums are done (:func:`mirror_lower`)."""
    Hf, Rn = H.numpy().T, R.numpy()  # Fortran views: H's lower triangle is Hf's upper one, R^T is Fortran
    out = get_blas_funcs("syrk", (Rn,))(1.0, Rn.T, beta=1.0, c=Hf, overwrite_c=1)
    if out is not Hf:  # scipy copied (it does not for these layouts): keep its sums
        Hf[...] = out


def mirror_lower(H, block=256):
    """Set the strict upper triangle of ``H`` (F, F), zero (as :func:`add_gram` leaves it in a matrix of zeros), from
    its lower one, in place, ``block`` rows at a time (a whole transpose streams one side across the cache: 85 ->
    13 ms at F = 2,048 in float64)."""
    F = H.shape[0]
    for i in range(0, F, block):
        H[i:i + block, i + block:] = H[i + block:, i:i + block].T
        diagonal = H[i:i + block, i:i + block]
        diagonal.add_(torch.tril(diagonal, -1).T)
    return H


def padded(w):
    """``w`` (rows, m) with zero columns up to a multiple of 4 (on the CPU, where 1 < m): MKL's products of
    X^T with 2, 3, 5, 6 or 7 columns are 1.5 to 2.5 times slower than with 4 or 8 (one thread, N = 200,000,
    128 features: 3 columns 101 ms, 4 columns 43 ms); callers drop the extra rows of the result."""
    m = w.shape[1]
    if m == 1 or m % 4 == 0 or w.device.type != "cpu":
        return w
    out = w.new_zeros(w.shape[0], m + (-m) % 4)
    out[:, :m] = w
    return out


class AttentionOperator(_SampleOperator):
    """The map ``Z -> yhat`` of program (8)/(10)/(12) restricted to gates J and tokens K, in torch.
    Coefficients are tensors of shape ``(|J|, c, |K|, d)`` (:attr:`shape`).

    Parameters
    ----------
    X : tensor of shape (N, n, d), every token, in the op's dtype; on ``device`` or, when it does
        not fit there, on the CPU (chunks of samples are then streamed); or a
        :class:`~cvxtransformer.core.data.StreamedRows` (a memory map read chunk by chunk)
    K : tensor of token indices, or None for every token. No copy of X is ever made: with one output
        column ``forward`` and ``adjoint`` read the tokens K in place (runs of consecutive tokens are views
        of X's rows, which BLAS reads with X's row stride); otherwise, and for the Gram matrices, :meth:`rows`
        gathers them for a chunk of samples that stays in cache, as BLAS packs its operands anyway
    mask : tensor of shape ``(N, |J|)`` on ``device``, the gate columns J; None for (8)/(10)
    c : outputs
    chunk : samples per chunk (None: chosen so a chunk's temporaries stay a few MB)
    shards : None (all samples are here), or the data shards of a distributed solve: ``adjoint``,
        ``gram`` and the block norms are then summed over them
    """

    coefficient_layout = GRAM_LAYOUT  # (|J|, c, |K|, d): what gram and weighted_gram assume (core/contracts.py)

    def __init__(self, X, K, mask, c, device, chunk=None, shards=None):
        self.X, self.K, self.mask, self.c, self.device, self.shards = X, K, mask, c, device, shards
        self.N, n, self.d = X.shape
        self.nK = n if K is None else len(K)
        self.F = self.nK * self.d
        self.hJ = 1 if mask is None else mask.shape[1]
        self.dtype = X.dtype
        self.chunk_arg = chunk
        # tokens K of data on the device are read in place by forward and adjoint, as runs of consecutive tokens
        # (views of X's rows: no copy), where the products have one column (matrix-vector products stream the
        # rows at any stride); with several columns MKL's products of strided rows are slower than gathering a
        # chunk that stays in cache (rows()), as BLAS packs its operands anyway ((12), N=20,000, 8 gates, 3 of
        # 8 tokens, one thread: 8.2 ms in place, 3.5 ms gathered)
        self.runs = None if K is None or self.streams or self.hJ * c > 1 else token_runs(K)
        size = X.element_size()
        if chunk is None and self.runs is not None:  # rows() gathers the tokens K in chunks that stay in cache
            chunk = max(256, int(GATHER_BYTES // (size * self.F)))
        elif chunk is None:  # streamed data is read whole rows at a time (every token), then the tokens K gathered
            copied = K is not None or self.streams
            whole = n * self.d if self.streams else 0
            chunk = max(256, int(CHUNK_BYTES // (size * (whole + self.F * copied + 2 * self.hJ * c + 1))))
        self.chunk = max(1, min(int(chunk), self.N))
        self.bounds = [(s, min(s + self.chunk, self.N)) for s in range(0, self.N, self.chunk)]
        # products that read the tokens K in place: over every sample at once ungated; gated, in chunks whose
        # (rows, |J| c) temporaries take CHUNK_BYTES
        step = self.N if self.mask is None else max(256, int(CHUNK_BYTES // (size * (2 * self.hJ * c + 1))))
        step = max(1, step if self.chunk_arg is None else self.chunk)
        self.product_bounds = [(s, min(s + step, self.N)) for s in range(0, self.N, step)]
        self._buffers = {}
        self._binary = None  # whether every gate is 0 or 1 (as gate_mask makes them), once asked

    @property
    def streams(self):
        """Whether every product reads the data from outside the device (a memory map, or host memory)."""
        return isinstance(self.X, StreamedRows) or self.X.device != self.device

    def _runs_of(self, s, e):
        """The tokens K of rows s:e as views of X, one ``(rows, run d)`` matrix per run of consecutive tokens,
        with the position of its first token in K (nothing is copied: BLAS reads them with X's row stride)."""
        return [(p, self.X[s:e, k0:k1].reshape(e - s, (k1 - k0) * self.d)) for k0, k1, p in self.runs]

    def _buffer(self, name, shape, device):
        """A reused scratch tensor: fresh large allocations cost page faults at every chunk."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[1:] != shape[1:] or buf.shape[0] < shape[0]:
            buf = self._buffers[name] = torch.empty(shape, dtype=self.dtype, device=device)
        return buf[:shape[0]]

    def restrict(self, J, K, dtype=None, chunk=None):
        """The operator of gates J and tokens K (index tensors or ranges, local to this one: the tokens
        ``self.K[K]`` of the data where this op has its own); nothing is copied."""
        n = self.X.shape[1]
        Kt = torch.as_tensor(K, device=self.X.device)
        if self.K is not None:
            Kt = self.K.index_select(0, Kt)
        elif len(Kt) == n:
            Kt = None
        M = self.mask
        if M is not None and len(J) != M.shape[1]:
            M = M.index_select(1, torch.as_tensor(J, device=M.device))
        X = self.X
        if dtype is not None:
            X = StreamedRows(X.source, X.device, dtype) if isinstance(X, StreamedRows) else X.to(dtype)
        M = M if M is None or dtype is None else M.to(dtype)
        return AttentionOperator(X, Kt, M, self.c, self.device, self.chunk_arg if chunk is None else chunk,
                                 self.shards)

    def rows(self, s, e):
        """Rows s:e of the data, ``(rows, |K| d)``, on the device."""
        Xc = self.X if (s, e) == (0, self.N) and isinstance(self.X, torch.Tensor) else self.X[s:e]
        if self.K is not None:
            out = self._buffer("x", (e - s, self.nK, self.d), Xc.device)
            Xc = torch.index_select(Xc, 1, self.K, out=out)
        return Xc.reshape(e - s, self.F).to(self.device, non_blocking=True)

    def forward(self, Z):
        """``yhat`` of shape (N, c) from ``Z`` of shape ``(|J|, c, |K|, d)``. Where the product is over
        ``RESTRICT_WORK`` multiply-adds, only the gates and tokens where Z is nonzero are read (data on the device:
        in place)."""
        if not self.streams and self.N * self.hJ * self.c * self.F > RESTRICT_WORK:
            nz = torch.linalg.vector_norm(Z, dim=-1) > 0  # (|J|, c, |K|)
            J, K = torch.nonzero(nz.any(dim=(1, 2))).flatten(), torch.nonzero(nz.any(dim=(0, 1))).flatten()
            if len(J) == 0:
                return torch.zeros(self.N, self.c, dtype=self.dtype, device=self.device)
            if len(J) < self.hJ or len(K) < self.nK:
                return self.restrict(J, K).forward(Z.index_select(0, J).index_select(2, K))
        W = Z.reshape(self.hJ * self.c, self.F).T
        if self.runs is not None:
            return self._forward_in_place(W)
        if len(self.bounds) == 1:
            return gated_outputs(self.rows(0, self.N) @ W, self.mask, self.hJ, self.c)
        out = torch.empty(self.N, self.c, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            mask = None if self.mask is None else self.mask[s:e]
            out[s:e] = gated_outputs(self.rows(s, e) @ W, mask, self.hJ, self.c)
        return out

    def _forward_in_place(self, W):
        out = torch.empty(self.N, self.c, dtype=self.dtype, device=self.device)
        for s, e in self.product_bounds:
            A = torch.zeros(e - s, self.hJ * self.c, dtype=self.dtype, device=self.device)
            for p, Xr in self._runs_of(s, e):
                A.addmm_(Xr, W[p * self.d:p * self.d + Xr.shape[1]])
            out[s:e] = gated_outputs(A, None if self.mask is None else self.mask[s:e], self.hJ, self.c)
        return out

    def _weights(self, V, s, e):
        """``(rows, |J| c)``: ``M_ij V_il`` for the samples of a chunk (zero columns added up to a multiple of
        4 on the CPU: :func:`padded`)."""
        if self.mask is None:
            return padded(V[s:e])
        return padded((self.mask[s:e, :, None] * V[s:e, None, :]).reshape(e - s, self.hJ * self.c))

    def adjoint(self, V):
        """``A^T V`` of shape ``(|J|, c, |K|, d)`` from ``V`` of shape (N, c)."""
        m = self.hJ * self.c
        if self.runs is not None:  # in place, one product per run of tokens
            parts = None
            for s, e in self.product_bounds:
                w = self._weights(V, s, e).T
                runs = self._runs_of(s, e)
                if parts is None:
                    parts = [w @ Xr for _, Xr in runs]
                else:
                    for part, (_, Xr) in zip(parts, runs):
                        part.addmm_(w, Xr)
            G = torch.zeros(self.shape, dtype=self.dtype, device=self.device) if parts is None else \
                torch.cat([part[:m] for part in parts], dim=1)
        else:
            G = None
            for s, e in self.bounds:
                part = self._weights(V, s, e).T @ self.rows(s, e)
                G = part if G is None else G.add_(part)
            G = torch.zeros(self.shape, dtype=self.dtype, device=self.device) if G is None else G[:m]
        if self.shards is not None:
            self.shards.sum_(G)
        return G.reshape(self.shape)

    def forward_adjoint(self, Z, dual):
        """``yhat = A Z`` (N, c), ``V = dual(yhat[s:e], s, e)`` and ``A^T V`` in one pass over the data
        (each chunk is read once: for streamed data, a certificate costs one pass)."""
        W = Z.reshape(self.hJ * self.c, self.F).T
        out = torch.empty(self.N, self.c, dtype=self.dtype, device=self.device)
        V, G = torch.empty_like(out), None
        for s, e in self.bounds:
            Xc = self.rows(s, e)
            out[s:e] = gated_outputs(Xc @ W, None if self.mask is None else self.mask[s:e], self.hJ, self.c)
            V[s:e] = dual(out[s:e], s, e)
            part = self._weights(V, s, e).T @ Xc
            G = part if G is None else G.add_(part)
        G = torch.zeros(self.shape, dtype=self.dtype, device=self.device) if G is None else G[:self.hJ * self.c]
        if self.shards is not None:
            self.shards.sum_(G)
        return out, V, G.reshape(self.shape)

    def _design_chunks(self):
        """The gated design ``D`` (rows, |J|*|K|*d) chunk by chunk, as ``(start, stop, D)``: columns
        ordered (gate, token, coordinate); never the whole of it (a few MB per chunk)."""
        Fg = self.hJ * self.F
        rows = max(256, int(CHUNK_BYTES // (self.X.element_size() * Fg)))
        for s0, e0 in self.bounds:
            Xc = self.rows(s0, e0)
            for s in range(0, e0 - s0, rows):
                e = min(s + rows, e0 - s0)
                D = Xc[s:e]
                if self.mask is not None:
                    out = self._buffer("gated", (e - s, self.hJ, self.F), self.device)
                    D = torch.mul(self.mask[s0 + s:s0 + e, :, None], Xc[s:e, None, :], out=out).view(e - s, Fg)
                yield s0 + s, s0 + e, D

    def _sum_grams(self, weights, each_chunk=None):
        """``H[m] = sum_i weights[i, m] D_i^T D_i`` (m, F, F) over the chunks of the design (weights
        None: one unweighted Gram matrix), summed over the shards. One Gram matrix: upper block
        triangle, then mirrored; several: one product per chunk for all of them, then symmetrised.
        ``each_chunk(start, stop, D)`` sees every chunk on the way."""
        Fg = self.hJ * self.F
        m = 1 if weights is None else weights.shape[1]
        H = torch.zeros(Fg, m * Fg, dtype=self.dtype, device=self.device)
        # on the CPU, one column of weights >= 0 (or none): R^T R with R = sqrt(w) D, BLAS's syrk (add_gram);
        # else four block rows, token-aligned: 10/16 of the products at nearly the same speed (F = 128, 256 on
        # 15,000 samples, one CPU thread: 6.0 -> 5.4 ms, 21 -> 17 ms)
        syrk = self.device.type == "cpu" and m == 1 and (weights is None or bool((weights >= 0).all()))
        step = Fg if Fg <= 64 else -(-Fg // 4 // self.d) * self.d
        for s, e, D in self._design_chunks():
            if weights is not None:  # in a reused buffer: no fresh allocation per chunk
                w = weights[s:e]
                live = torch.nonzero((w != 0).any(dim=1)).flatten()  # samples of zero weight add nothing
                if len(live) < 0.9 * (e - s):
                    D, w = D.index_select(0, live), w.index_select(0, live)
                out = self._buffer("weighted", (len(w), m, Fg), self.device)
                w = torch.sqrt(w) if syrk else w
                Dw = torch.mul(w[:, :, None], D[:, None, :], out=out).view(len(w), m * Fg)
            else:
                Dw = D
            if syrk:
                add_gram(H, Dw)
            elif m == 1:
                for i in range(0, Fg, step):
                    H[i:i + step, i:].addmm_(D[:, i:i + step].T, Dw[:, i:])
            else:
                H.addmm_(D.T, Dw)
            if each_chunk is not None:
                each_chunk(s, e, D)
        if self.shards is not None:
            self.shards.sum_(H)
        if syrk:
            return mirror_lower(H)[None]
        if m == 1:
            return (torch.triu(H) + torch.triu(H, 1).T)[None]
        H = H.view(Fg, m, Fg).transpose(0, 1)
        return 0.5 * (H + H.transpose(1, 2))

    def gram(self, T):
        """Gram matrix ``H = A_l^T A_l`` (F, F), shared by every output l, and ``B = A^T T`` (c, F).

        ``F = |J| |K| d``, features ordered (gate, token, coordinate); accumulated over chunks of the
        gated design (never the whole of it), upper block triangle only, then mirrored; gated
        (program (12)), block ``(j, j')`` over the samples where both gates are on only (as
        :meth:`weighted_gram`), and ``B`` by :meth:`adjoint`.
        """
        if self.mask is not None and self.hJ > 1:
            return self._gated_grams(None)[0], self.adjoint(T).transpose(0, 1).reshape(self.c, -1)
        B = torch.zeros(self.c, self.hJ * self.F, dtype=self.dtype, device=self.device)
        H = self._sum_grams(None, lambda s, e, D: B.addmm_(T[s:e].T, D))
        if self.shards is not None:
            self.shards.sum_(B)
        return H[0], B

    def cross_gram(self, other):
        """``A^T A'`` (F, F') of this op and ``other``, an op of the same samples (ungated, as ``gram``),
        chunk by chunk, summed over the shards: the columns a Gram matrix gains with the tokens of ``other``."""
        out = torch.zeros(self.hJ * self.F, other.hJ * other.F, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            out.addmm_(self.rows(s, e).T, other.rows(s, e))
        if self.shards is not None:
            self.shards.sum_(out)
        return out

    def weighted_gram(self, weights):
        """``H[m] = sum_i weights[i, m] D_i^T D_i``, shape (m, F, F), for weights (N, m) on the samples;
        ``D_i`` is the gated design row of sample i (features ordered as in :meth:`gram`). These are
        the blocks of the Hessian ``A^T W A`` of a loss whose per-sample Hessians ``W_i`` have these
        entries (the Newton model of :mod:`cvxtransformer.solvers.proxgrad.prox_newton`). Chunked like
        :meth:`gram` and summed over the shards; samples whose weights are all zero are skipped. Gated (program
        (12)): block ``(j, j')`` sums over the samples where both gates are on only, gathered pair by
        pair, so the cost is
        ``sum_{j <= j'} |{i: M_ij M_ij' != 0}| (|K| d)^2 m`` instead of ``N (|J| |K| d)^2 m``
        (about ``|J| / 2 + 2`` times less with half the gates on)."""
        if self.mask is None or self.hJ == 1:
            return self._sum_grams(weights)
        return self._gated_grams(weights)

    def weighted_gram_cost(self):
        """Multiply-adds of :meth:`weighted_gram` per weight column, over every shard: ``N F^2 / 2``
        ungated (the upper triangle), ``sum_{j <= j'} |{i: M_ij M_ij' != 0}| (|K| d)^2`` gated."""
        if self.mask is None or self.hJ == 1:
            return self.N_total * (self.hJ * self.F) ** 2 / 2.0
        on = (self.mask != 0).to(torch.float64)
        pairs = torch.triu(on.T @ on).sum().reshape(1)
        if self.shards is not None:
            self.shards.sum_(pairs)
        return float(pairs[0]) * self.F ** 2

    def _gated_grams(self, weights):
        """:meth:`weighted_gram` on a gated operator, one block of gates ``(j, j')``, ``j <= j'``, at a
        time over the samples where ``M_ij M_ij' != 0`` (the other rows of the gated design are zero
        there), mirrored below the diagonal. ``weights`` None: the unweighted Gram matrix (m = 1). With
        gates 0/1 and one column of weights >= 0 (or none), block ``(j, j')`` is ``Y_S^T Y_S`` with
        ``Y = sqrt(w) X`` taken once per chunk: no weighted copy of the samples for each pair (the
        logistic program (12), N = 10,000, 16 gates, 0.1 beta_max: 0.36 s -> 0.31 s a solve)."""
        F, hJ, m = self.F, self.hJ, 1 if weights is None else weights.shape[1]
        if self._binary is None:
            self._binary = bool(((self.mask == 0) | (self.mask == 1)).all())
        root = self._binary and (weights is None or (m == 1 and bool((weights >= 0).all())))
        if root and hJ <= 62:
            patterns = self._patterns()
            if patterns is not None:
                return self._pattern_grams(weights, *patterns)
        H = torch.zeros(m, hJ, F, hJ, F, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            Xc, Mc = self.rows(s, e), self.mask[s:e]
            on_any = Mc != 0 if weights is None else (Mc != 0) & (weights[s:e] != 0).any(dim=1, keepdim=True)
            if root and weights is not None:  # block (j, j') is Y_S^T Y_S, Y = sqrt(w) X on the samples S
                Xc = Xc * torch.sqrt(weights[s:e])
            for j in range(hJ):
                on = torch.nonzero(on_any[:, j]).flatten()  # every pair (j, j') lies within gate j's samples
                Xj, Mj = Xc.index_select(0, on), Mc.index_select(0, on)
                if not root:
                    Wj = Mj[:, j, None] if weights is None else weights[s:e].index_select(0, on) * Mj[:, j, None]
                for k in range(j, hJ):
                    both = torch.nonzero(Mj[:, k]).flatten() if k > j else None
                    Xs = Xj if both is None else Xj.index_select(0, both)
                    if not len(Xs):
                        continue
                    if root:
                        H[0, j, :, k] += gram_of(Xs)
                        continue
                    Ws = Wj if both is None else Wj.index_select(0, both) * Mj[both, k, None]
                    Dw = (Ws[:, :, None] * Xs[:, None, :]).view(len(Xs), m * F)
                    H[:, j, :, k].add_((Xs.T @ Dw).view(F, m, F).transpose(0, 1))
        if self.shards is not None:
            self.shards.sum_(H)
        for j in range(hJ):
            H[:, j, :, j] = 0.5 * (H[:, j, :, j] + H[:, j, :, j].transpose(1, 2))
            for k in range(j + 1, hJ):
                H[:, k, :, j] = H[:, j, :, k].transpose(1, 2)
        return H.view(m, hJ * F, hJ * F)

    def _patterns(self):
        """The samples grouped by their pattern of open gates, ``(patterns (P, |J|) 0/1, the samples sorted by
        pattern, where each pattern's samples start (P + 1))``, where summing a Gram matrix per pattern costs
        less than per pair of gates: ``N + P |J|^2`` against ``sum_{j <= j'} |{i: M_ij M_ij' = 1}|`` products of
        ``(|K| d)^2`` (8 gates on 20,000 samples: 256 patterns at most, 36,000 against 260,000), and their Gram
        matrices take at most ``PATTERN_BYTES``; else None (also for streamed or sharded data)."""
        if self.shards is not None or self.streams:
            return None
        bits = self.mask.to(torch.int64) << torch.arange(self.hJ, device=self.mask.device)
        codes, inverse, counts = torch.unique(bits.sum(dim=1), return_inverse=True, return_counts=True)
        on = self.mask != 0
        pairs = float(torch.triu(on.T.to(F64) @ on.to(F64)).sum())
        too_big = len(codes) * self.F ** 2 * self.X.element_size() > PATTERN_BYTES
        if too_big or self.N + len(codes) * self.hJ ** 2 >= pairs:
            return None
        patterns = ((codes[:, None] >> torch.arange(self.hJ, device=codes.device)) & 1).to(self.dtype)
        starts = torch.zeros(len(codes) + 1, dtype=torch.int64, device=codes.device)
        starts[1:] = torch.cumsum(counts, 0)
        return patterns, torch.argsort(inverse, stable=True), starts.tolist()

    def _pattern_grams(self, weights, patterns, order, starts):
        """:meth:`_gated_grams` with gates 0/1 (weights one column >= 0, or none) by patterns of open gates:
        ``G_p = sum_{i in p} w_i x_i x_i^T`` over the samples of each pattern p (its samples gathered a
        cache-sized group at a time), then block ``(j, j') = sum_{p: j, j' open} G_p``, one product over the
        patterns. The same sums as by pairs of gates, in ``N`` instead of ``sum_{j <= j'} |{i: both open}|``
        products of the tokens' Gram size."""
        F, hJ, P = self.F, self.hJ, len(patterns)
        G = torch.zeros(P, F, F, dtype=self.dtype, device=self.device)
        rows = max(256, int(GATHER_BYTES // (self.X.element_size() * F)))
        p = 0
        while p < P:  # whole patterns, about ``rows`` samples at a time
            q = p + 1
            while q < P and starts[q + 1] - starts[p] <= rows:
                q += 1
            idx = order[starts[p]:starts[q]]
            Y = self.X.index_select(0, idx)
            Y = (Y if self.K is None else Y.index_select(1, self.K)).reshape(len(idx), F)
            if weights is not None:
                Y = Y * torch.sqrt(weights.index_select(0, idx))
            for r in range(p, q):
                G[r] = gram_of(Y[starts[r] - starts[p]:starts[r + 1] - starts[p]])
            p = q
        both = (patterns[:, :, None] * patterns[:, None, :]).reshape(P, hJ * hJ)
        H = (both.T @ G.reshape(P, F * F)).view(hJ, hJ, F, F).permute(0, 2, 1, 3)
        return H.reshape(1, hJ * F, hJ * F)

    def sample_norms(self):
        """``||D_i||^2``, the squared norm of every sample's gated design row (N,): ``||x_iK||^2 sum_j M_ij^2``."""
        out = torch.empty(self.N, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            out[s:e] = torch.linalg.vector_norm(self.rows(s, e), dim=1).square_()
        return out if self.mask is None else out * self.mask.square().sum(dim=1)

    def block_norms(self):
        """``||A_g||`` for every block (gate j, token k), shape ``(|J|, |K|)``, float64:
        ``sqrt(lambda_max(sum_i M_ij x_ik x_ik^T))`` (the same for every output l)."""
        grams = torch.zeros(self.hJ, self.nK, self.d, self.d, dtype=self.dtype, device=self.device)
        for s, e in self.bounds:
            Xc = self.rows(s, e).reshape(e - s, self.nK, self.d).transpose(0, 1)  # (K, rows, d)
            for j in range(self.hJ):  # one batched product per gate, never (J, K, rows, d)
                Xm = Xc if self.mask is None else Xc * self.mask[s:e, j][None, :, None]
                grams[j] += Xm.transpose(1, 2) @ Xc
        if self.shards is not None:
            self.shards.sum_(grams)
        lam = torch.linalg.eigvalsh(grams.to(F64))[..., -1]
        return torch.sqrt(torch.clamp(lam, min=0.0))

    def block_norm_bounds(self):
        """The cheaper upper bounds ``||A_g||_F >= ||A_g||``, shape ``(|J|, |K|)``, float64."""
        acc = torch.zeros(self.hJ, self.nK, dtype=F64, device=self.device)
        for s, e in self.bounds:
            sq = torch.linalg.vector_norm(self.rows(s, e).view(e - s, self.nK, self.d), dim=-1).square_().to(F64)
            acc += sq.sum(dim=0)[None] if self.mask is None else self.mask[s:e].T.to(F64) @ sq
        if self.shards is not None:
            self.shards.sum_(acc)
        return torch.sqrt(acc)


def one_hot_tokens(X):
    """Token ids of shape (N, n) when every token of ``X`` (N, n, d) is a one-hot vector, else None."""
    X = np.asarray(X)
    if X.ndim != 3 or X.size == 0 or not np.all((X == 0) | (X == 1)) or not np.all(X.sum(axis=2) == 1):
        return None
    return X.argmax(axis=2)


class TokenOperator(_SampleOperator):
    """The map of :class:`AttentionOperator` for one-hot tokens, by lookups: ``<Z[j, l, k], x_ik>`` is
    ``Z[j, l, k, t_ik]`` for the token id ``t_ik``.

    For each token position k the samples are grouped by token id (``U`` groups padded to ``m`` rows);
    the forward map is then one batched product ``(U, m, |J|) @ (U, |J|, c)`` per position and the
    adjoint its transpose: ``n N |J| c`` multiply-adds instead of ``N n d |J| c``.

    Parameters
    ----------
    tokens : int64 tensor (N, n) of token ids in [0, d)
    d : token dimension
    K : tensor of positions, or None for every position
    mask : tensor ``(N, |J|)`` of the gate columns J, or None (programs (8)/(10))
    c : outputs
    shards : None, or the data shards of a distributed solve (as for :class:`AttentionOperator`)
    """

    def __init__(self, tokens, d, K, mask, c, device, dtype, shards=None):
        self.tokens, self.d, self.K, self.mask, self.c, self.shards = tokens, d, K, mask, c, shards
        self.device, self.dtype = device, dtype
        self.N, n = tokens.shape
        self.positions = list(range(n)) if K is None else [int(k) for k in K]
        self.nK, self.hJ = len(self.positions), 1 if mask is None else mask.shape[1]
        self.F = self.nK * d
        M = torch.ones(self.N, 1, dtype=dtype, device=device) if mask is None else mask.to(dtype)
        Mpad = torch.cat([M, torch.zeros(1, self.hJ, dtype=dtype, device=device)])
        self.groups = []  # per position: token ids u (U,), rows (U, m) padded with N, masks (U, m, |J|)
        for k in self.positions:
            t = tokens[:, k]
            u, inverse, counts = torch.unique(t, return_inverse=True, return_counts=True)
            order = torch.argsort(inverse, stable=True)
            start = torch.cumsum(counts, 0) - counts
            rank = torch.arange(self.N, device=device) - start[inverse[order]]
            rows = torch.full((len(u), int(counts.max())), self.N, dtype=torch.long, device=device)
            rows[inverse[order], rank] = order
            self.groups.append((u, rows, Mpad[rows]))

    def restrict(self, J, K, dtype=None, chunk=None):
        """The operator of gates J and positions K of this one (K: positions of the full sequence)."""
        M = self.mask
        if M is not None and len(J) != M.shape[1]:
            M = M.index_select(1, torch.as_tensor(J, device=M.device))
        K = None if len(K) == self.tokens.shape[1] else torch.as_tensor(K)
        return TokenOperator(self.tokens, self.d, K, M, self.c, self.device, dtype or self.dtype, self.shards)

    def forward(self, Z):
        """``yhat`` (N, c) from ``Z`` of shape ``(|J|, c, |K|, d)``."""
        Zt = Z.permute(2, 3, 0, 1).contiguous()                                   # (|K|, d, |J|, c)
        out = torch.zeros(self.N + 1, self.c, dtype=Z.dtype, device=self.device)
        for kk, (u, rows, Mg) in enumerate(self.groups):
            out.index_add_(0, rows.reshape(-1), torch.bmm(Mg, Zt[kk].index_select(0, u)).reshape(-1, self.c))
        return out[:self.N]

    def adjoint(self, V):
        """``A^T V`` of shape ``(|J|, c, |K|, d)`` from ``V`` of shape (N, c)."""
        Vpad = torch.cat([V, torch.zeros(1, self.c, dtype=V.dtype, device=V.device)])
        Gt = torch.zeros(self.nK, self.d, self.hJ, self.c, dtype=V.dtype, device=self.device)
        for kk, (u, rows, Mg) in enumerate(self.groups):
            Gt[kk].index_copy_(0, u, torch.bmm(Mg.transpose(1, 2), Vpad[rows]))
        if self.shards is not None:
            self.shards.sum_(Gt)
        return Gt.permute(2, 3, 0, 1).contiguous()

    def block_norms(self):
        """``||A_g||`` per (gate j, position k), float64: ``sqrt(max_v #{i : M_ij = 1, t_ik = v})``
        (the Gram matrix of a one-hot block is diagonal)."""
        if self.shards is not None:  # counts per token id summed over the shards, then the largest
            counts = torch.zeros(self.hJ, self.nK, self.d, dtype=F64, device=self.device)
            for kk, (u, _, Mg) in enumerate(self.groups):
                counts[:, kk, u] = Mg.to(F64).sum(dim=1).T
            return torch.sqrt(self.shards.sum_(counts).amax(dim=2))
        return torch.stack([torch.sqrt(Mg.to(F64).sum(dim=1).amax(dim=0)) for _, _, Mg in self.groups], dim=1)

    def block_norm_bounds(self):
        """``||A_g||_F = sqrt(sum_i M_ij)`` per (gate j, position k), float64."""
        if self.shards is not None:
            sums = torch.stack([Mg.to(F64).sum(dim=(0, 1)) for _, _, Mg in self.groups], dim=1)
            return torch.sqrt(self.shards.sum_(sums))
        return torch.stack([torch.sqrt(Mg.to(F64).sum(dim=(0, 1))) for _, _, Mg in self.groups], dim=1)


class AttentionProgram(Program):
    """Program (8), (10) or (12): ``yhat_il = sum_j M_ij <Z[j, l], X_i>`` with the group lasso.

    Parameters
    ----------
    number : {8, 10, 12}
    X : ndarray of shape (N, n, d)
    n_outputs : int, the number c of outputs per sample
    U1, U2 : gate vectors of program (12), shapes (h, n) and (h, d); None otherwise
    """

    regularizer_class = GroupLasso
    support_label = "nonzero groups"
    operator_class = (AttentionOperator, TokenOperator)
    gate_array_kinds = {"U1": "gate vectors", "U2": "gate vectors"}  # program (12)'s

    @classmethod
    def build(cls, number, X, y, T, U1=None, U2=None, gates=None, gate_seed=0):
        """Program ``number`` on validated data (``make_problem``): c = ``T.shape[1]`` outputs; for (12)
        the gates ``U1``, ``U2``, checked, or sampled from ``gates`` (default 8) and ``gate_seed``."""
        if number != 12:
            return cls(number, X, T.shape[1])
        n, d = X.shape[1:]
        if U1 is None and U2 is None:
            gates = check_int("gates", 8 if gates is None else gates, 1)
            U1, U2 = sample_gates(gates, n, d, gate_seed)
        elif U1 is None or U2 is None:
            raise invalid("U1, U2", "both gate matrices or neither", "only one of them")
        else:
            U1 = check_array("U1", U1, 2, "shape (h, n)")
            U2 = check_array("U2", U2, 2, "shape (h, d)")
            if U1.shape[1] != n or U2.shape[1] != d or U1.shape[0] != U2.shape[0]:
                raise invalid("U1, U2", f"shapes (h, {n}) and (h, {d})", f"{U1.shape} and {U2.shape}")
        return cls(12, X, T.shape[1], U1, U2)

    @classmethod
    def loss_hint(cls, number, loss):
        """What to do instead when program ``number`` does not take the loss named ``loss``."""
        return "use program 10 or 12 for several outputs"

    @classmethod
    def gate_bytes(cls, X, y, T):
        """Per gate of program (12) (measured against peaks in docs/benchmark_gate_memory.md): u1, u2; its
        column of the mask (N, as booleans and float64) and of a working set's or the recovery's copy,
        20 bytes a sample in all; per chunk of samples (at most 256 with many gates), the gated weights
        and outputs (c each); Z's slice (c n d) and a dozen copies (solver, screening, certificate)."""
        N, n, d = X.shape
        c = T.shape[1]
        return 8 * (n + d) + 20 * N + 8 * 3 * c * min(N, 256) + 8 * 12 * c * n * d

    @classmethod
    def check_targets(cls, number, y):
        """Program (8) has a scalar output: targets of shape (N,)."""
        if number == 8 and y.ndim != 1:
            raise invalid("y", "shape (N,) for program (8) (scalar output)", f"shape {y.shape}",
                          "use program 10 for vector or sequence targets")

    def __init__(self, number, X, n_outputs, U1=None, U2=None):
        super().__init__(X)
        self.name = self.number = number
        self.scalar_output = number == 8
        self.N, self.n, self.d = X.shape
        self.c = self.n_outputs = n_outputs
        self.U1, self.U2 = U1, U2
        self.mask = None if U1 is None else gate_mask(X, U1, U2)
        self.h = 1 if U1 is None else U1.shape[0]
        self._tokens = False  # one_hot_tokens(X), computed with the first operator

    def gate_arrays(self):
        return {} if self.U1 is None else {"U1": self.U1, "U2": self.U2}

    @property
    def label(self):
        return f"program ({self.number})"

    @property
    def canonical_shape(self):
        return (self.h, self.c, self.n, self.d)

    @property
    def shape(self):
        """The shape of the coefficients Z of this program."""
        return {8: (self.n, self.d), 10: (self.c, self.n, self.d)}.get(self.number, self.canonical_shape)

    @property
    def n_blocks(self):
        """Number of groups, h*c*n."""
        return self.h * self.c * self.n

    def on(self, X):
        """The same program (same gates) on other data ``X`` (N', n, d), e.g. a test split."""
        return type(self)(self.number, np.asarray(X, dtype=float), self.c, self.U1, self.U2)

    def on_features(self):
        """``(Q, program)``: the program on fewer coordinates per token, where that pays, else None.

        ``Q`` (n, d, r) holds, per token k, an orthonormal basis of the span of its data ``{x_ik}_i`` (of
        dimension r_k <= min(N, d); columns beyond r_k are zero, r the largest); ``program`` is this program
        (same gates, masks and outputs) on the coordinates ``Q_k^T x_ik``. Every optimum lies in that span:
        the outputs read ``Z[j, l, k]`` only through ``x_ik``, and the part of Z outside the span only adds to
        the regulariser (a group norm, or the nuclear norm of a token's matrix, strictly falls when Z is
        projected onto it). So ``Z[.., k, :] = Z'[.., k, :] Q_k^T`` maps the solutions Z' of the smaller program
        onto this one's with the same objective, outputs and dual points (:meth:`lift`, :meth:`restrict`).
        It pays where r <= d / 2 (fewer samples than coordinates: the native width of a language model,
        d = 384, with a few hundred sequences). Not for data this program does not hold as one array
        (memory maps, shards) or one-hot tokens (:class:`TokenOperator` already reads them by lookups)."""
        if getattr(self, "_features", False) is False:
            self._features = None
            N, n, d = self.X.shape
            if self.shards is None and not file_backed(self.X) and 2 * N <= d and one_hot_tokens(self.X) is None:
                _, s, Vh = np.linalg.svd(np.asarray(self.X, dtype=float).transpose(1, 0, 2), full_matrices=False)
                ranks = np.sum(s > s[:, :1] * max(N, d) * np.finfo(float).eps, axis=1)
                r = max(int(ranks.max()), 1)
                Q = np.swapaxes(Vh[:, :r], 1, 2) * (np.arange(r) < ranks[:, None])[:, None, :]  # (n, d, r)
                small = copy.copy(self)
                small.X = np.einsum("ikd,kdr->ikr", self.X, Q)
                small.X.flags.writeable = False
                small.d, small._ops, small._block_norms, small._log_norm, small._features = r, {}, None, None, None
                self._features = (Q, small)
        return self._features

    def lift(self, Z, Q):
        """Coefficients of this program from those of :meth:`on_features`'s program: ``Z'[.., k, :] Q_k^T``."""
        return np.einsum("...kr,kdr->...kd", Z, Q)

    def restrict(self, Z, Q):
        """The coordinates of this program's Z in :meth:`on_features`'s bases: ``Z[.., k, :] Q_k``."""
        return np.einsum("...kd,kdr->...kr", Z, Q)

    def _make_operator(self, Xs, device, chunk):
        mask = None if self.mask is None else torch.from_numpy(self.mask).to(device=device, dtype=Xs.dtype)
        if self._tokens is False:  # (a memory map is never scanned whole; every shard must agree)
            self._tokens = None if file_backed(self.X) else one_hot_tokens(self.X)
            if self.shards is not None and not self.shards.all_(self._tokens is not None):
                self._tokens = None
        if self._tokens is not None:
            tokens = torch.from_numpy(self._tokens).to(device)
            return TokenOperator(tokens, self.d, None, mask, self.c, device, Xs.dtype, self.shards)
        return AttentionOperator(Xs, None, mask, self.c, device, chunk, self.shards)

    def block_norms(self):
        """``||A_g||`` for every group g, shape ``shape[:-1]`` (numpy; exact, cached): the spectral norm
        of ``V[:, l] -> (A^T V)_g``, ``sqrt(lambda_max(sum_i M_ij x_ik x_ik^T))``; used by gap-safe screening."""
        if self._block_norms is None:
            norms = self.operator().block_norms().numpy()  # (h, n)
            self._block_norms = np.broadcast_to(norms[:, None, :], self.canonical_shape[:3]).reshape(self.shape[:-1])
        return self._block_norms

    # --- CVXPY faces: the variable W of shape (h*n*d, c), W[(j*n + k)*d + e, l] = Z[j, l, k, e] ----
    cvxpy_formulations = ("direct",)  # CVXPY maps offered (the squared loss is also compressed)

    def design(self, start=0, stop=None):
        """Dense design rows of samples ``start:stop``, shape (rows, h*n*d): column ``(j*n + k)*d + e``
        is ``M_ij X[i, k, e]``, so that the map is ``design @ W``. Only those rows of X are read."""
        X_flat = self.X[start:stop].reshape(-1, self.n * self.d)
        if self.mask is None:
            return X_flat
        return (self.mask[start:stop, :, None] * X_flat[:, None, :]).reshape(len(X_flat), self.h * self.n * self.d)

    def cvxpy_variable(self):
        import cvxpy as cp

        return cp.Variable((self.h * self.n * self.d, self.c), name="Z")

    def cvxpy_forward(self, W):
        """``yhat`` (N, c) as a CVXPY expression: the dense design times W."""
        return self.design() @ W

    def cvxpy_adjoint(self, V):
        """``A^T V`` in the layout of the variable, from a CVXPY expression V (N, c)."""
        return self.design().T @ V

    def cvxpy_blocks(self, W):
        """The groups as the columns of a (d, h*n*c) expression: column ``j*n + k + l*h*n`` is group (j, l, k)."""
        import cvxpy as cp

        return cp.reshape(W, (self.d, self.h * self.n * self.c), order="F")

    def from_cvxpy(self, W):
        """Z (public shape) from a value of the CVXPY variable."""
        h, c, n, d = self.canonical_shape
        return np.asarray(W, dtype=float).reshape(h, n, d, c).transpose(0, 3, 1, 2).reshape(self.shape).copy()

    def to_cvxpy(self, Z):
        """The value of the CVXPY variable for coefficients Z (public shape)."""
        return np.asarray(Z, dtype=float).reshape(self.canonical_shape).transpose(0, 2, 3, 1).reshape(-1, self.c)

    def from_blocks(self, B):
        """Z (public shape) from a (d, h*n*c) value in the layout of :meth:`cvxpy_blocks`."""
        return self.from_cvxpy(np.asarray(B).reshape(-1, self.c, order="F"))


@dataclass
class AttentionHeads:
    """Heads of the network (6)/(9)/(11).

    W1 : ndarray of shape (m, n), attention rows on the simplex
    W2 : ndarray of shape (m, d), value vectors
    W3 : ndarray of shape (m, c), output vectors
    gate : ndarray of shape (m,) of ints indexing rows of U1, U2 (network (11)); None otherwise
    form : "balanced" or "lemma1", which penalty the weights are scaled for
    """

    W1: np.ndarray
    W2: np.ndarray
    W3: np.ndarray
    gate: np.ndarray = None
    form: str = "balanced"

    @property
    def heads(self):
        return self.W1.shape[0]


def _bilinear(W1, X, W2):
    """``w_1j^T X_i w_2j`` of shape (N, m) for rows ``W1`` (m, n), ``W2`` (m, d) and ``X`` (N, n, d): one BLAS
    product of the samples ``(N, n d)`` with the heads' outer products ``w_1j w_2j^T`` (n d, m), all heads at
    once (chunks of heads whose outer products take at most a few MB)."""
    N, n, d = X.shape
    m = W1.shape[0]
    flat = X.reshape(N, n * d)
    if m == 0:
        return np.zeros((N, 0))
    step = max(1, CHUNK_BYTES // (8 * n * d))
    if m <= step:
        return flat @ (W1[:, :, None] * W2[:, None, :]).reshape(m, n * d).T
    out = np.empty((N, m))
    for s in range(0, m, step):
        out[:, s:s + step] = flat @ (W1[s:s + step, :, None] * W2[s:s + step, None, :]).reshape(-1, n * d).T
    return out


ROW_ROUNDINGS = 256  # how far attention rows may be off the simplex: this many roundings of their precision per entry


def simplex_rows(W1, name="weights.W1"):
    """Attention rows ``W1`` (m, n), float64, on the simplex: rows within rounding of it, ``ROW_ROUNDINGS * eps *
    n`` (eps of float32 when every entry is a float32 number, as torch's softmax gives them, else of float64),
    are projected onto it in float64 (rows on it are kept as they are); rows further off are refused."""
    m, n = W1.shape
    if not m:
        return W1
    with np.errstate(over="ignore"):
        single = np.array_equal(W1, W1.astype(np.float32))
    precision = "float32" if single else "float64"
    tol = ROW_ROUNDINGS * np.finfo(precision).eps * n
    sums = W1.sum(axis=1)
    if W1.min() < -tol or np.max(np.abs(sums - 1.0)) > tol:
        raise invalid(name, f"attention rows on the simplex (nonnegative, summing to 1 within {tol:.2g}, the "
                      f"rounding of {precision} rows of {n})",
                      f"min {W1.min():.3g}, row sums off by {np.max(np.abs(sums - 1)):.3g}",
                      "only such networks are bounded by the program; parametrise each row as a softmax "
                      "of logits, or project it onto the simplex")
    off = (W1.min(axis=1) < 0) | (sums != 1.0)
    if off.any():
        W1 = W1.copy()
        W1[off] = project_rows_to_simplex(W1[off])
    return W1


class Proposition1(Reduction):
    """Proposition 1 of Ergen et al.: networks (6)/(9) and (11) <-> programs (10) (or (8)) and (12)."""
    heads = AttentionHeads

    forms = ("balanced", "lemma1")
    networks = {"alternative": 10, "alternative_scalar": 8, "gated": 12}
    equations = {8: "(9)", 10: "(9)", 12: "(11)"}
    penalty = ("beta/2 sum_j (||w_2j||^2 + ||w_3j||_1^2), an l1 norm squared on each head's output vector; a "
               "network trained with ordinary weight decay (||w_3j||_2^2, as AdamW or torch's weight_decay give) is "
               "bounded by program 10wd (12wd with gates) instead")

    @classmethod
    def penalty_of(cls, problem, weights):
        """The penalty of the heads ``weights`` in their form: ``beta/2 sum_j (||w_2j||^2 + ||w_3j||_1^2)``
        (balanced), or ``beta sum_j ||w_2j|| ||w_3j||_1`` (Lemma 1, value vectors normalised first)."""
        W2, W3 = weights.W2, np.abs(weights.W3).sum(axis=1)
        if weights.form == "balanced":
            return 0.5 * problem.beta * float(np.sum(W2 ** 2) + np.sum(W3 ** 2))
        return problem.beta * float(np.linalg.norm(W2, axis=1) @ W3)

    @classmethod
    def coefficients(cls, problem, weights):
        """Coefficients Z (the program's shape) that the network (9) (programs (8)/(10)) or (11)
        (program (12), on the program's gates) with heads ``weights`` implements:

        ``Z[g, l, k] = sum_{j: gate(j) = g} w_3j[l] w_1j[k] w_2j``

        The network's output is the program's ``forward(Z)``; with the attention rows ``w_1j`` on the
        simplex, ``||Z[g, l, k]||`` summed is at most ``sum_j ||w_2j|| ||w_3j||_1``, so P(Z) is at
        most the network's objective in either form (checked here: rows off the simplex are refused;
        rows within their precision's rounding of it, e.g. float32 softmaxes, are projected onto it in
        float64 first, :func:`simplex_rows`, and :meth:`objective` evaluates the same projected rows).
        """
        program = problem.program
        network = cls.equations.get(program.name, "(9)/(11)")
        if not isinstance(weights, AttentionHeads):
            raise invalid("weights", f"AttentionHeads (W1, W2, W3), the heads of network {network}, for {program.label}",
                          type(weights).__name__)
        cls.check_form(weights.form, "weights.form")
        h, c, n, d = program.canonical_shape
        W1, W2, W3 = (np.asarray(a, dtype=float) for a in (weights.W1, weights.W2, weights.W3))
        m = W1.shape[0] if W1.ndim == 2 else -1
        if W1.shape != (m, n) or W2.shape != (m, d) or W3.shape != (m, c):
            raise invalid("weights", f"W1, W2, W3 of shapes (m, {n}), (m, {d}), (m, {c}) for {program.label}",
                          f"{W1.shape}, {W2.shape}, {W3.shape}")
        for name, W in (("W1", W1), ("W2", W2), ("W3", W3)):
            if not np.all(np.isfinite(W)):
                raise invalid(f"weights.{name}", "finite values", "NaN/Inf entries")
        W1 = simplex_rows(W1)
        gate = weights.gate
        if (gate is None) != (program.mask is None):
            raise invalid("weights.gate", f"each head's gate for {program.label}" if program.mask is not None else
                          f"no gates for {program.label}", "None" if gate is None else "gates",
                          "networks without gates are bounded by a program without them ((8), (10)), gated ones "
                          "by one with their gates ((12))")
        gate = np.zeros(m, dtype=int) if gate is None else np.asarray(gate)
        if gate.shape != (m,) or (m and (gate.dtype.kind not in "iu" or gate.min() < 0 or gate.max() >= h)):
            raise invalid("weights.gate", f"{m} integers in [0, {h}) (rows of the program's U1, U2)",
                          f"shape {gate.shape}, dtype {gate.dtype}")
        return cls.sum_heads(W1, W2, W3, gate, h).reshape(program.shape)

    @staticmethod
    def sum_heads(W1, W2, W3, gate, h):
        """``Z[g, l, k] = sum_{j: gate(j) = g} w_3j[l] w_1j[k] w_2j`` of shape (h, c, n, d), unchecked:
        the one implementation behind :meth:`coefficients` and the networks' ``effective_coefficients``."""
        Z = np.zeros((h, W3.shape[1], W1.shape[1], W2.shape[1]))
        for g in range(h):  # one (c, d) product per gate and token: memory of Z plus one head block
            on = gate == g
            for k in range(W1.shape[1]):
                rows = on & (W1[:, k] != 0)  # attention rows are often vertices of the simplex
                Z[g, :, k] = W3[rows].T @ (W1[rows, k, None] * W2[rows])
        return Z

    @classmethod
    def invert(cls, problem, Z, form="balanced"):
        """The heads of Proposition 1 from coefficients Z (the program's shape)."""
        cls.check_form(form)
        program = problem.program
        Z4 = np.asarray(Z, dtype=float).reshape(program.canonical_shape)
        h, c, n, d = Z4.shape
        norms = np.linalg.norm(Z4, axis=-1)
        j, l, k = np.nonzero(norms)
        z, r = Z4[j, l, k], norms[j, l, k]
        scale = np.sqrt(r) if form == "balanced" else r
        return AttentionHeads(W1=np.eye(n)[k], W2=z / scale[:, None], W3=np.eye(c)[l] * scale[:, None],
                              gate=j if program.mask is not None else None, form=form)

    @classmethod
    def objective(cls, problem, weights):
        """Objective (6)/(9) (or (11) with gates) of a network with the given heads.

        ``sum_i L(sum_j g_ij (w_1j^T X_i w_2j) w_3j, y_i) + penalty``, with ``g_ij = 1`` for (6)/(9)
        and ``g_ij = 1[u_1,gate(j)^T X_i u_2,gate(j) >= 0]`` for (11). The penalty of the balanced form
        is ``beta/2 sum_j (||w_2j||^2 + ||w_3j||_1^2)``. Lemma 1's penalty ``beta ||w_3j||_1`` holds for
        unit value vectors; other heads are first normalised (``w_2j / ||w_2j||``, ``w_3j ||w_2j||``:
        the same outputs, the smallest penalty the form allows), so it is ``beta sum_j ||w_2j|| ||w_3j||_1``.
        """
        cls.check_form(weights.form, "weights.form")
        program = problem.program
        W2, W3 = (np.asarray(a, dtype=float) for a in (weights.W2, weights.W3))
        W1 = simplex_rows(np.asarray(weights.W1, dtype=float))  # the rows coefficients() certifies
        Yhat = np.empty((program.N, W3.shape[1]))
        step = max(1, 2**20 // max(1, program.X[:1].size + W1.shape[0]))  # X may be a memory map
        for s in range(0, program.N, step):
            X = np.asarray(program.X[s:s + step], dtype=float)
            scores = _bilinear(W1, X, W2)
            if weights.gate is not None:
                U1, U2 = program.U1[weights.gate], program.U2[weights.gate]
                scores *= _bilinear(U1, X, U2) >= 0
            Yhat[s:s + step] = scores @ W3
        return problem.loss.value(Yhat, problem.T) + cls.penalty_of(problem, weights)


# cases: the (loss, target kind) pairs of cvxtransformer.testing.CASES
register(8, AttentionProgram, Proposition1, ("squared", "logistic"),
         cases=(("squared", "scalar"), ("logistic", "binary")))
register(10, AttentionProgram, Proposition1, ALL_LOSSES,
         cases=(("squared", "vector"), ("squared", "sequence"), ("cross_entropy", "classes"), ("logistic", "binary")))
register(12, AttentionProgram, Proposition1, ALL_LOSSES, ("U1", "U2", "gates", "gate_seed"),
         cases=(("squared", "vector"), ("cross_entropy", "classes"), ("logistic", "binary")))


# ---- ordinary weight decay: the programs "10wd" and "12wd" (docs/conventions.md, the last section) ----------

class WeightDecayProgram(AttentionProgram):
    """Program ``"10wd"`` or ``"12wd"``: the map of program (10) or (12) with a nuclear norm per token,

        P(Z) = sum_i L(yhat_i, y_i) + beta sum_j sum_k ||Z[j, :, k, :]||_*

    the convex program of networks (9w)/(11w), the attention networks (9)/(11) with ordinary weight decay
    ``beta/2 sum_j (||w_2j||^2 + ||w_3j||_2^2)`` (:class:`WeightDecayReduction`). Z, its shapes, the map, its
    torch operators and the CVXPY design are those of program (10) (``(c, n, d)``) or (12) (``(h, c, n, d)``);
    the regulariser is :class:`~.regularizers.TokenNuclearNorm`. With one output (c = 1) it is program (10)
    (or (12)) itself; the logistic loss, which has one output, is refused (use program 8 or 12).

    Parameters
    ----------
    number : 10 or 12, the program whose map it has
    X, n_outputs, U1, U2 : as :class:`AttentionProgram`
    """

    regularizer_class = TokenNuclearNorm
    support_label = "rank, summed over the tokens"
    names = {10: "10wd", 12: "12wd"}  # the program of each map

    @classmethod
    def build(cls, name, X, y, T, **options):
        """Program ``"10wd"`` or ``"12wd"`` on validated data (``make_problem``), as program (10) or (12)."""
        return super().build(int(name[:-2]), X, y, T, **options)

    @classmethod
    def loss_hint(cls, name, loss):
        return ("with one output a nuclear norm is a Euclidean norm: this program with the logistic loss is "
                "program (8) (12wd is (12)); use program 8 or 12")

    def __init__(self, number, X, n_outputs, U1=None, U2=None):
        super().__init__(number, X, n_outputs, U1, U2)
        self.name = f"{number}wd"

    @property
    def label(self):
        return f"program ({self.name})"

    @property
    def n_blocks(self):
        """Number of singular directions, ``h n min(c, d)``."""
        return self.h * self.n * min(self.c, self.d)

    def block_norms(self):
        """``||A_g||`` for every token block g = (gate j, token k), shape ``shape[:-3] + (n,)`` (numpy, exact,
        cached): the map of the block's ``c x d`` matrix is the identity on the outputs times the group map of
        program (10)/(12), so its norm is that group's. Used by the rank screening of each token's matrix."""
        if self._block_norms is None:
            self._block_norms = self.operator().block_norms().numpy().reshape(self.shape[:-3] + (self.n,))
        return self._block_norms

    def cvxpy_blocks(self, W):
        """The token matrices as a (h*n, d, c) expression: block ``j*n + k`` is ``Z[j, :, k, :]^T``."""
        import cvxpy as cp

        return cp.reshape(W, (self.h * self.n, self.d, self.c), order="C")

    def from_blocks(self, B):
        """Z (public shape) from a (h*n, d, c) value in the layout of :meth:`cvxpy_blocks`."""
        return self.from_cvxpy(np.asarray(B).reshape(-1, self.c))


class WeightDecayReduction(Proposition1):
    """Networks (9w)/(11w) <-> programs 10wd/12wd: networks (9)/(11) with ordinary weight decay.

    A network's heads give ``Z[g, :, k, :] = sum_{j: gate(j) = g} w_1j[k] w_3j w_2j^T`` (:meth:`coefficients`,
    as Proposition 1), the same outputs, and, the attention rows summing to 1,
    ``sum_k ||Z[g, :, k, :]||_* <= sum_j ||w_3j|| ||w_2j|| <= sum_j (||w_2j||^2 + ||w_3j||^2) / 2``: P(Z) is
    at most the network's objective. The SVD of each token's matrix, ``sum_r s_r a_r b_r^T``, gives heads
    ``w_1 = e_k``, ``w_2 = sqrt(s_r) b_r``, ``w_3 = sqrt(s_r) a_r`` (balanced) or ``w_2 = b_r``,
    ``w_3 = s_r a_r`` (Lemma-1 form, penalty ``beta ||w_3||_2``) that attain it (:meth:`invert`): one head per
    singular direction, ``sum_k rank(Z*[:, k, :])`` heads in all.
    """

    networks = {"alternative_wd": "10wd", "gated_wd": "12wd"}
    equations = {"10wd": "(9w)", "12wd": "(11w)"}
    penalty = ("beta/2 sum_j (||w_2j||^2 + ||w_3j||_2^2), ordinary weight decay on every weight (as AdamW or "
               "torch's weight_decay give)")

    @classmethod
    def penalty_of(cls, problem, weights):
        """``beta/2 sum_j (||w_2j||^2 + ||w_3j||^2)`` (balanced) or ``beta sum_j ||w_2j|| ||w_3j||`` (Lemma 1)."""
        if weights.form == "balanced":
            return 0.5 * problem.beta * float(np.sum(weights.W2 ** 2) + np.sum(weights.W3 ** 2))
        return problem.beta * float(np.linalg.norm(weights.W2, axis=1) @ np.linalg.norm(weights.W3, axis=1))

    @classmethod
    def invert(cls, problem, Z, form="balanced"):
        """One head per singular direction of each token's matrix (the class docstring)."""
        cls.check_form(form)
        program = problem.program
        h, c, n, d = program.canonical_shape
        Z4 = np.asarray(Z, dtype=float).reshape(h, c, n, d)
        U, s, Wh = np.linalg.svd(TokenNuclearNorm.tokens(Z4), full_matrices=False)  # token matrices (h, n, c, d)
        j, k, r = np.nonzero(np.arange(s.shape[-1]) < TokenNuclearNorm.ranks(Z4)[..., None])
        sigma = s[j, k, r]
        root = np.sqrt(sigma) if form == "balanced" else np.ones_like(sigma)
        return AttentionHeads(W1=np.eye(n)[k], W2=Wh[j, k, r] * root[:, None], W3=U[j, k, :, r] * (sigma / root)[:, None],
                              gate=j if program.mask is not None else None, form=form)


register("10wd", WeightDecayProgram, WeightDecayReduction, ("squared", "cross_entropy"),
         cases=(("squared", "vector"), ("squared", "sequence"), ("cross_entropy", "classes")))
register("12wd", WeightDecayProgram, WeightDecayReduction, ("squared", "cross_entropy"), ("U1", "U2", "gates", "gate_seed"),
         cases=(("squared", "vector"), ("cross_entropy", "classes")))
