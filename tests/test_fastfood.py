"""The Fastfood map of eq. (9) (UCSD report): it is the dense matrix it represents, its
Walsh-Hadamard transform costs D log D, and its scaling matches the formula."""
import math

import numpy as np
import pytest
import torch
from scipy.linalg import hadamard
from torch.utils._python_dispatch import TorchDispatchMode

import cvxtransformer as ct
from cvxtransformer.core.errors import InvalidInputError
from cvxtransformer.nn.fastfood import Fastfood, fwht, next_power_of_two, precondition


# ----------------------------------------------------------------------------- the transform
@pytest.mark.parametrize("D", [1, 2, 4, 8, 64, 256])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_fwht_equals_hadamard_product(D, backend):
    x = np.random.default_rng(D).standard_normal((3, 5, D))
    expected = x @ hadamard(D)
    given = x.copy() if backend == "numpy" else torch.tensor(x)
    out = fwht(given)
    out = out if backend == "numpy" else out.numpy()
    assert out.shape == x.shape
    np.testing.assert_allclose(out, expected, atol=1e-11 * D)
    np.testing.assert_array_equal(given if backend == "numpy" else given.numpy(), x)  # input untouched


def test_fwht_is_its_own_inverse_up_to_D():
    x = np.random.default_rng(0).standard_normal((4, 32))
    np.testing.assert_allclose(fwht(fwht(x)) / 32, x, atol=1e-12)


def test_fwht_gradient():
    x = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fwht, (x,))


class CountAdditions(TorchDispatchMode):
    """Counts the aten additions/subtractions actually executed and the elements they write."""

    def __init__(self):
        super().__init__()
        self.calls, self.elements = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.add, torch.ops.aten.add_, torch.ops.aten.sub,
                                   torch.ops.aten.sub_):
            self.calls += 1
            self.elements += out.numel()
        return out


@pytest.mark.parametrize("log_D", range(1, 13))
def test_fwht_does_D_log_D_additions(log_D):
    """Counted by intercepting the executed torch operations, not by the code's own bookkeeping:
    log2 D butterfly stages, each one addition and one subtraction over D/2 entries per row."""
    D, rows = 2 ** log_D, 3
    x = torch.randn(rows, D)
    with CountAdditions() as counter:
        fwht(x)
    assert counter.calls == 2 * log_D
    assert counter.elements == rows * D * log_D
    stats = {}
    fwht(x.numpy(), stats)
    assert stats == {"stages": log_D, "flops": rows * D * log_D}


def test_fastfood_cost_grows_as_D_log_D_not_D_squared():
    ratios, dense = [], []
    for k in range(3, 13):
        D = 2 ** k
        ff = Fastfood(D, D, seed=0)
        stats = {}
        ff.transform(np.ones((1, D)), stats)
        assert stats["stages"] == ff.cost()["stages"] == 2 * k          # two transforms per block
        assert stats["flops"] == 2 * D * k                               # butterflies only
        ratios.append(ff.cost()["flops"] / (D * k))
        dense.append(ff.cost()["dense_flops"] / ff.cost()["flops"])
    assert max(ratios) / min(ratios) < 1.5                               # flops / (D log D) stays flat
    assert all(b > a for a, b in zip(dense, dense[1:]))                  # the dense product falls behind
    assert dense[-1] > 100


def test_fastfood_cost_with_stacked_blocks():
    ff = Fastfood(10, 100, seed=0)              # d_pad = 16, 7 blocks
    stats = {}
    ff.transform(np.ones((5, 10)), stats)
    assert ff.d_pad == 16 and ff.blocks == 7
    assert stats == {"stages": 2 * 7 * 4, "flops": 5 * 2 * 7 * 16 * 4}


# ----------------------------------------------------------------------------- the dense matrix
def dense_from_factors(ff):
    """``1/(sigma sqrt(D)) [S H G Pi H B]`` built here from the factors, independently of ff.matrix()."""
    H = hadamard(ff.d_pad)
    blocks = []
    for b in range(ff.blocks):
        Pi = np.zeros((ff.d_pad, ff.d_pad))
        Pi[np.arange(ff.d_pad), ff.perm[b]] = 1.0
        blocks.append(np.diag(ff.S[b]) @ H @ np.diag(ff.G[b]) @ Pi @ H @ np.diag(ff.B[b]))
    return np.vstack(blocks)[:ff.D, :ff.d] / (ff.sigma * math.sqrt(ff.D))


@pytest.mark.parametrize("d, D", [(8, 8), (5, 8), (5, 3), (6, 20), (16, 64), (1, 4), (33, 70)])
@pytest.mark.parametrize("g", ["gaussian", "chi"])
def test_fastfood_equals_its_dense_matrix(d, D, g):
    ff = Fastfood(d, D, sigma=1.7, seed=d + D, g=g)
    M = dense_from_factors(ff)
    np.testing.assert_allclose(ff.matrix(), M, atol=1e-12)
    X = np.random.default_rng(0).standard_normal((4, 3, d))
    np.testing.assert_allclose(ff.transform(X), X @ M.T, atol=1e-10)
    t = ff.torch_forward(torch.tensor(X))
    np.testing.assert_allclose(t.numpy(), X @ M.T, atol=1e-10)
    t32 = ff.torch_forward(torch.tensor(X, dtype=torch.float32))
    assert t32.dtype == torch.float32
    np.testing.assert_allclose(t32.numpy(), X @ M.T, atol=1e-4)


def test_fastfood_factors_have_their_distributions():
    ff = Fastfood(6, 40, seed=1, g="chi")
    assert ff.d_pad == 8 and ff.blocks == 5
    assert set(np.unique(ff.B)) <= {-1.0, 1.0}
    assert all(sorted(p) == list(range(8)) for p in ff.perm)
    assert np.all(ff.G >= 0)                                           # chi with one degree of freedom
    assert np.any(Fastfood(6, 40, seed=1, g="gaussian").G < 0)


def test_torch_gradient_is_the_transposed_matrix():
    ff = Fastfood(5, 12, seed=3)
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 12, dtype=torch.float64)
    (ff.torch_forward(x) * w).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), w.numpy() @ ff.matrix(), atol=1e-12)


# ----------------------------------------------------------------------------- scaling
@pytest.mark.parametrize("d, D", [(8, 8), (8, 32), (4, 6)])
def test_row_norms_follow_the_formula(d, D):
    """Row i of the (padded) map has norm s_i sqrt(d_pad) / (sigma sqrt(D)), s_i = S_ii ||G||_F."""
    ff = Fastfood(d, D, sigma=0.8, seed=2)
    s = (ff.S * np.linalg.norm(ff.G, axis=1, keepdims=True)).reshape(-1)[:D]
    expected = s * math.sqrt(ff.d_pad) / (0.8 * math.sqrt(D))
    np.testing.assert_allclose(np.linalg.norm(ff.matrix(padded=True), axis=1), expected, rtol=1e-12)
    np.testing.assert_allclose(ff.row_norms, expected, rtol=1e-12)
    assert ff.scale == pytest.approx(1 / (0.8 * math.sqrt(D)))


def test_sigma_and_D_enter_as_one_over_sigma_sqrt_D():
    x = np.random.default_rng(0).standard_normal((3, 8))
    a, b = Fastfood(8, 16, sigma=1.0, seed=4), Fastfood(8, 16, sigma=2.5, seed=4)
    np.testing.assert_allclose(b.transform(x), a.transform(x) / 2.5, rtol=1e-12)
    # D = 9 and D = 16 both use two blocks of 8, so the same random factors: the first 9
    # features differ by the factor sqrt(16 / 9) alone
    c, e = Fastfood(8, 9, seed=5), Fastfood(8, 16, seed=5)
    np.testing.assert_allclose(e.transform(x)[:, :9], c.transform(x) * math.sqrt(9 / 16), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("g", ["gaussian", "chi"])
def test_expected_squared_norm_matches_formula(g):
    """E ||phi(x)||^2 = d_pad ||x||^2 / sigma^2 over the random factors (Monte Carlo, 4 s.e.)."""
    d, D, sigma, draws = 6, 24, 1.5, 3000
    x = np.random.default_rng(0).standard_normal(d)
    values = np.array([np.sum(Fastfood(d, D, sigma, seed=s, g=g).transform(x) ** 2) for s in range(draws)])
    expected = next_power_of_two(d) * (x @ x) / sigma ** 2
    assert abs(values.mean() - expected) < 4 * values.std() / math.sqrt(draws)
    assert abs(values.mean() / expected - 1) < 0.05


# ----------------------------------------------------------------------------- as an input transform
def test_precondition_feeds_any_convex_program():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4, 5))
    F, ff = precondition(X, D=16, sigma=2.0, seed=1)
    assert F.shape == (30, 4, 16) and ff.D == 16
    np.testing.assert_allclose(F, X @ ff.matrix().T, atol=1e-12)
    for program, y, loss in ((8, rng.standard_normal(30), "squared"), (10, rng.integers(0, 3, 30), "cross_entropy"),
                             (12, rng.standard_normal((30, 2)), "squared")):
        problem = ct.make_problem(F, y, program=program, loss=loss, beta=1.0, gates=3)
        result = ct.solve(problem.with_beta(0.3 * problem.beta_max()), tol=1e-5)
        assert result.certified
    assert precondition(X)[0].shape == (30, 4, 8)        # default D = next power of two


@pytest.mark.parametrize("kwargs, match", [
    (dict(d=0, D=4), "d: expected an integer >= 1"),
    (dict(d=4, D=0), "D: expected an integer >= 1"),
    (dict(d=4, D=4, sigma=0.0), "sigma: expected a finite number > 0"),
    (dict(d=4, D=4, sigma=float("nan")), "sigma"),
    (dict(d=4, D=4, g="uniform"), "g: expected one of"),
    (dict(d=True, D=4), "d: expected an integer"),
])
def test_invalid_parameters(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        Fastfood(**kwargs)


def test_invalid_inputs():
    ff = Fastfood(4, 8)
    with pytest.raises(InvalidInputError, match="tokens of dimension d = 4"):
        ff.transform(np.ones((3, 5)))
    with pytest.raises(InvalidInputError, match="tokens of dimension d = 4"):
        ff.torch_forward(torch.ones(3, 5))
    with pytest.raises(InvalidInputError, match="power of two"):
        fwht(np.ones((2, 6)))
    with pytest.raises(InvalidInputError, match=r"shape \(N, n, d\)"):
        precondition(np.ones((3, 4)))
