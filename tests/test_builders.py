"""The CVXPY builders and faces agree with the numpy/torch objects they are built from, point by point."""
import cvxpy as cp
import numpy as np
import pytest

from cvxtransformer.core.cvxpy_builders import build_dual, build_primal
from cvxtransformer.core.regularizers import GroupLasso, NuclearNorm

from conftest import CASES, GROUP_LASSO_CASES, case_id, random_problem


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_primal_builder_objective_equals_numpy_objective(case):
    problem = random_problem(*case, seed=3)
    built = build_primal(problem)
    assert not built.problem.status  # builders only build
    program = problem.program
    Z = np.random.default_rng(0).standard_normal(program.shape)
    Yhat, W = sorted(built.problem.variables(), key=lambda v: v.name())  # "Yhat" < "Z"
    Yhat.value, W.value = program.forward(Z), program.to_cvxpy(Z)
    assert built.problem.objective.value == pytest.approx(problem.primal_objective(Z), rel=1e-12)
    np.testing.assert_allclose(built.extract_Z(), Z)
    assert built.problem.constraints[0].residual.max() <= 1e-12 * max(1.0, np.abs(Yhat.value).max())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dual_builder_objective_and_adjoint_equal_numpy(case):
    problem = random_problem(*case, seed=3)
    built = build_dual(problem)
    (V,) = built.problem.variables()
    V.value = problem.residual_dual(problem.zeros())
    assert built.problem.objective.value == pytest.approx(problem.dual_objective(V.value), rel=1e-12)
    program = problem.program
    blocks = program.cvxpy_blocks(program.cvxpy_adjoint(V)).value
    G = program.adjoint(V.value)
    np.testing.assert_allclose(program.from_blocks(blocks), G, rtol=1e-12, atol=1e-12 * np.abs(G).max())
    # the dual norm at V = -grad L(0) is beta_max, both ways
    if case in GROUP_LASSO_CASES:
        cvx_norm = cp.max(cp.norm(blocks, 2, axis=0)).value
    else:  # the largest spectral norm over the matrices (one, or one per gate)
        cvx_norm = max(cp.sigma_max(B).value for B in NuclearNorm._matrices(blocks))
    assert cvx_norm == pytest.approx(problem.beta_max(), rel=1e-12)


@pytest.mark.parametrize("reg, shape", [(GroupLasso(0.7), (2, 3, 4)), (NuclearNorm(0.7), (5, 4))])
def test_prox_and_cvxpy_value(reg, shape):
    rng = np.random.default_rng(0)
    Z = rng.standard_normal(shape)
    step = 1.3
    if isinstance(reg, GroupLasso):
        as_blocks = lambda A: A.reshape(-1, shape[-1]).T  # groups as columns
        W = cp.Variable((shape[-1], int(np.prod(shape[:-1]))))
    else:
        as_blocks = lambda A: A
        W = cp.Variable(shape)
    target = as_blocks(Z)
    cp.Problem(cp.Minimize(step * reg.cvxpy_value(W) + 0.5 * cp.sum_squares(W - target))).solve(solver="CLARABEL")
    np.testing.assert_allclose(as_blocks(reg.prox(Z, step)), W.value, atol=1e-6)
    assert reg.cvxpy_value(cp.Constant(target)).value == pytest.approx(reg.value(Z), rel=1e-12)
    assert np.count_nonzero(reg.prox(Z, 10.0)) == 0  # exact zeros
