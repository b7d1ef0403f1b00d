"""Every solver on every program x loss: one grid of case x solver x form x dtype x device, checked
by name (gap, dual feasibility, KKT, recovery) with the helpers of cvxtransformer.testing."""
import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.core.certificate import screen_solution
from cvxtransformer.core.cvxpy_builders import build_primal
from cvxtransformer.testing import (check_dual_feasibility, check_gap, check_kkt, check_recovery,
                                    check_strong_duality, residual_gap)

from conftest import CASES, GROUP_LASSO_CASES, case_id, cuda, random_problem

# (solver, form, dtype, device): the certified tolerance and the KKT levels each reaches. An interior
# point's KKT residuals are of the order of sqrt(gap) (gaps of 1e-11 to 1e-10 here: up to 1.6e-5 of
# dual feasibility on the nuclear norm, whose support is a numerical rank), hence Clarabel's 1e-4.
GRID = {
    ("clarabel", "primal", "float64", "cpu"): dict(tol=1e-7, stationarity=1e-3, feasibility=1e-4),
    ("clarabel", "dual", "float64", "cpu"): dict(tol=1e-7, stationarity=1e-3, feasibility=1e-4),
    # SCS: its primal iterate keeps noise groups (no stationarity level); its dual feasibility is of the
    # order of sqrt(gap) too: 1.04e-5 on "mixer" squared (compressed, relative gap 5e-9), hence 1e-4
    ("scs", "primal", "float64", "cpu"): dict(tol=1e-4, stationarity=None, feasibility=1e-4),
    ("scs", "dual", "float64", "cpu"): dict(tol=1e-4, stationarity=1e-1, feasibility=1e-4),
    ("fista", "primal", "float64", "cpu"): dict(tol=1e-8, stationarity=1e-2, feasibility=1e-2),
    ("fista", "primal", "float32", "cpu"): dict(tol=1e-4, stationarity=None, feasibility=1e-2),
    ("fista", "primal", "float64", "cuda"): dict(tol=1e-8, stationarity=1e-2, feasibility=1e-2),
    ("fista", "primal", "float32", "cuda"): dict(tol=1e-4, stationarity=None, feasibility=1e-2),
}
CONFIGS = [pytest.param(key, id="-".join(key), marks=[cuda, pytest.mark.cuda] if key[3] == "cuda" else [])
           for key in GRID]
_SOLVED = {}


def solved(case, key):
    """The solve of ``case`` by ``key``, computed once per session."""
    if (case, key) not in _SOLVED:
        problem = random_problem(*case, seed=1)
        solver, form, dtype, device = key
        options = dict(dtype=dtype, device=device) if solver == "fista" else {}
        _SOLVED[case, key] = problem, ct.solve(problem, solver, form=form, tol=GRID[key]["tol"], **options)
    return _SOLVED[case, key]


@pytest.mark.parametrize("key", CONFIGS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_gap_kkt_and_recovery(case, key):
    problem, result = solved(case, key)
    check_gap(problem, result, GRID[key]["tol"])
    check_kkt(result, GRID[key]["stationarity"] or np.inf, GRID[key]["feasibility"])
    check_recovery(problem, result)


@pytest.mark.parametrize("solver", ["clarabel", "scs"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dual_program_optimum_equals_primal_optimum(case, solver):
    tol = GRID[solver, "primal", "float64", "cpu"]["tol"]
    problem, primal = solved(case, (solver, "primal", "float64", "cpu"))
    _, dual = solved(case, (solver, "dual", "float64", "cpu"))
    check_strong_duality(problem, primal, dual, tol)
    # the primal read back from the dual's multipliers certifies against the dual's V
    assert ct.certify(problem, dual.Z, V=dual.V, tol=tol, refine=False).certified


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_solvers_agree(case):
    values = [solved(case, key)[1].certificate for key in GRID if key[3] == "cpu"]
    p = values[0].primal_objective
    for cert in values:
        assert abs(cert.primal_objective - p) <= 1e-4 * max(1.0, abs(p))
        # every bound lies below every objective: D <= p* <= P
        assert max(c.dual_objective for c in values) <= min(c.primal_objective for c in values) + 1e-12 * abs(p)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_zero_at_and_above_beta_max_nonzero_below(case):
    problem = random_problem(*case, seed=2)
    beta_max = problem.beta_max()
    for factor in (1.0, 1.5):
        result = ct.solve(problem.with_beta(factor * beta_max), "clarabel", tol=1e-9)
        assert np.all(result.Z == 0.0)
        cert = result.certificate
        assert result.certified and abs(cert.duality_gap) <= 1e-12 * max(1, cert.primal_objective)
        assert cert.heads_recovered == 0 and cert.support_size == 0
    for solver in ("clarabel", "fista"):
        below = ct.solve(problem.with_beta(0.99 * beta_max), solver, tol=1e-7)
        assert below.certified and np.count_nonzero(below.Z) > 0 and below.certificate.support_size >= 1


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_interior_point_iterate_is_cleaned_to_exact_zero_above_beta_max(case):
    # Not the beta >= beta_max shortcut: the backend runs, and the gap-safe rule zeroes its output.
    problem = random_problem(*case, seed=2)
    problem = problem.with_beta(1.05 * problem.beta_max())
    built = build_primal(problem)
    built.problem.solve(solver="CLARABEL")
    Z = built.extract_Z()
    assert np.count_nonzero(Z) > 0  # the interior-point iterate is not exactly zero
    cleaned, mask = screen_solution(problem, Z, built.extract_V())
    assert np.all(cleaned == 0.0) and mask.all()
    assert residual_gap(problem, cleaned) <= 1e-12


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_screening_never_removes_a_block_of_the_optimum(case):
    problem = random_problem(*case, seed=4, frac=0.1)
    ref = ct.solve(problem, "clarabel", tol=1e-9, screen=False)
    reg = problem.regularizer
    noisy = ref.Z + 1e-4 * np.random.default_rng(0).standard_normal(ref.Z.shape)
    screened, mask = screen_solution(problem, noisy)
    if case in GROUP_LASSO_CASES:
        support = np.linalg.norm(ref.Z, axis=-1) > 1e-6
        assert np.all(np.linalg.norm(screened, axis=-1)[support] > 0) and not np.any(mask & support)
    else:  # the proved rank bound is never below the optimum's rank
        Z = np.swapaxes(ref.Z, -3, -2) if case[0] in ("10wd", "12wd") else ref.Z  # its matrices: one per token there
        rank = int(np.sum(np.linalg.svd(Z, compute_uv=False) > 1e-6 * np.abs(ref.Z).max()))
        assert int((~mask).sum()) >= rank and reg.rank(screened) >= rank


def test_dual_point_of_the_solver_is_feasible_in_every_case():
    for case in CASES:
        problem, result = solved(case, ("clarabel", "primal", "float64", "cpu"))
        check_dual_feasibility(problem, result.V)
