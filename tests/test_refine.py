"""The verifier's refined dual point (issue 10): from Z alone, the gap tracks the true suboptimality
instead of its square root, is never an invalid bound, and the refined point is dual feasible by an
independent computation."""
import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.testing import residual_gap

from conftest import CASES, GROUP_LASSO_CASES, case_id, random_problem

_REFERENCE = {}


def reference(case):
    """A tight solve: (problem, Z*, p*), with p* = P(Z*) certified to about 1e-13 relative."""
    if case not in _REFERENCE:
        problem = random_problem(*case, seed=11)
        result = ct.solve(problem, "fista", tol=1e-13, refine=True)
        assert result.certificate.relative_gap <= 1e-12
        _REFERENCE[case] = problem, result.Z, result.certificate.primal_objective
    return _REFERENCE[case]


def matrices(case, A):
    """The matrices of a nuclear-norm family's coefficients (or scores): one, one per gate, or, for the
    weight-decay programs, one per token, ``A[j, :, k, :]`` (c x d), as a view (..., p, q)."""
    return np.swapaxes(A, -3, -2) if case[0] in ("10wd", "12wd") else A


def along_the_support(case, Z, rng):
    """A direction that keeps the support of Z: nonzero groups only (group lasso), or the row and
    column spaces of Z (nuclear norm). Along it P is smooth, so P(Z + delta D) - p* ~ delta^2."""
    if case in GROUP_LASSO_CASES:
        D = rng.standard_normal(Z.shape)
        return D * (np.linalg.norm(Z, axis=-1, keepdims=True) > 0)
    if case[0] in ("10wd", "12wd"):  # each token's matrix in its own spaces
        tokens = np.ascontiguousarray(matrices(case, Z))
        return np.ascontiguousarray(matrices(case, along_the_support(("mhsa",) + case[1:], tokens, rng)))
    D = np.zeros_like(Z)
    for g, Zg in enumerate(Z.reshape(-1, *Z.shape[-2:])):  # each matrix (one per gate) in its own spaces
        U, s, Wh = np.linalg.svd(Zg, full_matrices=False)
        r = int(np.sum(s > 1e-9 * np.abs(Z).max()))
        D.reshape(-1, *Z.shape[-2:])[g] = U[:, :r] @ rng.standard_normal((r, r)) @ Wh[:r]
    return D


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_refined_gap_tracks_the_true_suboptimality(case):
    problem, Z_star, p_star = reference(case)
    rng = np.random.default_rng(0)
    scale = np.abs(Z_star).max()
    for where in ("support", "everywhere"):
        D = along_the_support(case, Z_star, rng) if where == "support" else rng.standard_normal(Z_star.shape)
        D *= scale / np.abs(D).max()
        for delta in (1e-2, 1e-4, 1e-6, 1e-8):
            Z = Z_star + delta * D
            cert = ct.certify(problem, Z)
            P = cert.primal_objective
            suboptimality = P - p_star
            floor = 1e-12 * max(1.0, abs(P))
            assert cert.duality_gap <= 10 * suboptimality + floor, (where, delta, cert.duality_gap, suboptimality)
            assert cert.duality_gap >= suboptimality - floor  # and it is a valid bound
            assert cert.refined_relative_gap is not None and cert.residual_relative_gap == pytest.approx(
                residual_gap(problem, Z), rel=1e-9, abs=1e-15)
            if where == "support" and delta <= 1e-4:
                # from Z alone the scaled residual is first-order: its gap is much larger
                assert cert.residual_relative_gap > 100 * max(cert.relative_gap, 1e-14), (delta, cert)
                assert cert.dual_source == "refined"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_an_optimal_z_certifies_from_z_alone(case):
    problem, Z_star, _ = reference(case)
    cert = ct.certify(problem, Z_star, tol=1e-9)
    assert cert.certified and cert.relative_gap <= 1e-10
    assert cert.refine_seconds >= 0 and cert.refine_status
    # a solution from another solver (Clarabel's interior point), certified from its Z alone
    other = ct.solve(problem, "clarabel", tol=1e-9, refine=False)
    cert = ct.certify(problem, other.Z, tol=1e-8)
    assert cert.certified and cert.relative_gap <= min(1e-8, 10 * max(cert.residual_relative_gap ** 2, 1e-12))


def explicit_adjoint(problem, V):
    """A^T V from SPEC.md's sums, sample by sample, without the program's operator."""
    p = problem.program
    X = p.X
    if p.name == "mhsa":
        d, c = p.d, p.c
        S = np.zeros((d, d, d, c))  # [k, a, l, b]
        for i in range(p.N):
            G = X[i].T @ X[i]
            rows = X[i].mean(axis=0, keepdims=True) if p.pooled else X[i]
            R = rows.T @ V[i].reshape(rows.shape[0], c)  # (d, c)
            S += np.einsum("kl,ab->kalb", G, R)
        return S.reshape(d * d, d * c)
    if p.name == "gated_mhsa":  # sum_i sum_t G^g_{i,t} (x) x_t V_t^T, G^g_{i,t} = sum_s D_g[t, s] x_s x_s^T
        d, c, n = p.d, p.c, p.n
        S = np.zeros((p.gates, d, d, d, c))
        for i in range(p.N):
            Vt = np.tile(V[i] / n, (n, 1)) if p.pooled else V[i].reshape(n, c)
            for g in range(p.gates):
                for t in range(n):
                    G = sum(float(X[i, t] @ p.H[g] @ X[i, s] >= 0) * np.outer(X[i, s], X[i, s]) for s in range(n))
                    S[g] += np.einsum("kl,ab->kalb", G, np.outer(X[i, t], Vt[t]))
        return S.reshape(p.gates, d * d, d * c)
    if p.name == "mixer":  # sum_{i,a} D_g(i, a) v_ia x_ia^T, v_ia = V_i / d on every channel when pooled
        S = np.zeros(p.shape)
        for i in range(p.N):
            Vi = np.tile(V[i][:, None] / p.d, (1, p.d)) if p.pooled else V[i].reshape(p.n_out, p.d)
            for g in range(p.gates):
                for a in range(p.d):
                    S[g] += float(p.G[g] @ X[i, :, a] >= 0) * np.outer(Vi[:, a], X[i, :, a])
        return S
    M = np.ones((p.N, 1)) if p.mask is None else p.mask
    G = np.zeros(p.canonical_shape)
    for i in range(p.N):
        G += np.einsum("j,l,kd->jlkd", M[i], V[i], X[i])
    return G


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_refined_dual_point_is_feasible_by_an_independent_computation(case):
    problem, Z_star, p_star = reference(case)
    Z = Z_star + 1e-3 * np.random.default_rng(1).standard_normal(Z_star.shape)
    cert = ct.certify(problem, Z)
    V = cert.V
    G = explicit_adjoint(problem, V)
    if case in GROUP_LASSO_CASES:
        norm = np.linalg.norm(G, axis=-1).max()
    else:  # the largest spectral norm over the matrices (one, or one per gate)
        G = matrices(case, G)
        norm = max(np.linalg.norm(Gg, 2) for Gg in G.reshape(-1, *G.shape[-2:]))
    assert norm <= problem.beta * (1 + 1e-12)
    T = problem.T
    if case[1] == "logistic":
        a = T * V
        assert np.all((a >= -1e-15) & (a <= 1 + 1e-15))
    if case[1] == "cross_entropy":
        P = T - V
        assert np.all(P >= -1e-15) and np.allclose(P.sum(axis=1), 1.0, atol=1e-13)
    # D(V) recomputed from SPEC.md's formulas
    if case[1] == "squared":
        D = np.sum(V * T) - 0.5 * np.sum(V * V)
    elif case[1] == "logistic":
        a = np.clip(T * V, 1e-300, 1)
        D = float(np.sum(-a * np.log(a) - np.where(a < 1, (1 - a) * np.log1p(-np.minimum(a, 1 - 1e-300)), 0.0)))
    else:
        P = np.clip(T - V, 0, None)
        D = float(-np.sum(np.where(P > 0, P * np.log(np.where(P > 0, P, 1)), 0.0)))
    assert cert.dual_objective == pytest.approx(D, rel=1e-10, abs=1e-10)
    assert cert.dual_objective <= p_star + 1e-12 * abs(p_star)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_no_refinement_raises_a_bound_above_the_optimum(case):
    problem, Z_star, p_star = reference(case)
    rng = np.random.default_rng(2)
    wrong_support = np.where(np.abs(Z_star) > 0, 0.0, rng.standard_normal(Z_star.shape))
    adversarial = {"zeros": np.zeros_like(Z_star), "huge": 1e6 * rng.standard_normal(Z_star.shape),
                   "wrong support": wrong_support, "sign flipped": -Z_star}
    for name, Z in adversarial.items():
        cert = ct.certify(problem, Z, refine_time=2.0)
        assert cert.dual_objective <= p_star + 1e-12 * max(1.0, abs(p_star)), name
        assert cert.primal_objective >= p_star - 1e-12 * max(1.0, abs(p_star)), name
        assert cert.duality_gap >= -1e-12 * max(1.0, abs(p_star)), name
        # (P - D) / D: finite where D > 0; +inf where no dual point with D > 0 was found (a huge Z, 2 s)
        assert (cert.relative_gap == pytest.approx(cert.duality_gap / cert.dual_objective, rel=1e-12)
                if cert.dual_objective > 0 else cert.relative_gap == np.inf and not cert.certified), name


@pytest.mark.slow
def test_refinement_is_bounded_in_time_and_reported():
    problem = random_problem(12, "cross_entropy", "classes", seed=3, N=3000, n=6, d=5, gates=16, frac=0.02)
    rough = ct.solve(problem, "fista", tol=1e-3, refine=False).Z
    cert = ct.certify(problem, rough, refine_time=0.02)
    assert cert.refine_seconds < 1.0 and "time_limit" in cert.refine_status
    assert ct.certify(problem, rough, refine=False).refine_status == "off"


@pytest.mark.parametrize("kwargs, match", [
    (dict(refine="yes"), "refine: expected True, False or 'auto'"),
    (dict(refine_time=0), "refine_time: expected a finite number > 0"),
    (dict(tol=0.0), r"tol: expected a relative gap in \(0, 1\)"),
    (dict(tol=5.0), "tol: expected"),
])
def test_bad_refinement_options(kwargs, match):
    problem = random_problem(8, "squared", "scalar")
    with pytest.raises(ct.InvalidInputError, match=match):
        ct.certify(problem, problem.zeros(), **kwargs)
