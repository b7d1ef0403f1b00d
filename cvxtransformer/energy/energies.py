"""The energies of Yang, Huang & Wipf, *Transformers from an Optimization Perspective* (paper 004).

Shapes: ``Y`` is (n, d), one token per row ``y_i``; a batch (B, n, d) gives one energy per
matrix. Every function takes numpy arrays or torch tensors and answers in the same kind
(torch keeps autograd).

* the attention energy, eq. (9), with weights ``Wa`` of shape (d, k) as in Section 3.2:

      E1(Y Wa) = sum_{i,j} rho(1/2 ||(y_i - y_j) Wa||^2) + R(Y),   R(Y) = lam/2 ||(Y - X) Wa||_F^2

  with Theorem 3.1's choices ``rho(z) = -exp(-z)``, ``lam = 1``, ``X = 0`` (no ``Wa``:
  ``Wa = I``). The sum runs over all ordered pairs, ``i = j`` included (a constant ``n rho(0)``).
  ``X`` (``anchor``) is Section 6's change of ``||Y||^2`` into ``||Y - X||^2``.
* the feed-forward energy of Section 4.2, ``Wf`` of shape (d, d):

      E2(Y) = 1/2 tr(Y Wf Y^T) + 1/2 ||Y||_F^2

* their sum ``E(Y) = E1(Y Wa) + E2(Y)`` (plus, with ``relu=True``, the indicator ``phi`` of
  ``Y >= 0`` of Section 5.2), and its gradient in closed form.

``rho`` is a name (``"exp"``: Theorem 3.1; ``"log"``: ``rho(z) = log(z + 2)`` of Section 7) or
any object with ``value(z)`` and ``derivative(z)`` for a concave non-decreasing ``rho``.
"""
import numpy as np

from ..core.errors import invalid
from . import _backend as B


class ExpRho:
    """``rho(z) = -exp(-z)`` (Theorem 3.1): concave, non-decreasing; ``rho'(z) = exp(-z)``.

    Its majorization weights ``rho'(1/2 ||y_i - y_j||^2)`` are the softmax attention scores
    ``exp(-1/2 ||y_i||^2) beta_j exp(y_i^T y_j)`` of update (10).
    """

    name = "exp"

    def value(self, z):
        return -B.xp(z).exp(-z)

    def derivative(self, z):
        return B.xp(z).exp(-z)


class LogRho:
    """``rho(z) = log(z + 2)`` (Section 7): concave, non-decreasing; ``rho'(z) = 1 / (z + 2)``."""

    name = "log"

    def value(self, z):
        return B.xp(z).log(z + 2)

    def derivative(self, z):
        return 1 / (z + 2)


RHOS = {"exp": ExpRho(), "log": LogRho()}


def get_rho(rho):
    """A rho object from its name (``"exp"``, ``"log"``) or an object with ``value``/``derivative``."""
    if isinstance(rho, str):
        if rho not in RHOS:
            raise invalid("rho", "one of " + ", ".join(map(repr, RHOS)) + " or an object with "
                          "value(z) and derivative(z)", repr(rho))
        return RHOS[rho]
    if not (callable(getattr(rho, "value", None)) and callable(getattr(rho, "derivative", None))):
        raise invalid("rho", "a name ('exp', 'log') or an object with value(z) and derivative(z)",
                      type(rho).__name__)
    return rho


def _prepare(Y, Wa, anchor, lam=None):
    """Checked ``(Y, Wa, anchor, lam)``, all of the kind of ``Y``."""
    Y = B.tokens("Y", Y)
    Wa = B.matrix("Wa", Wa, Y, rows=Y.shape[-1], what=f"shape (d, k) with d = {Y.shape[-1]}")
    if anchor is not None:
        A = B.tokens("anchor", anchor)
        if tuple(A.shape[-2:]) != tuple(Y.shape[-2:]) or A.ndim > Y.ndim:
            raise invalid("anchor", f"the shape of Y, {tuple(Y.shape)} (or {tuple(Y.shape[-2:])})",
                          f"shape {tuple(A.shape)}")
        anchor = B.convert(A, Y)
    if lam is not None:
        lam = B.nonneg("lam", lam)
    return Y, Wa, anchor, lam


def half_sq_dists(Z):
    """``S_ij = 1/2 ||z_i - z_j||^2`` for the rows of ``Z`` (..., n, k): shape (..., n, n)."""
    q = (Z * Z).sum(-1)
    S = 0.5 * (q[..., :, None] + q[..., None, :]) - Z @ B.mT(Z)
    return S.clip(0)


def attention_weights(Y, Wa=None, rho="exp"):
    """The majorization weights ``gamma_ij = rho'(1/2 ||(y_i - y_j) Wa||^2)``, shape (..., n, n).

    For ``rho = "exp"`` they form a Gaussian kernel matrix (positive semidefinite), and
    ``gamma_ij / sum_j gamma_ij`` is the softmax attention of update (10).

    >>> attention_weights([[0.0], [1.0]]).round(4).tolist()
    [[1.0, 0.6065], [0.6065, 1.0]]
    """
    Y, Wa, _, _ = _prepare(Y, Wa, None)
    Z = Y if Wa is None else Y @ Wa
    return get_rho(rho).derivative(half_sq_dists(Z))


def attention_energy(Y, Wa=None, rho="exp", lam=1.0, anchor=None):
    """The attention energy E1 of eq. (9), at ``Y Wa``.

    ``E1 = sum_{i,j} rho(1/2 ||(y_i - y_j) Wa||^2) + lam/2 ||(Y - anchor) Wa||_F^2``; the defaults
    are Theorem 3.1's choices ``rho(z) = -exp(-z)``, ``R(Y) = 1/2 ||Y||_F^2``, ``Wa = I``.

    Parameters
    ----------
    Y : array or tensor of shape (n, d), or (B, n, d)
    Wa : None or (d, k)
    rho : ``"exp"``, ``"log"`` or a rho object (see the module docstring)
    lam : weight of R, >= 0 (0: the pairwise term alone)
    anchor : None (0) or X of the shape of Y: R = lam/2 ||(Y - X) Wa||^2 (Section 6)

    Returns
    -------
    float (numpy input of shape (n, d)), else an array or tensor of shape (B,)

    >>> round(attention_energy([[0.0, 0.0], [1.0, 0.0]]), 6)   # -2 - 2 exp(-1/2) + 1/2
    -2.713061
    """
    Y, Wa, anchor, lam = _prepare(Y, Wa, anchor, lam)
    Z = Y if Wa is None else Y @ Wa
    pairwise = B.total(get_rho(rho).value(half_sq_dists(Z)))
    if lam == 0:
        return B.out(pairwise)
    D = Y if anchor is None else Y - anchor
    D = D if Wa is None else D @ Wa
    return B.out(pairwise + 0.5 * lam * B.total(D * D))


def attention_energy_gradient(Y, Wa=None, rho="exp", lam=1.0, anchor=None):
    """The gradient of :func:`attention_energy` with respect to ``Y`` in closed form, shape of ``Y``.

    With ``Z = Y Wa``, ``gamma_ij = rho'(1/2 ||z_i - z_j||^2)`` and ``d_i = sum_j gamma_ij``:
    ``grad = [2 (diag(d) - Gamma) Z + lam (Z - X Wa)] Wa^T`` (the factor 2: each pair appears
    as (i, j) and (j, i)).

    >>> attention_energy_gradient([[0.0], [1.0]], lam=0).round(4).tolist()
    [[-1.2131], [1.2131]]
    """
    Y, Wa, anchor, lam = _prepare(Y, Wa, anchor, lam)
    Z = Y if Wa is None else Y @ Wa
    G = get_rho(rho).derivative(half_sq_dists(Z))
    grad = 2 * (G.sum(-1)[..., None] * Z - G @ Z)
    if lam:
        D = Y if anchor is None else Y - anchor
        grad = grad + lam * (D if Wa is None else D @ Wa)
    return grad if Wa is None else grad @ B.mT(Wa)


def _sym(W):
    return 0.5 * (W + B.mT(W))


def ffn_energy(Y, Wf=None):
    """The energy E2 of Section 4.2: ``1/2 tr(Y Wf Y^T) + 1/2 ||Y||_F^2``; ``Wf`` (d, d), None = 0.

    >>> ffn_energy([[1.0, 2.0]], [[1.0, 0.0], [0.0, -0.5]])   # (1 - 2) / 2 + 5 / 2
    2.0
    """
    Y = B.tokens("Y", Y)
    Wf = B.matrix("Wf", Wf, Y, rows=Y.shape[-1], cols=Y.shape[-1], what=f"shape (d, d) with d = {Y.shape[-1]}")
    value = 0.5 * B.total(Y * Y)
    if Wf is not None:
        value = value + 0.5 * B.total((Y @ Wf) * Y)
    return B.out(value)


def ffn_energy_gradient(Y, Wf=None):
    """The gradient of E2: ``Y sym(Wf) + Y`` with ``sym(W) = (W + W^T) / 2``; shape of ``Y``."""
    Y = B.tokens("Y", Y)
    Wf = B.matrix("Wf", Wf, Y, rows=Y.shape[-1], cols=Y.shape[-1], what=f"shape (d, d) with d = {Y.shape[-1]}")
    return Y if Wf is None else Y @ _sym(Wf) + Y


def relu_indicator(Y):
    """``phi(Y)`` of (17): 0 when every entry is >= 0, +inf otherwise (one value per matrix)."""
    neg = B.total(Y < 0) > 0
    if B.is_torch(Y):
        import torch
        return torch.where(neg, torch.inf, 0.0).to(Y.dtype)
    return np.where(neg, np.inf, 0.0)


def energy(Y, Wa=None, Wf=None, rho="exp", lam=1.0, anchor=None, relu=False):
    """The combined energy of Section 4.2: ``E(Y) = E1(Y Wa) + E2(Y)`` (+ ``phi(Y)`` with ``relu``).

    Parameters are those of :func:`attention_energy` and :func:`ffn_energy`; ``relu=True`` adds
    the indicator of ``Y >= 0`` (Section 5.2), i.e. +inf when an entry is negative.

    >>> Y = [[0.0, 0.0], [1.0, 0.0]]
    >>> energy(Y) == attention_energy(Y) + ffn_energy(Y)
    True
    """
    Y, Wa, anchor, lam = _prepare(Y, Wa, anchor, lam)
    value = attention_energy(Y, Wa, rho, lam, anchor) + ffn_energy(Y, Wf)
    if relu:
        value = value + relu_indicator(Y)
    return B.out(value)


def energy_gradient(Y, Wa=None, Wf=None, rho="exp", lam=1.0, anchor=None):
    """The gradient of ``E = E1(Y Wa) + E2(Y)`` in closed form (the updates' formulas), shape of ``Y``.

    >>> import numpy as np
    >>> Y = np.random.default_rng(0).standard_normal((4, 3))
    >>> g = energy_gradient(Y)
    >>> e = np.zeros_like(Y); e[1, 2] = 1e-6
    >>> bool(abs((energy(Y + e) - energy(Y - e)) / 2e-6 - g[1, 2]) < 1e-6)
    True
    """
    return attention_energy_gradient(Y, Wa, rho, lam, anchor) + ffn_energy_gradient(Y, Wf)


def psd_factor(S, tol=1e-12):
    """A factor ``Wa`` (d, r) with ``Wa Wa^T`` the positive part of the symmetric part of ``S`` (d, d).

    The eigenvalues of ``sym(S)`` below ``tol * max|eigenvalue|`` are dropped (r = the number
    kept). This is how a real layer's attention matrix ``Wq Wk^T / sqrt(d_head)`` becomes the
    symmetric PSD ``Wa^s = Wa Wa^T`` that eq. (12) allows.

    >>> Wa = psd_factor([[2.0, 1.0], [-1.0, -3.0]])   # sym = diag(2, -3): keeps the 2
    >>> (Wa @ Wa.T).round(6).tolist()
    [[2.0, 0.0], [0.0, 0.0]]
    """
    S = np.asarray(B.convert(S, np.zeros(0)), dtype=float) if B.is_torch(S) else \
        B.matrix("S", S, np.zeros(0), what="shape (d, d)")
    if S.shape[0] != S.shape[1]:
        raise invalid("S", "a square matrix", f"shape {S.shape}")
    w, V = np.linalg.eigh(0.5 * (S + S.T))
    keep = w > tol * max(np.abs(w).max(), np.finfo(float).tiny)
    return V[:, keep] * np.sqrt(w[keep])
