"""Clarabel and SCS on every program x loss: certified gaps, strong duality, KKT, recovery."""
import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.certificate import certify_canonical
from cvxtransformer.cvx import build_primal
from cvxtransformer.solve import screen_zero_groups

from conftest import CASES, case_id, random_problem

TOL = {"clarabel": 1e-7, "scs": 1e-4}


@pytest.fixture(scope="module")
def solved():
    """Primal and dual solves of every case by both solvers, computed once."""
    out = {}
    for case in CASES:
        problem = random_problem(*case, seed=1)
        for solver, tol in TOL.items():
            for form in ("primal", "dual"):
                out[case, solver, form] = (problem, ct.solve(problem, solver, form=form, tol=tol))
    return out


@pytest.mark.parametrize("solver", TOL)
@pytest.mark.parametrize("form", ["primal", "dual"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_certified_gap_kkt_and_recovery(solved, case, solver, form):
    problem, result = solved[case, solver, form]
    cert = result.certificate
    # the verifier recomputes everything: check the reported numbers against their definitions
    Z4 = problem.program.to_canonical(result.Z)
    assert cert.primal_objective == problem.primal_objective(Z4)
    assert cert.duality_gap == cert.primal_objective - cert.dual_objective
    assert cert.relative_gap <= TOL[solver] and cert.certified
    assert cert.relative_gap >= -1e-14  # weak duality, up to rounding
    assert problem.regularizer.dual_norm(problem.program.adjoint(
        result.V.reshape(problem.T.shape))) <= problem.beta * (1 + 1e-12)
    assert cert.kkt_dual_feasibility <= 1e-6
    if not (solver == "scs" and form == "primal"):  # SCS's primal iterate keeps noise groups
        assert cert.kkt_stationarity <= 1e-3
    # Proposition 1: the nonconvex network at the recovered weights has objective P(Z)
    assert cert.heads_recovered == np.count_nonzero(np.linalg.norm(Z4, axis=-1))
    assert cert.recovered_objective == pytest.approx(cert.primal_objective, rel=1e-9)
    assert cert.recovered_objective_lemma1 == pytest.approx(cert.primal_objective, rel=1e-9)


@pytest.mark.parametrize("solver", TOL)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dual_program_optimum_equals_primal_optimum(solved, case, solver):
    problem, primal = solved[case, solver, "primal"]
    _, dual = solved[case, solver, "dual"]
    p_star = primal.certificate.primal_objective
    # the dual program's own optimum D(V_dual), evaluated at the solver's V made feasible
    V = ct.dual_feasible_point(problem, dual.V.reshape(problem.T.shape))
    assert problem.dual_objective(V) == pytest.approx(p_star, rel=TOL[solver], abs=TOL[solver])
    # the primal read back from the dual's multipliers certifies against the dual's V ...
    assert ct.certify(problem, dual.Z, V=dual.V, tol=TOL[solver]).certified
    # ... and, more loosely (multipliers are less accurate than V), against its own residual
    assert ct.certify(problem, dual.Z).relative_gap <= 100 * TOL[solver]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_clarabel_and_scs_agree(solved, case):
    _, a = solved[case, "clarabel", "primal"]
    _, b = solved[case, "scs", "primal"]
    pa, pb = a.certificate.primal_objective, b.certificate.primal_objective
    assert abs(pa - pb) <= 1e-4 * max(1.0, abs(pa))
    # both bounds bracket both objectives: D <= p* <= P for each
    assert a.certificate.dual_objective <= pb + 1e-12 * abs(pb)
    assert b.certificate.dual_objective <= pa + 1e-12 * abs(pa)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_zero_at_and_above_beta_max_nonzero_below(case):
    problem = random_problem(*case, seed=2)
    beta_max = problem.beta_max()
    for factor in (1.0, 1.5):
        result = ct.solve(problem.with_beta(factor * beta_max), "clarabel", tol=1e-9)
        assert np.all(result.Z == 0.0)
        assert result.certified and abs(result.certificate.duality_gap) <= 1e-12 * max(1, result.certificate.primal_objective)
        assert result.certificate.heads_recovered == 0
    below = ct.solve(problem.with_beta(0.99 * beta_max), "clarabel", tol=1e-7)
    assert below.certified and np.count_nonzero(below.Z) > 0


@pytest.mark.parametrize("case", CASES[:5], ids=case_id)
def test_solver_itself_gives_exact_zeros_above_beta_max_after_screening(case):
    # Not the beta >= beta_max shortcut: the backend runs, and the gap-safe rule zeroes its output.
    problem = random_problem(*case, seed=2)
    problem = problem.with_beta(1.05 * problem.beta_max())
    built = build_primal(problem)
    built.problem.solve(solver="CLARABEL")
    Z4 = built.extract_Z()
    assert np.count_nonzero(Z4) > 0  # the interior-point iterate is not exactly zero
    cleaned = screen_zero_groups(problem, Z4, built.extract_V())
    assert np.all(cleaned == 0.0)
    assert certify_canonical(problem, cleaned).relative_gap <= 1e-12


def test_screening_never_zeroes_a_group_of_the_optimum():
    for case in CASES:
        problem = random_problem(*case, seed=4, frac=0.1)
        ref = ct.solve(problem, "clarabel", tol=1e-9, screen=False)
        support = np.linalg.norm(problem.program.to_canonical(ref.Z), axis=-1) > 1e-6
        noisy = problem.program.to_canonical(ref.Z) + 1e-4 * np.random.default_rng(0).standard_normal(
            problem.program.canonical_shape)
        screened = screen_zero_groups(problem, noisy)
        assert np.all(np.linalg.norm(screened, axis=-1)[support] > 0)
