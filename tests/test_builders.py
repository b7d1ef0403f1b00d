"""The CVXPY builders and faces agree with the numpy/torch objects they are built from, point by point."""
import cvxpy as cp
import numpy as np
import pytest

from cvxtransformer.core.cvxpy_builders import LeastSquares, build_dual, build_primal, offered_formulations
from cvxtransformer.core.regularizers import GroupLasso, NuclearNorm

from conftest import CASES, case_id, random_problem


FORMULATION_CASES = [(case, f) for case in CASES for f in offered_formulations(random_problem(*case))]


def _variables(built):
    return {v.name(): v for v in built.problem.variables()}


def _set_auxiliaries(built):
    """Every auxiliary variable from the equality that defines it, last constraint first."""
    for constraint in reversed(built.problem.constraints):
        if isinstance(constraint, cp.constraints.Equality) and isinstance(constraint.args[0], cp.Variable):
            constraint.args[0].value = constraint.args[1].value


@pytest.mark.parametrize("case, formulation", FORMULATION_CASES, ids=lambda x: x if isinstance(x, str) else case_id(x))
def test_primal_builder_objective_equals_numpy_objective(case, formulation):
    problem = random_problem(*case, seed=3)
    built = build_primal(problem, formulation)
    assert not built.problem.status and built.formulation == formulation  # builders only build
    program = problem.program
    Z = np.random.default_rng(0).standard_normal(program.shape)
    _variables(built)["Z"].value = program.to_cvxpy(Z)
    _set_auxiliaries(built)
    assert built.problem.objective.value == pytest.approx(problem.primal_objective(Z), rel=1e-12)
    np.testing.assert_allclose(built.extract_Z(), Z)
    if formulation != "compressed":  # the predictions are the numpy map's
        np.testing.assert_allclose(_variables(built)["Yhat"].value, program.forward(Z), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case, formulation", FORMULATION_CASES, ids=lambda x: x if isinstance(x, str) else case_id(x))
def test_dual_builder_objective_and_norm_constraint_equal_numpy(case, formulation):
    problem = random_problem(*case, seed=3)
    built = build_dual(problem, formulation)
    assert built.formulation == formulation
    V0 = problem.residual_dual(problem.zeros())  # A^T V0 has dual norm beta_max
    if formulation == "compressed":  # U = S - R C at C = 0 stands for the residual at Z = 0
        variable, value = _variables(built)["U"], LeastSquares(problem).S
    else:
        variable, value = _variables(built)["V"], V0
    variable.value = value
    _set_auxiliaries(built)
    assert built.problem.objective.value == pytest.approx(problem.dual_objective(V0), rel=1e-12)
    np.testing.assert_allclose(built.extract_V(), V0, rtol=1e-10, atol=1e-10 * np.abs(V0).max())
    # the norm constraints hold with equality at V0 scaled by beta / beta_max, and fail just above
    scale = problem.beta / problem.beta_max()
    for factor, feasible in ((1.0, True), (1.001, False)):
        variable.value = factor * scale * value
        _set_auxiliaries(built)
        worst = max(float(np.max(c.violation())) for c in built.problem.constraints)
        assert (worst <= 1e-9 * problem.beta) == feasible, (factor, worst)


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
