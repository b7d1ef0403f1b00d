"""The linear maps of programs (8), (10) and (12) and their adjoints (SPEC.md).

All three programs share one canonical coefficient shape ``(h, c, n, d)``:
``yhat_il = sum_j M_ij <Z[j, l], X_i>``. Program (10) is the case ``h = 1`` with a gate
that is always open, and program (8) is (10) with ``c = 1``. Each program keeps its own
public coefficient shape: ``(n, d)`` for (8), ``(c, n, d)`` for (10), ``(h, c, n, d)`` for (12).
"""
import numpy as np

from .errors import invalid

PROGRAMS = (8, 10, 12)


def sample_gates(heads, n, d, seed=0):
    """Gate vectors of program (12): ``U1`` of shape (h, n) and ``U2`` of shape (h, d), i.i.d. N(0, 1)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((heads, n)), rng.standard_normal((heads, d))


def gate_mask(X, U1, U2):
    """Gate mask ``M`` of shape (N, h): ``M_ij = 1[u_1j^T X_i u_2j >= 0]``."""
    return (np.einsum("jk,ikd,jd->ij", U1, X, U2) >= 0).astype(float)


class Program:
    """The map ``Z -> yhat`` of program (8), (10) or (12) on data ``X``.

    Parameters
    ----------
    number : {8, 10, 12}
    X : ndarray of shape (N, n, d)
    n_outputs : int, the number c of outputs per sample
    mask : ndarray of shape (N, h), the gate mask of program (12); None otherwise
    """

    def __init__(self, number, X, n_outputs, mask=None):
        self.number = number
        self.X = X
        self.N, self.n, self.d = X.shape
        self.c = n_outputs
        self.mask = mask
        self.h = 1 if mask is None else mask.shape[1]
        self._X_flat = X.reshape(self.N, self.n * self.d)
        self._group_operator_norms = None

    @property
    def canonical_shape(self):
        return (self.h, self.c, self.n, self.d)

    @property
    def shape(self):
        """Public shape of the coefficients Z of this program."""
        return {8: (self.n, self.d), 10: (self.c, self.n, self.d)}.get(self.number, self.canonical_shape)

    @property
    def n_groups(self):
        return self.h * self.c * self.n

    def to_canonical(self, Z):
        Z = np.asarray(Z, dtype=float)
        if Z.shape != self.shape:
            raise invalid("Z", f"shape {self.shape} for program ({self.number})", f"shape {Z.shape}")
        return Z.reshape(self.canonical_shape)

    def from_canonical(self, Z4):
        return Z4.reshape(self.shape)

    def _gated(self, A):
        """(N, h, c) per-gate outputs -> (N, c), applying the gate mask."""
        return A[:, 0, :] if self.mask is None else np.einsum("ijl,ij->il", A, self.mask)

    def forward(self, Z4):
        """``yhat`` of shape (N, c) from canonical coefficients of shape (h, c, n, d)."""
        A = self._X_flat @ Z4.reshape(self.h * self.c, -1).T
        return self._gated(A.reshape(self.N, self.h, self.c))

    def adjoint(self, V):
        """``A^T V`` of shape (h, c, n, d): ``G[j, l, k] = sum_i V_il M_ij x_ik``."""
        W = V[:, None, :] if self.mask is None else self.mask[:, :, None] * V[:, None, :]
        return (W.reshape(self.N, -1).T @ self._X_flat).reshape(self.canonical_shape)

    def design(self):
        """Dense design of shape (N, h*n*d): column ``(j*n + k)*d + e`` is ``M_ij X[i, k, e]``."""
        if self.mask is None:
            return self._X_flat
        return (self.mask[:, :, None] * self._X_flat[:, None, :]).reshape(self.N, -1)

    def group_operator_norms(self):
        """Spectral norm of ``V[:, l] -> (A^T V)_g`` for every group g, shape (h, c, n).

        Equal to ``sqrt(lambda_max(sum_i M_ij x_ik x_ik^T))``; used by gap-safe screening.
        """
        if self._group_operator_norms is None:
            mask = np.ones((self.N, 1)) if self.mask is None else self.mask
            grams = np.empty((mask.shape[1], self.n, self.d, self.d))
            for k in range(self.n):  # one (h, N) x (N, d^2) product per token: BLAS, O(N d^2) memory
                Xk = self.X[:, k]
                outer = (Xk[:, :, None] * Xk[:, None, :]).reshape(self.N, -1)
                grams[:, k] = (mask.T @ outer).reshape(-1, self.d, self.d)
            lam = np.linalg.eigvalsh(grams)[..., -1]
            norms = np.sqrt(np.maximum(lam, 0.0))
            self._group_operator_norms = np.broadcast_to(norms[:, None, :], self.canonical_shape[:3])
        return self._group_operator_norms
