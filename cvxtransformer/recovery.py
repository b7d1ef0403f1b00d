"""Proposition 1: the nonconvex attention weights behind a convex solution, and the
nonconvex objectives (6)/(9)/(11) they are checked against.

This is the inverse of the convexification (a reduction's ``invert`` in CVXPY's terms):
every nonzero group ``z = Z[j, l, k]`` becomes one head with attention row ``w_1 = e_k``
(a vertex of the simplex), value vector ``w_2`` and output vector ``w_3``:

* balanced form: ``w_2 = z / sqrt(||z||)``, ``w_3 = sqrt(||z||) e_l``, penalty
  ``beta/2 (||w_2||^2 + ||w_3||_1^2)``;
* Lemma-1 form: ``w_2 = z / ||z||``, ``w_3 = ||z|| e_l``, penalty ``beta ||w_3||_1``.

:func:`nonconvex_objective` evaluates the network in plain numpy from ``X``, the weights
and the gate vectors, without the convex program's linear map.
"""
from dataclasses import dataclass

import numpy as np

from .errors import invalid

FORMS = ("balanced", "lemma1")


@dataclass
class NonconvexWeights:
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


def recover_weights(Z4, gated, form="balanced"):
    """Weights of Proposition 1 from canonical coefficients ``Z4`` of shape (h, c, n, d).

    ``gated``: whether the coefficients are those of program (12) (records each head's gate).
    """
    if form not in FORMS:
        raise invalid("form", f"one of {FORMS}", repr(form))
    h, c, n, d = Z4.shape
    norms = np.linalg.norm(Z4, axis=-1)
    j, l, k = np.nonzero(norms)
    z, r = Z4[j, l, k], norms[j, l, k]
    scale = np.sqrt(r) if form == "balanced" else r
    return NonconvexWeights(W1=np.eye(n)[k], W2=z / scale[:, None], W3=np.eye(c)[l] * scale[:, None],
                            gate=j if gated else None, form=form)


def nonconvex_objective(X, T, loss, weights, beta, U1=None, U2=None):
    """Objective (6)/(9) (or (11) with gates) of a network with the given heads.

    ``sum_i L(sum_j g_ij (w_1j^T X_i w_2j) w_3j, y_i) + penalty``, with ``g_ij = 1`` for (6)/(9)
    and ``g_ij = 1[u_1,gate(j)^T X_i u_2,gate(j) >= 0]`` for (11). ``T`` holds the encoded targets
    of ``loss`` (see :meth:`cvxtransformer.losses.Loss.encode`).
    """
    scores = np.einsum("jk,ikd,jd->ij", weights.W1, X, weights.W2)
    if weights.gate is not None:
        scores = scores * (np.einsum("jk,ikd,jd->ij", U1[weights.gate], X, U2[weights.gate]) >= 0)
    Yhat = scores @ weights.W3
    if weights.form == "balanced":
        penalty = 0.5 * beta * float(np.sum(weights.W2 ** 2) + np.sum(np.abs(weights.W3).sum(axis=1) ** 2))
    else:
        penalty = beta * float(np.sum(np.abs(weights.W3)))
    return loss.value(Yhat, T) + penalty
