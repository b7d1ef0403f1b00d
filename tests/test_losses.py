"""Losses: values, gradients, conjugates and CVXPY forms against independent computations."""
import cvxpy as cp
import numpy as np
import pytest

from cvxtransformer.core.losses import CrossEntropyLoss, LogisticLoss, SquaredLoss, project_rows_to_simplex

rng = np.random.default_rng(3)
N, C = 7, 4
TARGETS = {
    "squared": (SquaredLoss(), rng.standard_normal((N, C))),
    "logistic": (LogisticLoss(), np.where(rng.standard_normal(N) > 0, 1.0, -1.0)),
    "cross_entropy": (CrossEntropyLoss(), rng.integers(0, C, N)),
}


def explicit_value(name, Yhat, y):
    """The SPEC.md formulas, one sample at a time."""
    total = 0.0
    for i in range(len(Yhat)):
        if name == "squared":
            total += 0.5 * sum((Yhat[i, l] - y[i, l]) ** 2 for l in range(Yhat.shape[1]))
        elif name == "logistic":
            total += np.log(1 + np.exp(-y[i] * Yhat[i, 0]))
        else:
            total += np.log(np.sum(np.exp(Yhat[i]))) - Yhat[i, y[i]]
    return total


@pytest.mark.parametrize("name", TARGETS)
def test_value_matches_formula(name):
    loss, y = TARGETS[name]
    T = loss.encode(y)
    Yhat = rng.standard_normal(T.shape)
    assert loss.value(Yhat, T) == pytest.approx(explicit_value(name, Yhat, y), rel=1e-13)


def random_point(name):
    """(loss, encoded targets T, a random Yhat, V = -grad L(Yhat))."""
    loss, y = TARGETS[name]
    T = loss.encode(y)
    Yhat = rng.standard_normal(T.shape)
    return loss, T, Yhat, loss.dual_variable(Yhat, T)


@pytest.mark.parametrize("name", TARGETS)
def test_dual_variable_is_negative_gradient(name):
    loss, T, Yhat, V = random_point(name)
    eps = 1e-6
    fd = np.zeros_like(Yhat)
    for idx in np.ndindex(Yhat.shape):
        E = np.zeros_like(Yhat)
        E[idx] = eps
        fd[idx] = (loss.value(Yhat + E, T) - loss.value(Yhat - E, T)) / (2 * eps)
    np.testing.assert_allclose(V, -fd, atol=1e-8)


@pytest.mark.parametrize("name", TARGETS)
def test_conjugate_satisfies_fenchel_young_equality(name):
    # At V = -grad L(yhat): -L*(-V) = L(yhat) + <V, yhat>.
    loss, T, Yhat, V = random_point(name)
    assert loss.dual_objective(V, T) == pytest.approx(loss.value(Yhat, T) + np.sum(V * Yhat), rel=1e-12)


@pytest.mark.parametrize("name", TARGETS)
def test_conjugate_is_a_lower_bound_by_weak_duality(name):
    # -L*(-V) <= L(yhat) + <V, yhat> for every yhat (Fenchel-Young inequality), V in the domain.
    loss, y = TARGETS[name]
    T = loss.encode(y)
    V = loss.dual_variable(rng.standard_normal(T.shape), T)
    for _ in range(20):
        Yhat = 3 * rng.standard_normal(T.shape)
        assert loss.dual_objective(V, T) <= loss.value(Yhat, T) + np.sum(V * Yhat) + 1e-12


@pytest.mark.parametrize("name", TARGETS)
def test_cvxpy_forms_agree_with_numpy(name):
    loss, y = TARGETS[name]
    T = loss.encode(y)
    Yhat = rng.standard_normal(T.shape)
    assert loss.cvxpy_value(cp.Constant(Yhat), T).value == pytest.approx(loss.value(Yhat, T), rel=1e-12)
    V = loss.dual_variable(Yhat, T)
    expr, constraints = loss.cvxpy_dual(cp.Constant(V), T)
    assert expr.value == pytest.approx(loss.dual_objective(V, T), rel=1e-12)
    assert all(np.all(c.value()) if callable(c.value) else c.value for c in constraints)


@pytest.mark.parametrize("name", TARGETS)
def test_projection_lands_in_domain_and_fixes_its_points(name):
    loss, y = TARGETS[name]
    T = loss.encode(y)
    V = loss.dual_variable(rng.standard_normal(T.shape), T)
    np.testing.assert_allclose(loss.project_dual_domain(V, T), V, atol=1e-15)
    W = loss.project_dual_domain(5 * rng.standard_normal(T.shape), T)
    assert np.isfinite(loss.dual_objective(W, T))
    if name == "logistic":
        assert np.all((T * W >= 0) & (T * W <= 1))
    if name == "cross_entropy":
        P = T - W
        assert np.all(P >= 0) and np.allclose(P.sum(axis=1), 1.0)


def test_simplex_projection_against_cvxpy():
    P = rng.standard_normal((5, 6))
    x = cp.Variable((5, 6))
    cp.Problem(cp.Minimize(cp.sum_squares(x - P)), [x >= 0, cp.sum(x, axis=1) == 1]).solve(solver="CLARABEL")
    np.testing.assert_allclose(project_rows_to_simplex(P), x.value, atol=1e-7)


@pytest.mark.parametrize("name", TARGETS)
def test_torch_face_matches_numpy_face(name):
    import torch

    loss, T, Yhat, V = random_point(name)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
    assert float(loss.value(t(Yhat), t(T))) == pytest.approx(loss.value(Yhat, T), rel=1e-14)
    np.testing.assert_allclose(loss.dual_variable(t(Yhat), t(T)).numpy(), V, rtol=1e-14, atol=1e-15)
    for s in (1.0, 0.37):
        assert float(loss.dual_objective(t(V), t(T), s)) == pytest.approx(loss.dual_objective(s * V, T), rel=1e-13)
    # float32 inputs, float64 accumulation: close to the float64 values, and a float64 result
    value32 = loss.value(t(Yhat).float(), t(T).float())
    assert value32.dtype == torch.float64 and float(value32) == pytest.approx(loss.value(Yhat, T), rel=1e-6)


@pytest.mark.parametrize("name", TARGETS)
def test_capabilities_hold_numerically(name):
    loss, T, _, _ = random_point(name)
    # lipschitz: ||grad L(a) - grad L(b)|| <= lipschitz ||a - b|| per sample, tight for some pair
    ratios = []
    for _ in range(200):
        a, b = 3 * rng.standard_normal(T.shape), 3 * rng.standard_normal(T.shape)
        ga, gb = loss.gradient(a, T), loss.gradient(b, T)
        ratios.append(np.max(np.linalg.norm(ga - gb, axis=1) / np.linalg.norm(a - b, axis=1)))
    assert max(ratios) <= loss.lipschitz * (1 + 1e-12)
    # quadratic: L(a + t d) is a quadratic in t (its third difference vanishes)
    a, d = rng.standard_normal(T.shape), rng.standard_normal(T.shape)
    f = [loss.value(a + k * d, T) for k in range(4)]
    third = f[3] - 3 * f[2] + 3 * f[1] - f[0]
    assert (abs(third) <= 1e-9 * max(map(abs, f))) == loss.quadratic
    # strong concavity of D: D(V + t W) <= D(V) + t <grad D, W> - mu t^2 / 2 ||W||^2, on the domain
    V = loss.dual_variable(rng.standard_normal(T.shape), T)
    W = loss.dual_variable(rng.standard_normal(T.shape), T) - V  # a direction inside the domain
    h = 1e-6
    dd = (loss.dual_objective(V + h * W, T) - 2 * loss.dual_objective(V, T) + loss.dual_objective(V - h * W, T)) / h**2
    assert dd <= -loss.strong_concavity * np.sum(W * W) * (1 - 1e-3)
