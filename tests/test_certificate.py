"""The verifier: a closed-form optimum digit by digit, and certificates that cannot lie."""
import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer import solvers
from cvxtransformer.core.certificate import screen_solution
from cvxtransformer.core.result import BackendOutput

from conftest import CASES, case_id, random_problem


def single_group_instance(beta_frac=0.4, N=6, d=3, seed=0):
    """Program (8) with one token whose embedding columns are orthonormal: X[:, 0, :] = Q.

    Then P(z) = 1/2 ||Q z - y||^2 + beta ||z|| is minimised by the group soft-threshold
    z* = (1 - beta / ||Q^T y||)_+ Q^T y, and beta_max = ||Q^T y||.
    """
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((N, d)))
    y = rng.standard_normal(N)
    b = Q.T @ y
    beta = beta_frac * np.linalg.norm(b)
    z = (1 - beta / np.linalg.norm(b)) * b
    p_star = 0.5 * np.sum((Q @ z - y) ** 2) + beta * np.linalg.norm(z)
    return ct.make_problem(Q[:, None, :], y, program=8, beta=beta), z, p_star, np.linalg.norm(b)


def test_closed_form_single_group():
    problem, z, p_star, beta_max = single_group_instance()
    assert problem.beta_max() == pytest.approx(beta_max, rel=1e-15)
    for solver, rtol in (("clarabel", 1e-8), ("scs", 1e-5)):
        result = ct.solve(problem, solver, tol=1e-9 if solver == "clarabel" else 1e-6)
        np.testing.assert_allclose(result.Z[0], z, rtol=rtol)
        assert result.certificate.primal_objective == pytest.approx(p_star, rel=rtol)
    # the verifier at the closed-form optimum: gap zero to rounding, KKT exact
    cert = ct.certify(problem, z[None, :], refine=False)
    assert cert.primal_objective == pytest.approx(p_star, rel=1e-15)
    assert abs(cert.duality_gap) <= 1e-14 * p_star
    assert cert.kkt_stationarity <= 1e-14 and cert.kkt_dual_feasibility == 0.0
    assert cert.heads_recovered == 1
    # the dual optimum is the residual y - Q z*
    np.testing.assert_allclose(cert.V[:, 0], problem.T[:, 0] - problem.program.X[:, 0, :] @ z, rtol=1e-14)


def test_closed_form_above_beta_max():
    problem, _, _, beta_max = single_group_instance(beta_frac=1.0)
    cert = ct.certify(problem, np.zeros((1, 3)), refine=False)
    assert cert.primal_objective == 0.5 * np.sum(problem.T ** 2)
    assert abs(cert.duality_gap) <= 1e-15 * cert.primal_objective


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_perturbed_solution_shows_a_larger_gap(case):
    problem = random_problem(*case, seed=5)
    best = ct.solve(problem, "clarabel", tol=1e-9)
    Z = best.Z
    rng = np.random.default_rng(0)
    for scale in (1e-4, 1e-2, 1.0):
        Zp = Z + scale * rng.standard_normal(Z.shape)
        cert = ct.certify(problem, Zp)
        assert cert.duality_gap > best.certificate.duality_gap
        # the gap bounds the suboptimality: P(Zp) - p* <= gap(Zp), and no bound exceeds the optimum
        p_star = best.certificate.primal_objective
        assert cert.dual_objective <= p_star + 1e-12 * abs(p_star)
        assert cert.primal_objective - p_star <= cert.duality_gap + 1e-12 * abs(p_star)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_infeasible_dual_point_is_never_used(case):
    problem = random_problem(*case, seed=6)
    p_star = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    rng = np.random.default_rng(1)
    T = problem.T
    # candidates outside the dual feasible set: norm constraints violated, domain violated
    candidates = [T.copy(), 50 * rng.standard_normal(T.shape), T + 3 * rng.standard_normal(T.shape)]
    for V in candidates:
        cert = ct.certify(problem, np.zeros(problem.program.shape), V=V, refine=False)
        # weak duality: a feasible point can never exceed the optimum
        assert cert.dual_objective <= p_star + 1e-9 * abs(p_star)
        used = cert.V
        assert problem.regularizer.dual_norm(problem.program.adjoint(used)) <= problem.beta * (1 + 1e-12)
        np.testing.assert_allclose(problem.loss.project_dual_domain(used, T), used, atol=1e-12)
    if problem.loss.name == "squared":
        # V = y maximises the unconstrained dual: used naively it would "certify" Z = 0
        assert problem.dual_objective(T) > p_star


@pytest.mark.slow
def test_random_points_never_beat_weak_duality():
    for case in CASES:
        problem = random_problem(*case, seed=7)
        p_star = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
        rng = np.random.default_rng(2)
        for _ in range(10):
            cert = ct.certify(problem, rng.standard_normal(problem.program.shape),
                              V=rng.standard_normal(problem.T.shape), refine=False)
            assert cert.dual_objective <= p_star + 1e-9 * abs(p_star) <= cert.primal_objective + 2e-9 * abs(p_star)


def test_solver_status_is_never_trusted(monkeypatch):
    problem = random_problem(10, "squared", "vector", seed=8)

    class Liar(solvers.Solver):
        name = "liar"

        def solve(self, problem, form="primal", tol=1e-6, verbose=False):
            Z = np.random.default_rng(0).standard_normal(problem.program.shape)
            return BackendOutput(Z=Z, V=problem.T.copy(), status="optimal", build_seconds=0.0, solve_seconds=0.0)

    monkeypatch.setitem(solvers.SOLVERS, "liar", Liar)
    result = ct.solve(problem, "liar", tol=1e-6, refine=False)
    assert result.status == "optimal"
    assert not result.certified and result.certificate.relative_gap > 1e-3


def test_certify_rejects_wrong_shape():
    problem = random_problem(12, "squared", "vector")
    with pytest.raises(ct.InvalidInputError, match=r"Z: expected shape \(3, 3, 4, 3\)"):
        ct.certify(problem, np.zeros((3, 4, 3)))


def test_screening_keeps_active_groups_at_an_exact_optimum():
    # At the closed-form optimum the gap is zero to rounding and ||G_g|| = beta on the support:
    # rounding must not let the gap-safe test discard the active group.
    for seed in range(100):  # without the margin, about a third of these lose their group
        problem, z, _, _ = single_group_instance(beta_frac=0.3 + 0.001 * seed, seed=seed)
        kept, mask = screen_solution(problem, z[None, :])
        np.testing.assert_array_equal(kept[0], z)
        assert not mask.any()


def test_group_lasso_kkt_residuals_by_hand():
    """Stationarity ``max ||G_g - beta z_g / ||z_g|| || / beta`` on the support and feasibility
    ``max(0, ||G_g|| - beta) / beta`` off it, on numbers worked by hand: beta = 2, the group (3, 4) (direction
    (0.6, 0.8), so beta times it is (1.2, 1.6)) with G_g = (1.5, 1.6): 0.3 / 2; off the support ||(3, 0)|| = 3:
    (3 - 2) / 2; a zero Z is all feasibility, a full one all stationarity."""
    from cvxtransformer.core.regularizers import GroupLasso
    reg = GroupLasso(2.0)
    Z = np.array([[3.0, 4.0], [0.0, 0.0], [0.0, 0.0]])
    G = np.array([[1.5, 1.6], [3.0, 0.0], [1.0, 1.0]])
    assert reg.kkt_residuals(Z, G) == pytest.approx((0.15, 0.5), abs=1e-15)
    assert reg.kkt_residuals(np.zeros_like(Z), G) == pytest.approx((0.0, 0.5), abs=1e-15)
    assert reg.kkt_residuals(Z[:1], G[:1]) == pytest.approx((0.15, 0.0), abs=1e-15)
    assert reg.kkt_residuals(np.zeros_like(Z), 0.5 * G) == (0.0, 0.0)  # ||G_g|| <= beta everywhere
