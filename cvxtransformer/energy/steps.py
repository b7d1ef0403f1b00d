"""The descent steps of paper 004: update (10), the MM step it comes from, the unfolded layer
(15)-(16) and the ReLU proximal step (17).

Shapes: ``Y`` (n, d) or a batch (B, n, d); ``Wa`` (d, k); ``Wf`` (d, d). numpy or torch in,
the same kind out.

Majorization-minimization (Theorem 3.1). ``rho`` concave lies below its tangents, so at the
current point ``Y0`` (``S_ij = 1/2 ||(y_i - y_j) Wa||^2``, ``gamma_ij = rho'(S_ij(Y0))``)

    E1(Y Wa) <= Ehat(Y; Y0) = sum_ij [rho(S_ij(Y0)) + gamma_ij (S_ij(Y) - S_ij(Y0))] + R(Y)    (*)

with equality at ``Y0``. ``Ehat`` is a convex quadratic; its pairwise part is ``tr(Z^T L Z)``
(``Z = Y Wa``, ``L = diag(d) - Gamma``, ``d_i = sum_j gamma_ij``). When ``Gamma`` is positive
semidefinite (``rho = "exp"``: a Gaussian kernel; ``"log"``: an inverse multiquadric),
``L <= diag(d)``, so ``Ehat`` is in turn majorized by a separable quadratic whose minimizer is

    y_i <- (2 sum_j gamma_ij y_j + lam x_i) / (2 d_i + lam)                                  (MM)

(:func:`mm_step`). It never increases E1, and its fixed points are exactly E1's stationary
points. With ``lam = 0`` and ``rho = "exp"``, ``gamma_ij / d_i`` is the softmax of
``y_i^T y_j + log beta_j``, ``beta_j = exp(-1/2 ||y_j||^2)``: (MM) is update (10)
(:func:`attention_step`). With ``lam > 0`` it is (10) scaled by ``2 d_i / (2 d_i + lam)`` plus
``lam / (2 d_i + lam)`` of the anchor: a residual connection (Remark 3.2, Section 6).
"""
import numpy as np

from ..core.errors import invalid
from ..core.validation import check_positive
from . import _backend as B
from .energies import _prepare, _sym, get_rho, half_sq_dists


def softmax_beta(Y, Wa=None):
    """The attention matrix of (10)-(12): ``softmax_beta(Z Z^T)``, ``Z = Y Wa``, shape (..., n, n).

    Row i: ``beta_j exp(z_i^T z_j) / sum_l beta_l exp(z_i^T z_l)`` with ``beta_j = exp(-1/2 ||z_j||^2)``.
    """
    Y, Wa, _, _ = _prepare(Y, Wa, None)
    Z = Y if Wa is None else Y @ Wa
    logits = Z @ B.mT(Z) - 0.5 * (Z * Z).sum(-1)[..., None, :]
    xp = B.xp(Y)
    logits = logits - xp.amax(logits, -1)[..., None]
    P = xp.exp(logits)
    return P / P.sum(-1)[..., None]


def attention_step(Y, Wa=None):
    """Update (10): ``y_i <- sum_j beta_j exp(y_i^T y_j) y_j / sum_j beta_j exp(y_i^T y_j)``.

    ``beta_j = exp(-1/2 ||y_j||^2)``. With ``Wa`` (d, k) it is (12)/(15):
    ``softmax_beta(Y Wa^s Y^T) Y`` with ``Wa^s = Wa Wa^T``. Shape of ``Y``.

    It never increases the pairwise energy (``lam = 0``); see the module docstring for ``lam > 0``.

    >>> import numpy as np
    >>> Y = np.random.default_rng(0).standard_normal((5, 3))
    >>> from cvxtransformer.energy import attention_energy
    >>> bool(attention_energy(attention_step(Y), lam=0) <= attention_energy(Y, lam=0))
    True
    """
    return softmax_beta(Y, Wa) @ B.tokens("Y", Y)


def mm_step(Y, Wa=None, rho="exp", lam=1.0, anchor=None):
    """The majorization-minimization step (MM) of E1 (module docstring); shape of ``Y``.

    ``y_i <- (2 sum_j gamma_ij y_j + lam x_i) / (2 d_i + lam)``, ``gamma_ij = rho'(1/2 ||(y_i - y_j) Wa||^2)``,
    ``d_i = sum_j gamma_ij``, ``x_i`` the rows of ``anchor`` (0 when None). It never increases
    ``attention_energy(Y, Wa, rho, lam, anchor)``; with ``rho="exp", lam=0`` it is update (10).

    >>> import numpy as np
    >>> Y = np.random.default_rng(1).standard_normal((6, 2))
    >>> bool(np.allclose(mm_step(Y, lam=0), attention_step(Y)))
    True
    """
    Y, Wa, anchor, lam = _prepare(Y, Wa, anchor, lam)
    Z = Y if Wa is None else Y @ Wa
    G = get_rho(rho).derivative(half_sq_dists(Z))
    num = 2 * (G @ Y)
    if lam and anchor is not None:
        num = num + lam * anchor
    return num / (2 * G.sum(-1) + lam)[..., None]


def majorizer(Y, Y0, Wa=None, rho="exp", lam=1.0, anchor=None):
    """The convex upper bound (*) of E1 built at ``Y0``, evaluated at ``Y``: >= E1(Y Wa), = at Y0.

    >>> import numpy as np
    >>> from cvxtransformer.energy import attention_energy
    >>> rng = np.random.default_rng(2)
    >>> Y0, Y = rng.standard_normal((2, 4, 3))
    >>> bool(majorizer(Y, Y0) >= attention_energy(Y)), bool(np.isclose(majorizer(Y0, Y0), attention_energy(Y0)))
    (True, True)
    """
    Y, Wa, anchor, lam = _prepare(Y, Wa, anchor, lam)
    Y0 = B.convert(B.tokens("Y0", Y0), Y)
    if tuple(Y0.shape) != tuple(Y.shape):
        raise invalid("Y0", f"the shape of Y, {tuple(Y.shape)}", f"shape {tuple(Y0.shape)}")
    r = get_rho(rho)
    S0 = half_sq_dists(Y0 if Wa is None else Y0 @ Wa)
    S = half_sq_dists(Y if Wa is None else Y @ Wa)
    value = B.total(r.value(S0) + r.derivative(S0) * (S - S0))
    if lam:
        D = Y if anchor is None else Y - anchor
        D = D if Wa is None else D @ Wa
        value = value + 0.5 * lam * B.total(D * D)
    return B.out(value)


def ffn_map(Wf, alpha2, d=None):
    """``Wf^s = (1 - alpha2) I - alpha2 (Wf + Wf^T) / 2`` of (16), shape (d, d) (``Wf=None``: 0)."""
    if Wf is None:
        return (1 - alpha2) * np.eye(d)
    return (1 - alpha2) * B.eye_like(Wf) - alpha2 * _sym(Wf)


def ffn_step(U, Wf=None, alpha2=0.5):
    """Update (16): the gradient step ``U - alpha2 grad E2(U) = U Wf^s``; shape of ``U``.

    >>> ffn_step([[1.0, 2.0]], [[0.0, 0.0], [0.0, 1.0]], 0.5).tolist()
    [[0.5, 0.0]]
    """
    U = B.tokens("U", U)
    Wf = B.matrix("Wf", Wf, U, rows=U.shape[-1], cols=U.shape[-1], what=f"shape (d, d) with d = {U.shape[-1]}")
    alpha2 = check_positive("alpha2", alpha2)
    return U @ B.convert(ffn_map(Wf, alpha2, U.shape[-1]), U)


def relu_prox(V):
    """The proximal step (17): ``argmin_z 1/(2 lam) ||z - v||^2 + phi(z) = max(v, 0)`` for every
    ``lam > 0`` (``phi``: the indicator of the nonnegative orthant). Shape of ``V``.

    >>> relu_prox([[-1.0, 2.0]]).tolist()
    [[0.0, 2.0]]
    """
    V = B.tokens("V", V)
    return V.clip(0)


def unfolded_step(Y, Wa=None, Wf=None, alpha2=0.5, lam=1.0, anchor=None, relu=False):
    """One unfolded transformer layer: (15) ``U = MM step of E1(. Wa)``, (16) ``U Wf^s``,
    and with ``relu`` (17): ``Y+ = ReLU(U Wf^s)`` (eq. (20)). Shape of ``Y``.

    With ``lam = 0`` the first step is exactly (15), ``softmax_beta(Y Wa^s Y^T) Y``.

    >>> import numpy as np
    >>> Y = np.random.default_rng(3).standard_normal((4, 2))
    >>> Wf = np.diag([0.5, -0.5])
    >>> bool(np.allclose(unfolded_step(Y, Wf=Wf, lam=0), attention_step(Y) @ ffn_map(Wf, 0.5)))
    True
    """
    U = mm_step(Y, Wa, "exp", lam, anchor)
    V = ffn_step(U, Wf, alpha2)
    return relu_prox(V) if relu else V
