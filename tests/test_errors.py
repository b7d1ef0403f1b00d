"""Bad input gets a clear error naming the argument (Python API)."""
import cvxpy as cp
import numpy as np
import pytest

import cvxtransformer as ct

rng = np.random.default_rng(0)
X = rng.standard_normal((10, 3, 2))
y = rng.standard_normal(10)


@pytest.mark.parametrize("kwargs, match", [
    (dict(X=np.full((10, 3, 2), np.nan)), r"X: expected finite values, got 60 NaN/Inf"),
    (dict(y=np.r_[np.inf, y[1:]]), r"y: expected finite values"),
    (dict(X=X[:, :, 0]), r"X: expected shape \(N, n, d\), got shape \(10, 3\)"),
    (dict(X=np.zeros((0, 3, 2)), y=np.zeros(0)), r"X: expected non-empty"),
    (dict(X="abc"), r"X: expected a numeric array"),
    (dict(y=y[:5]), r"y: expected 10 targets"),
    (dict(y=rng.standard_normal((10, 2)), program=8), r"y: expected shape \(N,\) for program \(8\)"),
    (dict(y=rng.standard_normal((10, 4, 2)), program=10), r"y: expected sequence targets of shape \(N, n=3, c\)"),
    (dict(loss="logistic", y=(y > 0).astype(float)), r"y: expected labels in \{-1, \+1\}.*map labels 0/1"),
    (dict(loss="cross_entropy", program=10, y=np.arange(10) - 1), r"y: expected class labels in \[0, 9\)"),
    (dict(loss="cross_entropy", program=10, y=y), r"y: expected integer class labels"),
    (dict(loss="cross_entropy", program=10, y=np.zeros(10, int)), r"y: expected at least 2 classes"),
    (dict(loss="cross_entropy", program=8, y=np.zeros(10, int)), r"loss: expected one of .* for program \(8\)"),
    (dict(loss="hinge"), r"loss: expected one of \['cross_entropy', 'logistic', 'squared'\], got 'hinge'"),
    (dict(program=9), r"program: expected one of 8, 10, 12, .10wd., .12wd., .mhsa., .gated_mhsa., .mixer., got 9"),
    (dict(beta=0.0), r"beta: expected a finite number > 0, got 0.0"),
    (dict(beta=-1.0), r"beta: expected a finite number > 0"),
    (dict(beta=float("nan")), r"beta: expected a finite number > 0, got nan"),
    (dict(beta="1"), r"beta: expected a finite number > 0, got '1'"),
    (dict(program=12, gates=0), r"gates: expected an integer >= 1"),
    (dict(program=12, U1=np.zeros((2, 3))), r"U1, U2: expected both gate matrices or neither"),
    (dict(program=12, U1=np.zeros((2, 4)), U2=np.zeros((2, 2))), r"U1, U2: expected shapes \(h, 3\) and \(h, 2\)"),
    (dict(program=10, U1=np.zeros((2, 3)), U2=np.zeros((2, 2))), r"U1, U2: expected no gate vectors"),
])
def test_make_problem_rejects(kwargs, match):
    args = dict(X=X, y=y, program=8, loss="squared", beta=1.0)
    args.update(kwargs)
    with pytest.raises(ct.InvalidInputError, match=match):
        ct.make_problem(**args)


def test_unknown_solver_and_form():
    problem = ct.make_problem(X, y, program=8, beta=0.1)
    with pytest.raises(ct.InvalidInputError, match=r"solver: expected 'auto' or one of .*'clarabel'.*got 'gurobi'"):
        ct.solve(problem, "gurobi")
    with pytest.raises(ct.InvalidInputError, match=r"form: expected one of \('primal', 'dual'\)"):
        ct.solve(problem, "clarabel", form="bidual")


def test_missing_solver_package(monkeypatch):
    monkeypatch.setattr(cp, "installed_solvers", lambda: ["SCS"])
    problem = ct.make_problem(X, y, program=8, beta=0.1)
    with pytest.raises(ct.MissingDependencyError, match=r"solver: clarabel is not installed; pip install clarabel"):
        ct.solve(problem, "clarabel")


def test_failing_solver(monkeypatch):
    def fail(self, *args, **kwargs):
        raise cp.error.SolverError("numerical trouble")

    from cvxpy.reductions.solvers.solving_chain import SolvingChain

    monkeypatch.setattr(SolvingChain, "solve_via_data", fail)  # the solver's call, after CVXPY's compilation
    problem = ct.make_problem(X, y, program=8, beta=0.1)
    with pytest.raises(ct.SolverError, match=r"solver: scs failed on the primal of program \(8\) \(numerical trouble\); try"):
        ct.solve(problem, "scs")


def test_solver_returning_infeasible_status(monkeypatch):
    def infeasible(self, *args, **kwargs):
        self._status = cp.INFEASIBLE

    monkeypatch.setattr(cp.Problem, "unpack_results", infeasible)  # what the solver's answer sets
    problem = ct.make_problem(X, y, program=8, beta=0.1)
    with pytest.raises(ct.SolverError, match=r"returned status 'infeasible'"):
        ct.solve(problem, "clarabel")
