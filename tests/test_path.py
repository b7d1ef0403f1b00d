"""The regularization path (issue 3): warm starts, certified gaps, safe screening."""
import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.core.errors import InvalidInputError

from conftest import random_problem

PATH_CASES = [(8, "squared", "scalar"), (10, "cross_entropy", "classes"), (12, "logistic", "binary")]


@pytest.mark.parametrize("case", PATH_CASES, ids=lambda c: f"p{c[0]}-{c[1]}")
def test_path_is_certified_and_screening_is_safe(case):
    problem = random_problem(*case, seed=20, N=60, n=6, d=3)
    path = ct.solve_path(problem, n_betas=5, ratio=0.05, tol=1e-7)
    beta_max = problem.beta_max()
    assert [p.beta for p in path] == pytest.approx(beta_max * np.geomspace(1, 0.05, 5))
    assert np.all(np.diff([p.beta for p in path]) < 0)
    assert np.all(path[0].result.Z == 0)
    total_screened = 0
    for point in path:
        assert point.certified and point.relative_gap <= 1e-7
        assert point.n_blocks == problem.program.n_blocks and point.screened == int(point.screened_mask.sum())
        total_screened += point.screened
        # an independent solve at the same beta: same objective, and screening discarded no
        # group that is nonzero at the Clarabel optimum
        reference = ct.solve(problem.with_beta(point.beta), "clarabel", tol=1e-9)
        p_ref = reference.certificate.primal_objective
        assert abs(point.result.certificate.primal_objective - p_ref) <= 1e-6 * abs(p_ref)
        ref_norms = np.linalg.norm(reference.Z, axis=-1)
        assert not np.any(point.screened_mask & (ref_norms > 1e-6))
        assert np.all(point.result.Z[point.screened_mask] == 0)
    assert total_screened > 0


def test_summary_and_explicit_grid():
    problem = random_problem(8, "squared", "scalar", seed=21, N=50, n=5, d=3)
    bm = problem.beta_max()
    path = ct.solve_path(problem, betas=[0.1 * bm, 0.5 * bm, 0.3 * bm])
    assert [p.beta for p in path] == pytest.approx([0.5 * bm, 0.3 * bm, 0.1 * bm])
    keys = {"beta", "relative_gap", "certified", "screened", "n_blocks", "support", "iterations", "seconds"}
    assert all(set(p.summary()) == keys for p in path)
    assert all(p.summary()["certified"] for p in path)


def test_warm_start_saves_iterations():
    problem = random_problem(10, "squared", "vector", seed=22, N=60, n=6, d=3)
    path = ct.solve_path(problem, n_betas=8, ratio=0.05)
    last = path[-1]
    cold = ct.solve(problem.with_beta(last.beta), "fista")
    assert last.result.iterations <= cold.iterations


@pytest.mark.parametrize("kwargs, match", [
    (dict(betas=[1.0, -1.0]), "betas"),
    (dict(betas=[]), "betas"),
    (dict(n_betas=0), "n_betas"),
    (dict(ratio=1.5), "ratio"),
    (dict(max_iter=0), "max_iter"),
])
def test_bad_path_arguments(kwargs, match):
    problem = random_problem(8, "squared", "scalar", seed=23)
    with pytest.raises(InvalidInputError, match=match):
        ct.solve_path(problem, **kwargs)
