"""Regularisers: the group lasso of programs (8), (10), (12) and the nuclear norm of the linear and
gated multi-head self-attention programs (docs/conventions.md). One object per regulariser.

A regulariser ``R`` (weight ``beta`` included) knows its value, its proximal operator, its
dual norm (the dual constraint is ``dual_norm(A^T V) <= beta``), the KKT residuals of
docs/conventions.md, the size of the support of a solution, a gap-safe screening test, and its CVXPY
forms. Its *blocks* are what a solution can switch off: the groups of the group lasso, the
singular directions of each matrix of the nuclear norm. Numerical methods take numpy arrays or torch
tensors (:func:`cvxtransformer.core.arrays.numpy_face`).

Example
-------
>>> import numpy as np
>>> reg = GroupLasso(beta=1.0)
>>> reg.prox(np.array([[3.0, 4.0], [0.3, 0.4]]), step=1.0)   # the second group is set to zero
array([[2.4, 3.2],
       [0. , 0. ]])
"""
import numpy as np
import torch

from .arrays import F64, numpy_face

SCREENING_MARGIN = 1e-9  # relative margin of every screening test: rounding never discards an active block


class Regularizer:
    """``R(Z) = beta * norm(Z)``; see the module docstring. A subclass sets ``name`` and defines the
    faces of :data:`~.contracts.REGULARIZER_FACES` (checked when a family using it is registered)."""

    name = None
    block_ndim = None  # the trailing axes of Z that one block spans (read by core.design)
    # the layout in which the torch backend's Gram representation (squared loss) hands it coefficients: "outputs"
    # ((c, |J|, |K|, d): each block within one output, so the Newton model and polish apply too), "canonical"
    # (the operator's (|J|, c, |K|, d): blocks spanning the outputs), or None (no Gram representation)
    gram_layout = None

    def __init__(self, beta):
        self.beta = float(beta)

    def with_beta(self, beta):
        return type(self)(beta)

    def value(self, Z):
        """``beta * norm(Z)`` (a float, or a float64 0-d tensor)."""
        return self.beta * self.norm(Z)

    def __repr__(self):
        return f"{type(self).__name__}(beta={self.beta:g})"


class GroupLasso(Regularizer):
    """``R(Z) = beta * sum_g ||z_g||_2`` over the groups of ``Z``: the vectors along its last axis.

    Dual norm ``max_g ||g_g||_2``; blocks are the groups (shape ``Z.shape[:-1]``).
    """

    name = "group_lasso"
    block_ndim = 1  # a block (group) spans the last axis of Z
    gram_layout = "outputs"

    @staticmethod
    def group_norms(Z):
        """Euclidean norm of every group: shape ``Z.shape[:-1]``."""
        return torch.linalg.vector_norm(Z, dim=-1) if isinstance(Z, torch.Tensor) else np.linalg.norm(Z, axis=-1)

    @numpy_face
    def norm(self, Z):
        return torch.sum(torch.linalg.vector_norm(Z, dim=-1), dtype=F64)

    @numpy_face
    def prox(self, Z, step):
        """Group soft-thresholding: ``argmin_W step*R(W) + 1/2 ||W - Z||^2`` (exact zeros)."""
        norms = torch.linalg.vector_norm(Z, dim=-1, keepdim=True)
        return Z * torch.clamp_min(1.0 - step * self.beta / norms, 0.0)  # norm 0: 1 - inf, clamped to 0

    @numpy_face
    def dual_norm(self, G):
        """``max_g ||G_g||_2`` (0 for no groups)."""
        return torch.amax(torch.linalg.vector_norm(G, dim=-1)).to(F64) if G.numel() else torch.zeros((), dtype=F64)

    def kkt_residuals(self, Z, G):
        """(stationarity on the support, dual feasibility off it), relative to beta (docs/conventions.md).

        ``G = A^T(-grad L(yhat(Z)))``; stationarity ``max ||G_g - beta z_g/||z_g|| ||/beta`` over the
        support, feasibility ``max(0, ||G_g|| - beta)/beta`` off it (arrays; floats, in numpy: the verifier's).
        """
        Z, G = np.asarray(Z, dtype=float), np.asarray(G, dtype=float)
        norms = np.linalg.norm(Z, axis=-1)
        support = norms > 0
        stationarity = feasibility = 0.0
        if support.any():
            direction = Z[support] / norms[support][:, None]
            stationarity = float(np.max(np.linalg.norm(G[support] - self.beta * direction, axis=-1)))
        if not support.all():
            feasibility = max(0.0, float(np.max(np.linalg.norm(G[~support], axis=-1))) - self.beta)
        return stationarity / self.beta, feasibility / self.beta

    @staticmethod
    def support_size(Z):
        """Number of nonzero groups."""
        return int(np.count_nonzero(np.linalg.norm(np.asarray(Z), axis=-1)))

    def screen(self, G, radius, block_norms):
        """Gap-safe sphere test: groups proved zero at every optimum (boolean, shape ``G.shape[:-1]``).

        The dual optimum lies within ``radius`` of the feasible point whose ``A^T V`` is ``G``, so
        ``||G_g|| + radius ||A_g|| < beta`` proves ``z*_g = 0`` (``block_norms``: ``||A_g||``).
        A relative margin keeps rounding from discarding a group active at an exact optimum.
        """
        bound = self.group_norms(G) + radius * block_norms
        return bound < self.beta * (1.0 - SCREENING_MARGIN)

    @staticmethod
    def zero_blocks(Z, mask):
        """``Z`` with the groups of ``mask`` set to exactly zero."""
        Z = Z.copy()
        Z[mask] = 0.0
        return Z

    def cvxpy_value(self, blocks):
        """CVXPY form; ``blocks`` is a (d, number of groups) expression whose columns are the groups."""
        import cvxpy as cp

        return self.beta * cp.sum(cp.norm(blocks, 2, axis=0))

    def cvxpy_dual_constraint(self, blocks):
        """``||G_g|| <= beta`` for every group (columns of ``blocks``), and the primal read back
        from its multipliers ``lambda_g >= 0``: ``z_g = lambda_g G_g / beta`` (stationarity of the
        Lagrangian in V). Returns ``(constraints, readback)``; ``readback(G_value)`` gives the
        primal in the layout of ``blocks``."""
        import cvxpy as cp

        constraint = cp.norm(blocks, 2, axis=0) <= self.beta

        def readback(G):
            lam = np.maximum(np.asarray(constraint.dual_value, dtype=float).ravel(), 0.0)
            return lam[None, :] * G / self.beta

        return [constraint], readback


class NuclearNorm(Regularizer):
    """``R(Z) = beta * ||Z||_*`` (sum of singular values) of a matrix ``Z`` (p, q), or
    ``beta * sum_g ||Z_g||_*`` over a stack ``Z`` (P, p, q) of matrices (one per gate of the gated
    multi-head self-attention program; a matrix is the stack of one).

    Dual norm: the largest spectral norm ``max_g ||G_g||_2``; blocks are the singular directions of
    each matrix (shape ``Z.shape[:-2] + (min(p, q),)``). Prox, KKT residuals, support (the ranks) and
    screening act matrix by matrix.
    """

    name = "nuclear_norm"
    block_ndim = 2  # a block (matrix) spans the last two axes of Z

    @numpy_face
    def norm(self, Z):
        return torch.sum(torch.linalg.svdvals(Z), dtype=F64)

    @numpy_face
    def prox(self, Z, step):
        """Singular-value thresholding of each matrix: ``U max(S - step beta, 0) W^T``, truncated to
        the largest rank (a matrix of lower rank gets exact zeros in the directions it lacks)."""
        U, s, Wh = torch.linalg.svd(Z, full_matrices=False)
        s = torch.clamp_min(s - step * self.beta, 0.0)
        r = int(torch.count_nonzero(s > 0, dim=-1).max()) if s.numel() else 0
        return (U[..., :r] * s[..., None, :r]) @ Wh[..., :r, :]

    @numpy_face
    def dual_norm(self, G):
        """``max_g ||G_g||_2``, the largest singular value."""
        return torch.amax(torch.linalg.matrix_norm(G, ord=2)).to(F64) if G.numel() else torch.zeros((), dtype=F64)

    @staticmethod
    def matrices(shape):
        """``(count, p, q)``: the matrices of coefficients of ``shape`` (a matrix or a stack) and their sides."""
        return int(np.prod(shape[:-2])), shape[-2], shape[-1]

    @staticmethod
    def ranks(Z):
        """Numerical rank of each matrix (an int array of shape ``Z.shape[:-2]``): singular values above
        ``max(p, q) * eps * sigma_max`` (as numpy's matrix_rank)."""
        Z = np.asarray(Z, dtype=float)
        return np.linalg.matrix_rank(Z) if Z.size else np.zeros(Z.shape[:-2], dtype=int)

    @staticmethod
    def rank(Z):
        """The number of heads behind ``Z``: its rank, summed over the stack."""
        return int(np.sum(NuclearNorm.ranks(Z)))

    support_size = rank

    @numpy_face
    def kkt_residuals(self, Z, G):
        """(stationarity, dual feasibility) of docs/conventions.md, relative to beta, spectral norms,
        the worst over the stack.

        With the thin SVD ``Z_g = U S W^T`` of numerical rank r: stationarity is the largest of
        ``||U^T G_g W - beta I_r||``, ``||(I - U U^T) G_g W||`` and ``||U^T G_g (I - W W^T)||``;
        feasibility ``max(0, max_g ||G_g|| - beta)``.
        """
        zero = torch.zeros((), dtype=F64, device=Z.device)
        stationarity = zero
        Zs, Gs = Z.reshape(-1, *Z.shape[-2:]), G.reshape(-1, *G.shape[-2:])
        for z, g, r in zip(Zs, Gs, NuclearNorm.ranks(Zs.cpu().numpy()).tolist()):
            if r:
                U, _, Wh = torch.linalg.svd(z, full_matrices=False)
                U, W = U[:, :r], Wh[:r].T
                GW, UG = g @ W, U.T @ g
                eye = torch.eye(r, dtype=z.dtype, device=z.device)
                parts = [U.T @ GW - self.beta * eye, GW - U @ (U.T @ GW), UG - (UG @ W) @ W.T]
                stationarity = max([stationarity] + [torch.linalg.matrix_norm(p, ord=2) for p in parts])
        feasibility = torch.clamp_min(NuclearNorm.dual_norm(self, G) - self.beta, 0.0) if G.numel() else zero
        return torch.as_tensor(stationarity, dtype=F64) / self.beta, torch.as_tensor(feasibility, dtype=F64) / self.beta

    def screen(self, G, radius, operator_norm):
        """Gap-safe rank test: singular directions proved inactive, as a boolean array over the
        ``min(p, q)`` singular values of each ``G_g`` sorted in decreasing order (shape
        ``G.shape[:-2] + (min(p, q),)``).

        The dual optimum lies within ``radius`` of the feasible point whose ``A^T V`` is ``G``, so
        the optimal ``S*_g = (A^T V*)_g`` has ``sigma_i(S*_g) <= sigma_i(G_g) + radius ||A_g||`` (Weyl;
        ``operator_norm``: ``||A_g||``, a number or one per matrix). Only singular values of ``S*_g``
        equal to beta carry the solution, so ``rank(Z*_g) <= #{i : sigma_i(G_g) + radius ||A_g|| >= beta}``:
        the number of ``False`` entries of a matrix is a proved bound on its rank at every optimum,
        and a matrix whose entries are all ``True`` is zero at every optimum.
        """
        s = np.linalg.svd(np.asarray(G, dtype=float), compute_uv=False)
        norms = np.asarray(operator_norm, dtype=float)[..., None]
        return s + radius * norms < self.beta * (1.0 - SCREENING_MARGIN)

    @staticmethod
    def zero_blocks(Z, mask):
        """``Z`` with each matrix truncated to its ``rank_bound = (~mask).sum(-1)`` largest singular triplets."""
        U, s, Wh = np.linalg.svd(np.asarray(Z, dtype=float), full_matrices=False)
        keep = np.arange(s.shape[-1]) < np.count_nonzero(~np.asarray(mask), axis=-1)[..., None]
        return (U * (s * keep)[..., None, :]) @ Wh

    @staticmethod
    def _matrices(blocks):
        """The matrices of a CVXPY expression: itself (2-d), or its slices along the first axis (3-d)."""
        return [blocks] if blocks.ndim == 2 else [blocks[g] for g in range(blocks.shape[0])]

    def cvxpy_value(self, blocks):
        """CVXPY form; ``blocks`` is Z as an expression of shape (p, q) or (P, p, q)."""
        import cvxpy as cp

        return self.beta * sum(cp.normNuc(B) for B in self._matrices(blocks))

    @staticmethod
    def psd_cones(p, q, form):
        """``(count, entries)``: the PSD cones of the nuclear norm of a (p, q) matrix in ``form`` (see
        :meth:`cvxpy_penalty`) and the entries of each (t (t + 1) / 2 for side t): ``"joint"``, one cone of
        side p + q, ``"rows"``, max(p, q) cones of side min(p, q) + 1. An interior-point solver holds a
        dense Hessian block of entries^2 numbers per cone; ``"auto"``: :meth:`resolve_form`."""
        t, count = (p + q, 1) if NuclearNorm.resolve_form(p, q, form) == "joint" else (min(p, q) + 1, max(p, q))
        return count, t * (t + 1) // 2

    @staticmethod
    def resolve_form(p, q, form="auto"):
        """``form`` for a (p, q) matrix, ``"auto"`` resolved: "rows" when its cones cost a first-order solver
        fewer flops per iteration, one eigendecomposition each (``max(p, q) (min(p, q) + 1)^3 < (p + q)^3``:
        Z (144, 24) of program (6) with d = 12, c = 2, but not a square Z), else "joint"."""
        if form != "auto":
            return form
        return "rows" if max(p, q) * (min(p, q) + 1) ** 3 < (p + q) ** 3 else "joint"

    def cvxpy_penalty(self, blocks, form="joint"):
        """``(expression, constraints)``: ``beta * sum_g ||B_g||_*`` in CVXPY, in one of two epigraph forms.

        ``"joint"`` is CVXPY's own ``normNuc``: ``||B||_* = min 1/2 (tr W1 + tr W2)`` over
        ``[[W1, B], [B^T, W2]] >= 0``, one PSD cone of side p + q. ``"rows"``: with ``b_i`` the rows of the
        taller side of B (B (p, q), p >= q, transposed if not) and ``B^T B = sum_i b_i b_i^T``,

            ||B||_* = min 1/2 (tr W + sum_i s_i)   over   [[W, b_i], [b_i^T, s_i]] >= 0,  i = 1..p:

        p cones of side q + 1 sharing W (q x q). Each says ``s_i >= b_i^T W^+ b_i`` (with b_i in the range
        of W), so the objective is at least ``1/2 (tr W + tr(B W^+ B^T)) >= tr (B^T B)^{1/2}``, with equality
        at ``W = (B^T B)^{1/2}``. ``"auto"``: :meth:`resolve_form`, matrix by matrix. For Z (d^2, dc) of
        program (6) with d = 12, c = 2: 144 cones of side 25 instead of one of side 168 (Hessian blocks
        of 1.5e7 numbers in all against 2.0e8). Which form a solver gets: its option ``nuclear_form`` (:mod:`cvxtransformer.solvers.cvxpy_solvers`;
        measured in the docs of program (6))."""
        import cvxpy as cp

        terms, constraints = [], []
        for B in self._matrices(blocks):
            if self.resolve_form(*B.shape, form) == "joint":
                terms.append(cp.normNuc(B))
                continue
            B = B.T if B.shape[0] < B.shape[1] else B
            p, q = B.shape
            W, s = cp.Variable((q, q), symmetric=True), cp.Variable(p)
            for i in range(p):
                row = cp.reshape(B[i, :], (1, q), order="C")
                constraints.append(cp.bmat([[W, row.T], [row, cp.reshape(s[i], (1, 1), order="C")]]) >> 0)
            terms.append(0.5 * (cp.trace(W) + cp.sum(s)))
        return self.beta * sum(terms), constraints

    def cvxpy_dual_constraint(self, blocks):
        """``||G_g||_2 <= beta`` as the linear matrix inequalities ``[[beta I, G_g], [G_g^T, beta I]] >= 0``;
        the primal is read back from their multipliers ``Lambda_g``: ``Z_g = -2 (Lambda_g)_12``
        (stationarity of the Lagrangian in V, with CVXPY's sign convention for the multiplier of a
        maximisation). Returns ``(constraints, readback)``."""
        import cvxpy as cp

        matrices = self._matrices(blocks)
        p, q = matrices[0].shape
        constraints = [cp.bmat([[self.beta * np.eye(p), B], [B.T, self.beta * np.eye(q)]]) >> 0 for B in matrices]

        def readback(G):
            Z = [-2.0 * np.asarray(c.dual_value, dtype=float)[:p, p:] for c in constraints]
            return Z[0] if blocks.ndim == 2 else np.stack(Z)

        return constraints, readback


class TokenNuclearNorm(NuclearNorm):
    """``R(Z) = beta * sum_{j,k} ||Z[j, :, k, :]||_*``: a nuclear norm of each token's ``c x d`` matrix, for
    coefficients whose last three axes are (outputs c, tokens n, coordinates d), as those of programs (10) and
    (12) (the weight-decay programs of docs/conventions.md: ordinary weight decay on networks (9) and (11)).

    Every method is the nuclear norm's on the stack ``Z.swapaxes(-3, -2)`` of token matrices
    ``(..., n, c, d)``: its blocks are the singular directions of each token's matrix (shape
    ``Z.shape[:-3] + (n, min(c, d))``), its dual norm the largest spectral norm of a token's block of
    ``A^T V``. With one output (c = 1) it is the group lasso of program (10) exactly.
    """

    name = "token_nuclear_norm"
    gram_layout = "canonical"
    block_ndim = None  # its blocks (a token's c x d matrix) are no trailing axes of Z

    @staticmethod
    def tokens(Z):
        """The token matrices ``(..., n, c, d)`` of coefficients ``(..., c, n, d)`` (a view; its own inverse)."""
        return Z.transpose(-3, -2) if isinstance(Z, torch.Tensor) else np.swapaxes(Z, -3, -2)

    @staticmethod
    def matrices(shape):
        """``(count, p, q)``: the token matrices of coefficients of ``shape`` and their sides (c, d)."""
        return int(np.prod(shape[:-3])) * shape[-2], shape[-3], shape[-1]

    def norm(self, Z):
        return super().norm(self.tokens(Z))

    # Token matrices at least GRAM_SIDES times longer than wide (MiniLM at full width: 3072 x 384) are thresholded
    # through the small Gram matrix in float64, as long as every largest singular value is below GRAM_REACH times the
    # threshold (the error is then within about eps * GRAM_REACH of the SVD form's); else by the SVD.
    GRAM_SIDES, GRAM_REACH = 4, 1e6

    @numpy_face
    def prox(self, Z, step):
        """Singular-value thresholding of each token's matrix (:meth:`NuclearNorm.prox`). A matrix M with
        ``c >= 4 d`` (or ``d >= 4 c``) in float64 is thresholded as ``M V diag(max(1 - t / s, 0)) V^T`` from the
        eigendecomposition ``M^T M = V diag(s^2) V^T`` (``t = step * beta``): the same matrix ``U max(S - t, 0)
        W^T``, at the cost of one product with M^T M and a d x d eigendecomposition instead of an SVD of M."""
        M, t = self.tokens(Z), step * self.beta
        long, short = max(M.shape[-2:]), min(M.shape[-2:])
        if M.dtype == torch.float64 and M.numel() and long >= self.GRAM_SIDES * short:
            tall = M.shape[-2] >= M.shape[-1]
            A = M if tall else M.mT
            lam, V = torch.linalg.eigh(A.mT @ A)  # ascending
            s = torch.sqrt(torch.clamp_min(lam, 0.0))
            if float(torch.amax(s)) <= self.GRAM_REACH * t:
                shrink = torch.clamp_min(1.0 - t / torch.clamp_min(s, t), 0.0)
                k = lam.shape[-1] - int(torch.count_nonzero(shrink, dim=-1).max())  # the kept directions: the last
                V, shrink = V[..., k:], shrink[..., k:]
                out = ((A @ V) * shrink[..., None, :]) @ V.mT
                return self.tokens(out if tall else out.mT)
        return self.tokens(super().prox(M, step))

    @numpy_face
    def spectral_norms(self, G):
        """``||G[j, :, k, :]||_2`` of every token's matrix, shape ``G.shape[:-3] + (n,)``. A long float64 matrix (as
        for :meth:`prox`) takes the top eigenvalue of its small Gram matrix, ``sqrt(lambda_max(A^T A))`` (a d x d
        symmetric eigenproblem instead of an SVD of a c x d matrix), raised by ``SPECTRAL_MARGIN`` relative: it
        bounds the rounding of the product and the eigensolver, so the value is never below the true norm's
        computed value by more than rounding of the SVD's, and the certificates that scale by it stay feasible."""
        M = self.tokens(G)
        long, short = max(M.shape[-2:]), min(M.shape[-2:])
        if M.dtype == torch.float64 and M.numel() and long >= self.GRAM_SIDES * short:
            A = M if M.shape[-2] >= M.shape[-1] else M.mT
            lam = torch.linalg.eigvalsh(A.mT @ A)[..., -1]
            return torch.sqrt(torch.clamp_min(lam, 0.0)) * (1.0 + self.SPECTRAL_MARGIN)
        return torch.linalg.matrix_norm(M, ord=2)

    SPECTRAL_MARGIN = 1e-12

    @numpy_face
    def dual_norm(self, G):
        """The largest spectral norm of a token's matrix (:meth:`spectral_norms`)."""
        return torch.amax(self.spectral_norms(G)).to(F64) if G.numel() else torch.zeros((), dtype=F64)

    @staticmethod
    def ranks(Z):
        """The rank of each token's matrix, shape ``Z.shape[:-3] + (n,)``."""
        return NuclearNorm.ranks(TokenNuclearNorm.tokens(np.asarray(Z, dtype=float)))

    @staticmethod
    def rank(Z):
        """The number of heads behind ``Z``: the ranks of the token matrices, summed."""
        return int(np.sum(TokenNuclearNorm.ranks(Z)))

    support_size = rank

    def kkt_residuals(self, Z, G):
        return super().kkt_residuals(self.tokens(Z), self.tokens(G))

    def screen(self, G, radius, operator_norm):
        """Singular directions of each token's matrix proved inactive (shape ``G.shape[:-3] + (n, min(c, d))``);
        ``operator_norm``: ``||A_g||`` per token block, shape ``G.shape[:-3] + (n,)`` (:meth:`NuclearNorm.screen`)."""
        return super().screen(self.tokens(np.asarray(G, dtype=float)), radius, operator_norm)

    @staticmethod
    def zero_blocks(Z, mask):
        """``Z`` with each token's matrix truncated to its proved rank bound (:meth:`NuclearNorm.zero_blocks`)."""
        return np.ascontiguousarray(TokenNuclearNorm.tokens(NuclearNorm.zero_blocks(TokenNuclearNorm.tokens(Z), mask)))


REGULARIZERS = {cls.name: cls for cls in (GroupLasso, NuclearNorm, TokenNuclearNorm)}
