"""Reductions as pairs: apply (network and data -> convex problem) then invert (Z -> weights), and
the network's objective at the inverted weights equals the convex objective (Proposition 1 and the
linear MHSA theorem)."""
import numpy as np
import pytest

import cvxtransformer as ct

rng = np.random.default_rng(0)
X = rng.standard_normal((30, 4, 3))


@pytest.mark.parametrize("reduction, network, y, program", [
    (ct.Proposition1, "alternative", rng.standard_normal((30, 2)), 10),
    (ct.Proposition1, "alternative_scalar", rng.standard_normal(30), 8),
    (ct.Proposition1, "gated", rng.standard_normal((30, 2)), 12),
    (ct.LinearMHSAReduction, "linear_mhsa", rng.standard_normal((30, 4, 2)), "mhsa"),
])
def test_apply_then_invert_round_trip(reduction, network, y, program):
    problem = reduction.apply(network, X, y, loss="squared", beta=1.0)
    assert problem.program.name == program and problem.reduction is reduction
    problem = problem.with_beta(0.3 * problem.beta_max())
    Z = ct.solve(problem, "clarabel", tol=1e-9).Z
    for form in reduction.forms:
        weights = reduction.invert(problem, Z, form)
        assert weights.heads == problem.regularizer.support_size(Z) >= 1
        assert reduction.objective(problem, weights) == pytest.approx(problem.primal_objective(Z), rel=1e-9)


def test_apply_and_invert_reject_what_they_do_not_cover():
    with pytest.raises(ct.InvalidInputError, match="network: expected one of"):
        ct.Proposition1.apply("softmax", X, X[:, 0, :])
    problem = ct.make_problem(X, X[:, 0, :], program=10, beta=1.0)
    with pytest.raises(ct.InvalidInputError, match="form: expected one of"):
        ct.recover_weights(problem, problem.zeros(), form="unbalanced")
    with pytest.raises(ct.InvalidInputError, match=r"Z: expected shape \(3, 4, 3\)"):
        ct.recover_weights(problem, np.zeros((4, 3)))
