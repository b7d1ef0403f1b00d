"""The prox of the nuclear norm per token (programs 10wd/12wd) through the Gram matrix of long token matrices,
against singular-value thresholding written here with numpy's SVD."""
import numpy as np
import pytest
import torch

from cvxtransformer.core.regularizers import NuclearNorm, TokenNuclearNorm


def graded(shape, seed=0):
    """Coefficients ``(h, c, n, d)`` whose token matrices have singular values spread from 1e-8 to 1e2."""
    rng = np.random.default_rng(seed)
    h, c, n, d = shape
    q = min(c, d)
    Z = np.empty(shape)
    for j in range(h):
        for k in range(n):
            U = np.linalg.qr(rng.standard_normal((c, q)))[0]
            W = np.linalg.qr(rng.standard_normal((d, q)))[0]
            Z[j, :, k, :] = (U * np.logspace(-8, 2, q) * rng.uniform(0.5, 2.0)) @ W.T
    return Z


def thresholded(Z, t):
    """``U max(S - t, 0) W^T`` of every token matrix ``Z[j, :, k, :]``."""
    out = np.empty_like(Z)
    for j in range(Z.shape[0]):
        for k in range(Z.shape[2]):
            U, s, Wh = np.linalg.svd(Z[j, :, k, :], full_matrices=False)
            out[j, :, k, :] = (U * np.maximum(s - t, 0.0)) @ Wh
    return out


@pytest.mark.parametrize("shape", [(1, 48, 3, 6), (2, 5, 3, 40), (1, 12, 2, 9)], ids=["tall", "wide", "square"])
@pytest.mark.parametrize("t", [3e-5, 0.0131, 0.77, 41.0, 500.0])
def test_prox_is_singular_value_thresholding(monkeypatch, shape, t):
    Z = graded(shape)
    calls = []
    svd_prox = NuclearNorm.prox
    monkeypatch.setattr(NuclearNorm, "prox", lambda self, *a: calls.append(1) or svd_prox(self, *a))
    reg = TokenNuclearNorm(2.0)
    out = reg.prox(Z, t / 2.0)
    expected = thresholded(Z, t)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12 * np.abs(Z).max())
    assert reg.rank(out) == TokenNuclearNorm.rank(expected)
    long_matrices = max(shape[1], shape[3]) >= 4 * min(shape[1], shape[3])
    s_max = np.linalg.norm(np.swapaxes(Z, 1, 2), 2, axis=(-2, -1)).max()
    # the Gram route for long matrices, unless the largest singular value is beyond GRAM_REACH thresholds
    assert bool(calls) == (not long_matrices or s_max > TokenNuclearNorm.GRAM_REACH * t)


def test_prox_route_choices(monkeypatch):
    """float32, and a threshold far below the largest singular value, take the SVD; the result is the same."""
    Z = graded((1, 48, 2, 6), seed=1)
    calls = []
    svd_prox = NuclearNorm.prox
    monkeypatch.setattr(NuclearNorm, "prox", lambda self, *a: calls.append(1) or svd_prox(self, *a))
    reg = TokenNuclearNorm(1.0)
    reg.prox(Z, 0.5)
    assert not calls  # the Gram route
    tiny = 1e-6 * np.linalg.norm(Z[0, :, 0, :], 2) / TokenNuclearNorm.GRAM_REACH
    np.testing.assert_allclose(reg.prox(Z, tiny), thresholded(Z, tiny), rtol=0, atol=1e-12 * np.abs(Z).max())
    assert len(calls) == 1
    single = reg.prox(torch.as_tensor(Z, dtype=torch.float32), 0.5)
    assert single.dtype == torch.float32 and len(calls) == 2
    np.testing.assert_allclose(single.numpy(), thresholded(Z, 0.5), rtol=0, atol=1e-5 * np.abs(Z).max())
    assert np.all(reg.prox(np.zeros((1, 48, 2, 6)), 0.5) == 0)
