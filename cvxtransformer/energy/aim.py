"""Alternating inexact minimization (AIM): Section 4.1 of paper 004, Algorithm 1, Theorem 4.1,
Lemma 4.3, on strongly convex quadratics where every constant is computable.

Algorithm 1 takes a gradient step on ``f``, then one on ``g``, to minimize ``h = f + g``:

    u = y - alpha1 grad f(y),    y+ = u - alpha2 grad g(u).

Theorem 4.1 (derived here, the extracted text being garbled): ``y+ = y - alpha2 (grad h(y) - eps)``
with ``||eps|| <= k ||grad f(y)||``, ``k = |1 - alpha1/alpha2| + alpha1 L_g``; smoothness of ``h``
and ``alpha2 <= 1 / L_h`` give ``h(y+) <= h(y) - alpha2/2 (||grad h||^2 - ||eps||^2)``, so::

    ||grad f(y)|| <= C ||grad h(y)||,   C = alpha2 / (|alpha2 - alpha1| + alpha1 alpha2 L_g)   =>   h(y+) <= h(y).

Lemma 4.3: ``||grad f(y)|| <= L_f ||y - y_f*||`` and ``||grad h(y)|| >= c_h ||y - y_h*||``, so the
condition holds on ``S(C) = {y : ||y - y_f*|| <= r ||y - y_h*||}``, ``r = c_h C / L_f``, whose
boundary is an Apollonian circle:

* ``r < 1``: ``S(C)`` is a ball around ``y_f*`` (not containing ``y_h*``): descent inside it;
* ``r > 1``: ``S(C)`` is the space outside a ball containing ``y_h*``: descent everywhere except
  near the optimum. This is the form of Corollary 4.5 for the transformer energy ("descent
  outside a finite ball containing the optimum"), where Remark 4.4 adds that inside it the
  energy oscillates.

Points: ``y`` of shape (m,).
"""
from dataclasses import dataclass

import numpy as np

from ..core.errors import invalid
from ..core.validation import check_array, check_positive


class Quadratic:
    """``f(y) = 1/2 (y - a)^T F (y - a)`` with ``F`` (m, m) symmetric positive definite, ``a`` (m,).

    >>> f = Quadratic([[2.0, 0.0], [0.0, 1.0]], [1.0, 0.0])
    >>> f.value([0.0, 0.0]), f.grad([0.0, 0.0]).tolist(), f.L, f.c
    (1.0, [-2.0, 0.0], 2.0, 1.0)
    """

    def __init__(self, F, a):
        self.F = check_array("F", F, ndim=2, what="shape (m, m)")
        self.a = check_array("a", a, ndim=1, what="shape (m,)")
        if self.F.shape != (self.a.size, self.a.size):
            raise invalid("F", f"shape ({self.a.size}, {self.a.size}) to match a", f"shape {self.F.shape}")
        if not np.allclose(self.F, self.F.T):
            raise invalid("F", "a symmetric matrix", "an asymmetric one", "pass (F + F.T) / 2")
        w = np.linalg.eigvalsh(self.F)
        if w[0] <= 0:
            raise invalid("F", "a positive definite matrix (strong convexity)", f"smallest eigenvalue {w[0]:.3g}")
        self.c, self.L = float(w[0]), float(w[-1])

    def value(self, y):
        r = np.asarray(y, dtype=float) - self.a
        return float(0.5 * r @ self.F @ r)

    def grad(self, y):
        return self.F @ (np.asarray(y, dtype=float) - self.a)

    def minimizer(self):
        return self.a.copy()


def aim_step(y, grad_f, grad_g, alpha1, alpha2):
    """One turn of Algorithm 1: ``u = y - alpha1 grad_f(y)``, returns ``u - alpha2 grad_g(u)``.

    >>> aim_step(np.array([1.0]), lambda y: y, lambda y: 2 * y, 0.5, 0.25).tolist()
    [0.25]
    """
    u = y - alpha1 * grad_f(y)
    return u - alpha2 * grad_g(u)


@dataclass
class AIMRegion:
    """Where Theorem 4.1 with Lemma 4.3 guarantees ``h(y+) <= h(y)``.

    ``C``, ``ratio = c_h C / L_f``; the Apollonian ball ``center`` (m,), ``radius``;
    ``descent_inside``: True when the guaranteed set is the ball (``ratio < 1``), False when it
    is its outside (``ratio > 1``); ``step_ok``: ``alpha2 <= 1 / L_h`` (else nothing is guaranteed).
    """
    C: float
    ratio: float
    center: np.ndarray
    radius: float
    descent_inside: bool
    step_ok: bool
    y_f: np.ndarray
    y_h: np.ndarray

    def guaranteed(self, y):
        """True when ``y`` is in ``S(C)`` (and the step size condition holds)."""
        y = np.asarray(y, dtype=float)
        inside = np.linalg.norm(y - self.center) <= self.radius
        return bool(self.step_ok and (inside if self.descent_inside else not inside))


def aim_region(f, g, alpha1, alpha2):
    """The region ``S(C)`` of Lemma 4.3 for ``h = f + g`` (two :class:`Quadratic`).

    >>> f = Quadratic(np.eye(2), [1.0, 0.0]); g = Quadratic(np.eye(2), [-1.0, 0.0])
    >>> reg = aim_region(f, g, 0.1, 0.1)
    >>> reg.descent_inside, reg.guaranteed([0.0, 0.0]), reg.guaranteed([5.0, 5.0])
    (False, False, True)
    """
    alpha1, alpha2 = check_positive("alpha1", alpha1), check_positive("alpha2", alpha2)
    if f.a.shape != g.a.shape:
        raise invalid("g", f"a quadratic on R^{f.a.size} like f", f"one on R^{g.a.size}")
    H = f.F + g.F
    w = np.linalg.eigvalsh(H)
    c_h, L_h = float(w[0]), float(w[-1])
    y_f = f.minimizer()
    y_h = np.linalg.solve(H, f.F @ f.a + g.F @ g.a)
    C = alpha2 / (abs(alpha2 - alpha1) + alpha1 * alpha2 * g.L)
    r = c_h * C / f.L
    if np.isclose(r, 1.0):
        raise invalid("alpha1", "step sizes with c_h C / L_f != 1 (the region is then a half-space)",
                      f"ratio {r:.6g}")
    center = (y_f - r ** 2 * y_h) / (1 - r ** 2)
    radius = r * float(np.linalg.norm(y_f - y_h)) / abs(1 - r ** 2)
    return AIMRegion(C=C, ratio=r, center=center, radius=radius, descent_inside=r < 1,
                     step_ok=alpha2 <= 1 / L_h, y_f=y_f, y_h=y_h)
