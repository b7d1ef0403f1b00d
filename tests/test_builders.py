"""The CVXPY builders agree with the numpy objects they are built from, point by point."""
import cvxpy as cp
import numpy as np
import pytest

from cvxtransformer.cvx import build_dual, build_primal
from cvxtransformer.regularizers import GroupLasso

from conftest import CASES, case_id, random_problem


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_primal_builder_objective_equals_numpy_objective(case):
    problem = random_problem(*case, seed=3)
    built = build_primal(problem)
    assert not built.problem.status  # builders only build
    program = problem.program
    Z4 = np.random.default_rng(0).standard_normal(program.canonical_shape)
    Yhat, W = sorted(built.problem.variables(), key=lambda v: v.name())  # "Yhat" < "Z"
    Yhat.value, W.value = program.forward(Z4), Z4.transpose(0, 2, 3, 1).reshape(-1, program.c)
    assert built.problem.objective.value == pytest.approx(problem.primal_objective(Z4), rel=1e-12)
    np.testing.assert_allclose(built.extract_Z(), Z4)
    assert built.problem.constraints[0].residual.max() <= 1e-12


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dual_builder_objective_and_constraints_equal_numpy(case):
    problem = random_problem(*case, seed=3)
    built = build_dual(problem)
    (V,) = built.problem.variables()
    V.value = problem.residual_dual(np.zeros(problem.program.canonical_shape))
    assert built.problem.objective.value == pytest.approx(problem.dual_objective(V.value), rel=1e-12)
    norm_constraint = built.problem.constraints[0]
    lhs = norm_constraint.args[0].value  # the vector of group norms
    G = problem.program.adjoint(V.value)
    np.testing.assert_allclose(np.sort(lhs), np.sort(np.linalg.norm(G, axis=-1).ravel()), rtol=1e-12)
    assert np.max(lhs) == pytest.approx(problem.beta_max(), rel=1e-12)


def test_group_lasso_prox_and_cvxpy_value():
    rng = np.random.default_rng(0)
    Z = rng.standard_normal((2, 3, 4))
    reg = GroupLasso(0.7)
    W = cp.Variable((4, 6))
    target = Z.reshape(6, 4).T
    step = 1.3
    cp.Problem(cp.Minimize(step * reg.cvxpy_value(W) + 0.5 * cp.sum_squares(W - target))).solve(solver="CLARABEL")
    np.testing.assert_allclose(reg.prox(Z, step).reshape(6, 4).T, W.value, atol=1e-7)
    assert reg.cvxpy_value(cp.Constant(target)).value == pytest.approx(reg.value(Z), rel=1e-13)
    assert np.count_nonzero(np.linalg.norm(reg.prox(Z, 10.0), axis=-1)) == 0  # exact zeros
