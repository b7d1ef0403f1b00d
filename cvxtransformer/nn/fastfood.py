"""Fastfood kernel preconditioning: eq. (9) of the UCSD report "Convex Self-Attention Mechanisms".

A structured random feature map applied to every token ``x in R^d`` (Le, Sarlos & Smola,
"Fastfood", 2013; the UCSD report's ``phi_cvx``):

    phi(x) = 1 / (sigma sqrt(D)) * S H G Pi H B x          in R^D

on ``x`` zero-padded to ``d' = 2^ceil(log2 d)``, where, for each of ``ceil(D / d')`` stacked
blocks (the rows of the blocks are concatenated and cut to D):

* ``B`` diagonal, i.i.d. Rademacher signs;
* ``H`` the (unnormalised, +-1) Walsh-Hadamard matrix of order ``d'``, applied by the fast
  Walsh-Hadamard transform :func:`fwht` (``log2 d'`` butterfly stages, each touching the
  ``d'`` entries once: ``O(d' log d')`` per token, never a dense product);
* ``Pi`` a uniformly random permutation;
* ``G`` diagonal: i.i.d. N(0, 1) (``g="gaussian"``, Fastfood) or their absolute values
  (``g="chi"``, chi with one degree of freedom: the report's ``G_chi``, which has no sign flips);
* ``S`` diagonal, ``S_ii = s_i / ||G||_F`` with ``s_i`` i.i.d. chi with ``d'`` degrees of freedom,
  so that row i of ``S H G Pi H B`` has norm exactly ``s_i sqrt(d')`` (rows distributed like
  Gaussian rows in length).

Scaling (tested): row i of the map has norm ``s_i sqrt(d') / (sigma sqrt(D))``, and, over the
randomness of ``S``, ``Pi`` (and for any ``G``, ``B``),
``E ||phi(x)||^2 = d' ||x||^2 / sigma^2``: the map is an unbiased, D-independent estimate of
the linear kernel ``(d' / sigma^2) <x, y>``, whose variance falls as D grows.

The map is linear, so a convex program on ``phi(X)`` is still convex: for program (10),
``<Z, phi(X_i)> = <Z Phi, X_i>``, the same predictions with the group penalty measured in the
geometry of ``Phi``. :meth:`Fastfood.transform` maps a data set ``X`` (N, n, d) to (N, n, D) for
:func:`cvxtransformer.make_problem`; :meth:`Fastfood.torch_forward` is the differentiable torch
form used by :mod:`cvxtransformer.deep`.

Example
-------
>>> import numpy as np
>>> ff = Fastfood(d=5, D=16, sigma=1.0, seed=0)
>>> x = np.random.default_rng(1).standard_normal((3, 5))
>>> bool(np.allclose(ff.transform(x), x @ ff.matrix().T))
True
"""
import math
import numbers

import numpy as np
import torch

from ..core.errors import invalid

G_DISTRIBUTIONS = ("gaussian", "chi")


def next_power_of_two(d):
    """Smallest power of two >= d."""
    return 1 << max(0, int(d) - 1).bit_length()


def _check_power_of_two(D):
    if D < 1 or D & (D - 1):
        raise invalid("x", "a last axis whose length is a power of two", f"length {D}",
                      "zero-pad it (Fastfood pads to next_power_of_two(d))")


def _butterflies_(y):
    """The log2 D butterfly stages, in place, on a 2-d array or tensor (rows, D); returns log2 D."""
    rows, D = y.shape
    is_torch = torch.is_tensor(y)
    h, stages = 1, 0
    while h < D:
        v = y.view(rows, D // (2 * h), 2, h) if is_torch else y.reshape(rows, D // (2 * h), 2, h)
        top, bottom = v[:, :, 0, :], v[:, :, 1, :]
        a = top.clone() if is_torch else top.copy()
        top += bottom            # a + b
        a -= bottom              # a - b
        bottom[...] = a
        h, stages = 2 * h, stages + 1
    return stages


def fwht(x, stats=None):
    """Unnormalised fast Walsh-Hadamard transform along the last axis: ``x @ H`` (H symmetric, +-1).

    Parameters
    ----------
    x : ndarray or torch tensor of shape (..., D), D a power of two
    stats : optional dict; ``stats["stages"]`` is increased by ``log2 D`` and ``stats["flops"]``
        by ``D log2 D`` per row (each butterfly stage does D/2 additions and D/2 subtractions)

    Returns a new array/tensor (the input is not modified); the ``log2 D`` stages run in place
    on that copy, each vectorised over all rows (numpy: over blocks of rows that fit in cache),
    with one temporary half-buffer per stage. Torch tensors keep their autograd graph.

    >>> fwht(np.array([1.0, 0.0, 0.0, 0.0]))
    array([1., 1., 1., 1.])
    """
    D = x.shape[-1]
    _check_power_of_two(D)
    if torch.is_tensor(x):
        y = x.reshape(-1, D).clone()
        stages = _butterflies_(y)
    else:
        y = np.array(x, dtype=float).reshape(-1, D)
        chunk = max(1, 16384 // D)  # 128 KiB of float64 per block of rows
        stages = 0
        for start in range(0, y.shape[0], chunk):
            stages = _butterflies_(y[start:start + chunk])
    if stats is not None:
        stats["stages"] = stats.get("stages", 0) + stages
        stats["flops"] = stats.get("flops", 0) + y.shape[0] * D * stages
    return y.reshape(x.shape)


class Fastfood:
    """The Fastfood map ``phi: R^d -> R^D`` of eq. (9) (see the module docstring).

    Parameters
    ----------
    d : int >= 1, input dimension (padded to ``d_pad = next_power_of_two(d)``)
    D : int >= 1, number of features (``ceil(D / d_pad)`` stacked blocks)
    sigma : float > 0, bandwidth
    seed : seed of B, Pi, G, S
    g : "gaussian" (Fastfood's G) or "chi" (the report's ``G_chi = |G|``)

    Attributes
    ----------
    d_pad, blocks, scale (``1 / (sigma sqrt(D))``)
    B, G, S : ndarrays of shape (blocks, d_pad); perm : int ndarray of shape (blocks, d_pad)
    """

    def __init__(self, d, D, sigma=1.0, seed=0, g="chi"):
        for name, v in (("d", d), ("D", D)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise invalid(name, "an integer >= 1", repr(v))
        if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not math.isfinite(sigma) or sigma <= 0:
            raise invalid("sigma", "a finite number > 0 (the kernel bandwidth)", repr(sigma))
        if g not in G_DISTRIBUTIONS:
            raise invalid("g", f"one of {G_DISTRIBUTIONS}", repr(g))
        self.d, self.D, self.sigma, self.seed, self.g = int(d), int(D), float(sigma), seed, g
        self.d_pad = next_power_of_two(d)
        self.blocks = -(-self.D // self.d_pad)
        self.scale = 1.0 / (self.sigma * math.sqrt(self.D))
        rng = np.random.default_rng(seed)
        shape = (self.blocks, self.d_pad)
        self.B = rng.choice((-1.0, 1.0), size=shape)
        self.perm = np.stack([rng.permutation(self.d_pad) for _ in range(self.blocks)])
        G = rng.standard_normal(shape)
        self.G = np.abs(G) if g == "chi" else G
        s = np.sqrt(rng.chisquare(self.d_pad, size=shape))
        self.S = s / np.linalg.norm(self.G, axis=1, keepdims=True)
        self._torch = {}

    def __repr__(self):
        return (f"Fastfood(d={self.d}, D={self.D}, sigma={self.sigma:g}, seed={self.seed}, g={self.g!r}; "
                f"{self.blocks} block(s) of {self.d_pad})")

    @property
    def row_norms(self):
        """Exact norms of the D rows of the padded map (``matrix(padded=True)``):
        ``s_i sqrt(d_pad) / (sigma sqrt(D))``."""
        s = self.S * np.linalg.norm(self.G, axis=1, keepdims=True)
        return (s.reshape(-1)[:self.D] * math.sqrt(self.d_pad) * self.scale)

    def _apply(self, xp, B, perm, G, S, stats=None):
        """``x`` padded, shape (rows, d_pad) -> features (rows, D); xp is numpy or torch data."""
        out = []
        for b in range(self.blocks):
            y = fwht(xp * B[b], stats)
            y = fwht(y[:, perm[b]] * G[b], stats)
            out.append(y * S[b])
        cat = torch.cat(out, dim=1) if torch.is_tensor(xp) else np.concatenate(out, axis=1)
        return cat[:, :self.D] * self.scale

    def _check(self, shape):
        if len(shape) < 1 or shape[-1] != self.d:
            raise invalid("x", f"tokens of dimension d = {self.d} on the last axis", f"shape {tuple(shape)}")

    def transform(self, x, stats=None):
        """``phi`` on every token: ndarray (..., d) -> (..., D), e.g. a data set (N, n, d) -> (N, n, D).

        ``stats`` is passed to :func:`fwht` (counts stages and flops).
        """
        x = np.asarray(x, dtype=float)
        self._check(x.shape)
        flat = np.zeros((int(np.prod(x.shape[:-1], dtype=int)), self.d_pad))
        flat[:, :self.d] = x.reshape(-1, self.d)
        return self._apply(flat, self.B, self.perm, self.G, self.S, stats).reshape(*x.shape[:-1], self.D)

    __call__ = transform

    def torch_forward(self, x):
        """Differentiable ``phi`` on a torch tensor (..., d) -> (..., D), same dtype and device."""
        self._check(x.shape)
        key = (x.dtype, x.device)
        if key not in self._torch:
            t = lambda a: torch.as_tensor(a, dtype=x.dtype, device=x.device)
            self._torch[key] = (t(self.B), torch.as_tensor(self.perm, device=x.device), t(self.G), t(self.S))
        flat = torch.nn.functional.pad(x.reshape(-1, self.d), (0, self.d_pad - self.d))
        return self._apply(flat, *self._torch[key]).reshape(*x.shape[:-1], self.D)

    def matrix(self, padded=False):
        """The dense (D, d) matrix that the map represents, built explicitly from its factors.

        ``scale * [S_b H diag(G_b) P_b H diag(B_b)]_b`` stacked, cut to D rows and d columns, with
        ``H = scipy.linalg.hadamard(d_pad)`` and ``(P_b y)_i = y[perm_b[i]]``. For tests and
        small ``d``: this is the O(D d) object the fast transform avoids. ``padded=True`` keeps
        all ``d_pad`` columns (the map on zero-padded tokens).
        """
        from scipy.linalg import hadamard

        H = hadamard(self.d_pad).astype(float)
        rows = []
        for b in range(self.blocks):
            P = np.eye(self.d_pad)[self.perm[b]]
            rows.append(np.diag(self.S[b]) @ H @ np.diag(self.G[b]) @ P @ H @ np.diag(self.B[b]))
        return self.scale * np.concatenate(rows, axis=0)[:self.D, :self.d_pad if padded else self.d]

    def cost(self, rows=1):
        """Arithmetic of :meth:`transform` on ``rows`` tokens, counted analytically.

        Returns a dict: ``stages`` (Walsh-Hadamard butterfly stages, ``2 blocks log2 d_pad``),
        ``flops`` (``2 blocks d_pad log2 d_pad`` additions per token, plus ``4 blocks d_pad``
        diagonal products), and ``dense_flops`` (``2 D d`` per token for the dense matrix).
        """
        log = int(math.log2(self.d_pad))
        return {"stages": 2 * self.blocks * log,
                "flops": rows * (2 * self.blocks * self.d_pad * log + 4 * self.blocks * self.d_pad),
                "dense_flops": rows * 2 * self.D * self.d}


def precondition(X, D=None, sigma=1.0, seed=0, g="chi"):
    """``phi(X)`` for a data set ``X`` of shape (N, n, d): the input of the kernel-preconditioned
    program (9) of the UCSD report (use it as ``X`` of :func:`cvxtransformer.make_problem`).

    ``D`` defaults to ``next_power_of_two(d)``. Returns ``(phi(X) of shape (N, n, D), Fastfood)``.
    """
    X = np.asarray(X, dtype=float)
    if X.ndim != 3:
        raise invalid("X", "shape (N, n, d)", f"shape {X.shape}")
    ff = Fastfood(X.shape[2], next_power_of_two(X.shape[2]) if D is None else D, sigma, seed, g)
    return ff.transform(X), ff
