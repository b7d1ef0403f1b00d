"""Algorithmic data sets of the grokking literature (Power et al., 2022) as token sequences.

Every equation ``x op y = z`` is the sequence of n = 4 tokens ``[x, op, y, =]`` over a
vocabulary of V = p + 2 symbols: the residues ``0..p-1``, then ``op`` (id ``p``) and ``=``
(id ``p + 1``). The label is ``z`` in ``[0, p)`` (cross-entropy loss, c = p classes). The
table of the periodicity task holds every pair with ``x`` coprime to p. Division has three
readings (``reading``), which coincide for a prime p:

* ``"invertible"`` (default): ``z = x y^{-1}`` for every x and every ``y`` coprime to p (for
  p = 15, y in {1, 2, 4, 7, 8, 11, 13, 14}: 120 equations);
* ``"power"``: the generator of Power et al. (``openai/grok``): for every ``z`` in [0, p) and
  ``y`` in [1, p), the equation ``(y z mod p) / y = z``; for a composite p some inputs ``(x, y)``
  then carry several labels (p = 15: 210 equations, conflicting labels);
* ``"fermat"``: ``z = x y^{p-2} mod p`` for every x and ``y`` in [1, p) (the Fermat inverse:
  for a composite p this is multiplication by ``y^{p-2}``, not division; p = 15: 210 equations).

The table is split once, after a shuffle, into ``round(train_fraction * N)`` training and the
rest test equations.

Tokens are embedded one-hot (``d = V``) by default, or by a fixed Gaussian embedding
``E`` of shape (V, embedding_dim) with entries N(0, 1/embedding_dim) drawn from the seed.
"""
import math
import numbers
from typing import NamedTuple

import numpy as np

from ..core.errors import invalid


class AlgorithmicData(NamedTuple):
    """One split of an algorithmic task (unpacks as a tuple).

    X_train : ndarray (N_train, 4, d), the embedded token sequences ``[x, op, y, =]``
    y_train : ndarray (N_train,) of int64 labels in [0, p)
    X_test, y_test : the same for the held-out equations (N_test = N - N_train)
    tokens_train, tokens_test : ndarrays (N_train, 4) and (N_test, 4) of token ids in [0, p + 2)
    """

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    tokens_train: np.ndarray
    tokens_test: np.ndarray


def _check(p, train_fraction, embedding_dim, minimum_p):
    if isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < minimum_p:
        raise invalid("p", f"an integer modulus >= {minimum_p}", repr(p))
    if (isinstance(train_fraction, bool) or not isinstance(train_fraction, numbers.Real)
            or not 0 < train_fraction < 1):
        raise invalid("train_fraction", "a number in (0, 1)", repr(train_fraction),
                      "both the training and the test split must be non-empty")
    if embedding_dim is not None and (isinstance(embedding_dim, bool) or
                                      not isinstance(embedding_dim, numbers.Integral) or embedding_dim < 1):
        raise invalid("embedding_dim", "None (one-hot) or an integer >= 1", repr(embedding_dim))
    return int(p)


def _split(x, y, z, p, train_fraction, seed, embedding_dim):
    N = len(z)
    n_train = int(round(train_fraction * N))
    if not 1 <= n_train <= N - 1:
        raise invalid("train_fraction", f"a fraction leaving at least one of the {N} equations "
                      "in each split", repr(train_fraction))
    tokens = np.stack([x, np.full(N, p), y, np.full(N, p + 1)], axis=1).astype(np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(N)
    V = p + 2
    if embedding_dim is None:
        E = np.eye(V)
    else:
        E = np.random.default_rng([seed, 1]).standard_normal((V, embedding_dim)) / math.sqrt(embedding_dim)
    train, test = order[:n_train], order[n_train:]
    labels = np.asarray(z, dtype=np.int64)
    return AlgorithmicData(E[tokens[train]], labels[train], E[tokens[test]], labels[test],
                           tokens[train], tokens[test])


def _invertible(p):
    return np.array([v for v in range(p) if math.gcd(v, p) == 1], dtype=np.int64)


READINGS = ("invertible", "power", "fermat")


def division_table(p, reading="invertible"):
    """The equations ``x / y = z`` of one reading (see the module docstring) as three int64
    arrays ``(x, y, z)``, in a fixed order (before any shuffle).

    Example
    -------
    >>> [len(division_table(15, r)[0]) for r in READINGS]
    [120, 210, 210]
    """
    if reading not in READINGS:
        raise invalid("reading", "one of " + ", ".join(map(repr, READINGS)), repr(reading))
    if reading == "power":  # openai/grok: for (z, y), x = y z mod p
        z, y = np.meshgrid(np.arange(p), np.arange(1, p), indexing="ij")
        z, y = z.ravel(), y.ravel()
        return (y * z) % p, y, z
    divisors = _invertible(p) if reading == "invertible" else np.arange(1, p)
    x, y = np.meshgrid(np.arange(p), divisors, indexing="ij")
    x, y = x.ravel(), y.ravel()
    exponent = -1 if reading == "invertible" else p - 2
    factor = np.array([pow(int(v), exponent, p) for v in y], dtype=np.int64)
    return x, y, (x * factor) % p


def modular_division(p=97, train_fraction=0.5, seed=0, embedding_dim=None, reading="invertible"):
    """The table of ``x / y mod p`` under one ``reading`` (see the module docstring).

    With the default reading, ``x / y = x y^{-1} mod p`` for all x in [0, p) and y invertible
    mod p: N = p * phi(p) equations (9312 for p = 97, 120 for p = 15), of which
    ``round(train_fraction * N)`` train. The readings ``"power"`` and ``"fermat"`` hold
    ``p (p - 1)`` equations.

    Returns
    -------
    AlgorithmicData: X_train (N_train, 4, d), y_train (N_train,), X_test (N_test, 4, d),
    y_test (N_test,), tokens_train (N_train, 4), tokens_test (N_test, 4); ``d = p + 2``
    (one-hot) or ``embedding_dim``.

    Example
    -------
    >>> data = modular_division(p=7, train_fraction=0.5, seed=0)
    >>> data.X_train.shape, data.X_test.shape
    ((21, 4, 9), (21, 4, 9))
    """
    p = _check(p, train_fraction, embedding_dim, 2)
    x, y, z = division_table(p, reading)
    return _split(x, y, z, p, train_fraction, seed, embedding_dim)


def periodicity(p=97, train_fraction=0.5, seed=0, embedding_dim=None):
    """The table of ``[(x^{-1} + y^2) (2x mod floor(log2 p))] mod p``, x invertible mod p.

    The factor ``2x mod floor(log2 p)`` makes the label periodic in x; it is 0 for every x when
    ``floor(log2 p) <= 2``, so p >= 8. N = phi(p) * p equations (9312 for p = 97).

    Returns
    -------
    AlgorithmicData, as :func:`modular_division`.

    Example
    -------
    >>> data = periodicity(p=11, train_fraction=0.3, seed=0)
    >>> data.X_train.shape, data.y_test.shape
    ((33, 4, 13), (77,))
    """
    p = _check(p, train_fraction, embedding_dim, 8)
    x, y = np.meshgrid(_invertible(p), np.arange(p), indexing="ij")
    x, y = x.ravel(), y.ravel()
    inverse = np.array([pow(int(v), -1, p) for v in x])
    period = p.bit_length() - 1  # floor(log2 p), exactly
    return _split(x, y, ((inverse + y * y) * ((2 * x) % period)) % p, p, train_fraction, seed, embedding_dim)
