"""Regularisers: the group lasso of programs (8), (10), (12) and the nuclear norm of the linear
multi-head self-attention program (docs/conventions.md). One object per regulariser.

A regulariser ``R`` (weight ``beta`` included) knows its value, its proximal operator, its
dual norm (the dual constraint is ``dual_norm(A^T V) <= beta``), the KKT residuals of
docs/conventions.md, the size of the support of a solution, a gap-safe screening test, and its CVXPY
forms. Its *blocks* are what a solution can switch off: the groups of the group lasso, the
singular directions of the nuclear norm. Numerical methods take numpy arrays or torch
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
    """``R(Z) = beta * norm(Z)``; see the module docstring."""

    name = ""

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

    @numpy_face
    def kkt_residuals(self, Z, G):
        """(stationarity on the support, dual feasibility off it), relative to beta (docs/conventions.md).

        ``G = A^T(-grad L(yhat(Z)))``; stationarity ``max ||G_g - beta z_g/||z_g|| ||/beta`` over the
        support, feasibility ``max(0, ||G_g|| - beta)/beta`` off it.
        """
        norms = torch.linalg.vector_norm(Z, dim=-1)
        support = norms > 0
        zero = torch.zeros((), dtype=F64, device=Z.device)
        stationarity = zero
        if bool(support.any()):
            direction = Z[support] / norms[support][:, None]
            stationarity = torch.amax(torch.linalg.vector_norm(G[support] - self.beta * direction, dim=-1))
        off = torch.linalg.vector_norm(G, dim=-1)[~support]
        feasibility = torch.amax(torch.clamp_min(off - self.beta, 0.0)) if off.numel() else zero
        return stationarity.to(F64) / self.beta, feasibility.to(F64) / self.beta

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
    """``R(Z) = beta * ||Z||_*`` (sum of singular values) of a matrix ``Z``.

    Dual norm: the spectral norm ``||G||_2``; blocks are the singular directions.
    """

    name = "nuclear_norm"

    @numpy_face
    def norm(self, Z):
        return torch.sum(torch.linalg.svdvals(Z), dtype=F64)

    @numpy_face
    def prox(self, Z, step):
        """Singular-value thresholding: ``U max(S - step beta, 0) W^T``, truncated to its rank."""
        U, s, Wh = torch.linalg.svd(Z, full_matrices=False)
        s = s - step * self.beta
        r = int(torch.count_nonzero(s > 0))
        return (U[:, :r] * s[:r]) @ Wh[:r]

    @numpy_face
    def dual_norm(self, G):
        """``||G||_2``, the largest singular value."""
        return torch.linalg.matrix_norm(G, ord=2).to(F64) if G.numel() else torch.zeros((), dtype=F64)

    @staticmethod
    def rank(Z):
        """Numerical rank: singular values above ``max(shape) * eps * sigma_max`` (as numpy's matrix_rank)."""
        return int(np.linalg.matrix_rank(np.asarray(Z, dtype=float))) if np.asarray(Z).size else 0

    support_size = rank

    @numpy_face
    def kkt_residuals(self, Z, G):
        """(stationarity, dual feasibility) of docs/conventions.md, relative to beta, spectral norms.

        With the thin SVD ``Z = U S W^T`` of numerical rank r: stationarity is the largest of
        ``||U^T G W - beta I_r||``, ``||(I - U U^T) G W||`` and ``||U^T G (I - W W^T)||``;
        feasibility ``max(0, ||G|| - beta)``.
        """
        zero = torch.zeros((), dtype=F64, device=Z.device)
        U, s, Wh = torch.linalg.svd(Z, full_matrices=False)
        r = self.rank(Z.cpu().numpy())
        stationarity = zero
        if r:
            U, W = U[:, :r], Wh[:r].T
            GW, UG = G @ W, U.T @ G
            eye = torch.eye(r, dtype=Z.dtype, device=Z.device)
            parts = [U.T @ GW - self.beta * eye, GW - U @ (U.T @ GW), UG - (UG @ W) @ W.T]
            stationarity = max(torch.linalg.matrix_norm(p, ord=2) for p in parts)
        feasibility = torch.clamp_min(self.dual_norm(G) - self.beta, 0.0) if G.numel() else zero
        return torch.as_tensor(stationarity, dtype=F64) / self.beta, torch.as_tensor(feasibility, dtype=F64) / self.beta

    def screen(self, G, radius, operator_norm):
        """Gap-safe rank test: singular directions proved inactive, as a boolean array over the
        ``min(shape)`` singular values of ``G`` sorted in decreasing order.

        The dual optimum lies within ``radius`` of the feasible point whose ``A^T V`` is ``G``, so
        the optimal ``S* = A^T V*`` has ``sigma_i(S*) <= sigma_i(G) + radius ||A||`` (Weyl). Only
        singular values of ``S*`` equal to beta carry the solution, so
        ``rank(Z*) <= #{i : sigma_i(G) + radius ||A|| >= beta}``: the number of ``False`` entries
        is a proved bound on the rank of every optimum.
        """
        s = np.linalg.svd(np.asarray(G, dtype=float), compute_uv=False)
        return s + radius * float(operator_norm) < self.beta * (1.0 - SCREENING_MARGIN)

    @staticmethod
    def zero_blocks(Z, mask):
        """``Z`` truncated to its ``rank_bound = (~mask).sum()`` largest singular triplets."""
        r = int(np.count_nonzero(~np.asarray(mask)))
        U, s, Wh = np.linalg.svd(np.asarray(Z, dtype=float), full_matrices=False)
        return (U[:, :r] * s[:r]) @ Wh[:r]

    def cvxpy_value(self, blocks):
        import cvxpy as cp

        return self.beta * cp.normNuc(blocks)

    def cvxpy_dual_constraint(self, blocks):
        """``||G||_2 <= beta`` as the linear matrix inequality ``[[beta I, G], [G^T, beta I]] >= 0``;
        the primal is read back from its multiplier ``Lambda``: ``Z = -2 Lambda_12`` (stationarity of
        the Lagrangian in V, with CVXPY's sign convention for the multiplier of a maximisation).
        Returns ``(constraints, readback)``."""
        import cvxpy as cp

        p, q = blocks.shape
        lmi = cp.bmat([[self.beta * np.eye(p), blocks], [blocks.T, self.beta * np.eye(q)]])
        constraint = lmi >> 0

        def readback(G):
            Lam = np.asarray(constraint.dual_value, dtype=float)
            return -2.0 * Lam[:p, p:]

        return [constraint], readback


REGULARIZERS = {cls.name: cls for cls in (GroupLasso, NuclearNorm)}
