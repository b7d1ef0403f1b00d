"""The group-lasso regularizer shared by programs (8), (10) and (12).

A group is one token row (length d) of one coefficient matrix: in the canonical shape
``(h, c, n, d)`` of a program's coefficients (see :class:`cvxtransformer.programs.Program`)
the groups are the vectors along the last axis.
"""
import cvxpy as cp
import numpy as np


def group_norms(Z):
    """Euclidean norm of every group: array of shape ``Z.shape[:-1]``."""
    return np.linalg.norm(Z, axis=-1)


class GroupLasso:
    """``R(Z) = beta * sum_g ||z_g||_2``, whose dual norm is ``max_g ||g_g||_2``."""

    def __init__(self, beta):
        self.beta = beta

    def value(self, Z):
        return self.beta * float(np.sum(group_norms(Z)))

    def prox(self, Z, step):
        """Group soft-thresholding: ``argmin_W step*R(W) + 1/2 ||W - Z||^2``."""
        norms = group_norms(Z)[..., None]
        scale = np.maximum(0.0, 1.0 - step * self.beta / np.where(norms > 0, norms, 1.0))
        return Z * scale

    @staticmethod
    def dual_norm(G):
        """``max_g ||G_g||_2`` (divide by beta: the dual point is feasible iff it is <= 1)."""
        return float(np.max(group_norms(G))) if G.size else 0.0

    def cvxpy_value(self, groups_as_columns):
        """CVXPY expression; ``groups_as_columns`` is a (d, number of groups) expression."""
        return self.beta * cp.sum(cp.norm(groups_as_columns, 2, axis=0))

    def cvxpy_dual_constraint(self, groups_as_columns):
        """The dual-norm constraint ``||g_g||_2 <= beta`` for every group, as one vector constraint."""
        return cp.norm(groups_as_columns, 2, axis=0) <= self.beta
