"""Synthetic student-teacher data: tokens in, outputs of a random teacher attention network."""
import numpy as np

from ..core.errors import invalid


def student_teacher(N=200, n=8, d=6, c=3, heads=2, noise=0.05, teacher="simplex", sequence=False, seed=0):
    """Inputs ``X`` i.i.d. N(0, 1) and targets from a random teacher attention network, plus noise.

    teacher="simplex": the alternative attention network (9),
    ``yhat_i = sum_j (w_1j^T X_i w_2j) w_3j``, with attention rows ``w_1j`` that are sparse
    points of the simplex (two tokens each), so the teacher is a few token groups;
    teacher="softmax": single-layer softmax self-attention (3),
    ``Yhat_i = softmax(X_i Wq Wk^T X_i^T / sqrt(d)) X_i Wv Wo``, read at token 0
    (or at every token with ``sequence=True``).

    Returns
    -------
    X : ndarray of shape (N, n, d)
    Y : ndarray of shape (N, c), or (N, n, c) with ``sequence=True`` (softmax teacher)
    """
    for name, value in dict(N=N, n=n, d=d, c=c, heads=heads).items():
        if int(value) != value or value < 1:
            raise invalid(name, "an integer >= 1", repr(value))
    if teacher not in ("simplex", "softmax"):
        raise invalid("teacher", "'simplex' or 'softmax'", repr(teacher))
    if sequence and teacher != "softmax":
        raise invalid("sequence", "False for the simplex teacher", "True", "use teacher='softmax'")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n, d))
    if teacher == "simplex":
        W1 = np.zeros((heads, n))
        for j in range(heads):
            tokens = rng.choice(n, size=min(2, n), replace=False)
            W1[j, tokens] = rng.dirichlet(np.ones(len(tokens)))
        W2 = rng.standard_normal((heads, d)) / np.sqrt(d)
        W3 = rng.standard_normal((heads, c))
        Y = np.einsum("jk,ikd,jd->ij", W1, X, W2) @ W3
    else:
        from scipy.special import softmax  # only here: the rest of the package needs no SciPy

        Wq, Wk, Wv = (rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(3))
        Wo = rng.standard_normal((d, c)) / np.sqrt(d)
        A = softmax(np.einsum("ikd,de,fe,ilf->ikl", X, Wq, Wk, X) / np.sqrt(d), axis=-1)
        Y = np.einsum("ikl,ild,de,ec->ikc", A, X, Wv, Wo)
        if not sequence:
            Y = Y[:, 0, :]
    return X, Y + noise * rng.standard_normal(Y.shape)
