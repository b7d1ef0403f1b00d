import warnings

import numpy as np
import pytest

import cvxtransformer as ct

# Every (program, loss, target kind) that SPEC.md allows, on small random instances.
CASES = [
    (8, "squared", "scalar"),
    (8, "logistic", "binary"),
    (10, "squared", "vector"),
    (10, "squared", "sequence"),
    (10, "cross_entropy", "classes"),
    (10, "logistic", "binary"),
    (12, "squared", "vector"),
    (12, "cross_entropy", "classes"),
    (12, "logistic", "binary"),
]


def case_id(case):
    return f"p{case[0]}-{case[1]}-{case[2]}"


def random_targets(kind, rng, N, n, c=3):
    if kind == "scalar":
        return rng.standard_normal(N)
    if kind == "binary":
        return np.where(rng.standard_normal(N) > 0, 1.0, -1.0)
    if kind == "vector":
        return rng.standard_normal((N, c))
    if kind == "sequence":
        return rng.standard_normal((N, n, 2))
    if kind == "classes":
        return rng.integers(0, c, N)
    raise ValueError(kind)


def random_problem(program, loss, kind, seed=0, N=40, n=4, d=3, heads=3, frac=0.3):
    """A random instance with beta = frac * beta_max (so the optimum is sparse but nonzero)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n, d))
    y = random_targets(kind, rng, N, n)
    problem = ct.make_problem(X, y, program=program, loss=loss, beta=1.0, heads=heads, gate_seed=seed)
    return problem.with_beta(frac * problem.beta_max())


@pytest.fixture(autouse=True)
def _quiet_cvxpy_warnings():
    # "Solution may be inaccurate" is reported by the certificate, not by a warning.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        yield
