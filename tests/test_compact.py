"""Compact CVXPY formulations (issue 22): the squared loss compressed to the size of Z, the factored map of
"mhsa", and the dense design give the same optimum, certified on the whole problem; the compression
streams memory-mapped data and survives a singular design; the formulation is chosen, recorded and forced."""
import json
import sys

import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.core.cvxpy_builders import BYTES_FIXED, LeastSquares, estimate_cvxpy_bytes, offered_formulations
from cvxtransformer.core.data import open_data
from cvxtransformer.core.errors import InvalidInputError
from cvxtransformer.solvers import Clarabel
from cvxtransformer.testing import check_gap

from conftest import CASES, MHSA_CASES, case_id, random_problem
from test_out_of_core import _save, solve_under_memory_limit, write_big_folder

SQUARED_CASES = [c for c in CASES if c[1] == "squared"]


def _solve(problem, formulation, form="primal"):
    return ct.solve(problem, "clarabel", form=form, tol=1e-9, formulation=formulation)


def _same_optimum(problem, a, b, rtol=1e-8):
    for result in (a, b):
        check_gap(problem, result, 1e-9)  # certified on the whole problem, from the returned Z and V
    pa, pb = a.certificate.primal_objective, b.certificate.primal_objective
    assert abs(pa - pb) <= rtol * max(1.0, abs(pb)), (pa, pb)


@pytest.mark.parametrize("form", ["primal", "dual"])
@pytest.mark.parametrize("case", SQUARED_CASES, ids=case_id)
def test_the_compressed_program_has_the_direct_optimum(case, form):
    problem = random_problem(*case, seed=11)
    compressed, direct = _solve(problem, "auto", form), _solve(problem, "direct", form)
    assert (compressed.formulation, direct.formulation) == ("compressed", "direct")
    _same_optimum(problem, compressed, direct)


@pytest.mark.parametrize("case", MHSA_CASES, ids=case_id)
def test_the_factored_mhsa_program_has_the_direct_optimum(case):
    problem = random_problem(*case, seed=12)
    for form in ("primal", "dual"):
        factored, direct = _solve(problem, "factored", form), _solve(problem, "direct", form)
        assert factored.formulation == "factored"
        _same_optimum(problem, factored, direct)


def _design(problem):
    """The whole design (N*r, p) and the targets (N*r, q), in numpy, independently of the compression."""
    program = problem.program
    A = program.design()
    return A, problem.T.reshape(A.shape[0], -1)


@pytest.mark.parametrize("program", [10, 12, "mhsa"])
def test_a_singular_design_is_compressed_to_its_range_and_certified(program):
    """Duplicated tokens and fewer samples than coefficients: A^T A is singular; R keeps its range and the
    compressed data term equals 1/2 ||A C - Y||^2 for every C (the null space included)."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((6, 4, 3))
    X[:, 2] = X[:, 0]  # a duplicated token
    y = rng.standard_normal((6, 4, 2)) if program == "mhsa" else rng.standard_normal((6, 2))
    problem = ct.make_problem(X, y, program=program, loss="squared", beta=1.0, gates=2)
    problem = problem.with_beta(0.2 * problem.beta_max())
    A, Y = _design(problem)
    ls = LeastSquares(problem)
    assert ls.R.shape[0] == np.linalg.matrix_rank(A) < A.shape[1]
    for C in (rng.standard_normal((A.shape[1], Y.shape[1])), np.linalg.svd(A)[2][-1][:, None] * np.ones(Y.shape[1])):
        exact = 0.5 * np.sum((A @ C - Y) ** 2)
        assert 0.5 * np.sum((ls.R @ C - ls.S) ** 2) + ls.const == pytest.approx(exact, rel=1e-10, abs=1e-10)
    _same_optimum(problem, _solve(problem, "compressed"), _solve(problem, "direct"))


def test_the_compression_of_a_memory_map_reads_chunks_of_rows(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    X, y = rng.standard_normal((500, 4, 3)).astype(np.float32), rng.standard_normal((500, 2))
    Xm, ym = open_data(_save(tmp_path / "d", X=X, y=y)).rows()
    problems = [ct.make_problem(A, y, program=10, beta=1.0) for A in (X.astype(float), Xm)]
    program = type(problems[1].program)
    reads = []
    design = program.design
    monkeypatch.setattr(program, "design", lambda self, s=0, e=None: reads.append((s, e)) or design(self, s, e))
    small, mapped = LeastSquares(problems[0]), LeastSquares(problems[1], chunk_bytes=8 * 100 * 14)
    assert reads[-5:] == [(0, 100), (100, 200), (200, 300), (300, 400), (400, 500)]  # never X whole
    for a, b in ((small.R.T @ small.R, mapped.R.T @ mapped.R), (small.R.T @ small.S, mapped.R.T @ mapped.S)):
        np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-9)
    assert mapped.const == pytest.approx(small.const, rel=1e-11)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA bounds mmap'd memory on Linux only")
def test_clarabel_solves_a_memory_map_four_times_the_memory_limit(tmp_path):
    limit = 160 * 2**20  # above the estimate's fixed part (BYTES_FIXED, the interpreter's and CVXPY's own)
    solved, control = solve_under_memory_limit(write_big_folder(tmp_path / "big", limit, n=8), limit, "clarabel")
    _, nbytes, certified, gap, formulation = solved.split()
    assert int(nbytes) >= 4 * limit and certified == "True" and float(gap) <= 1e-8 and formulation == "compressed"
    assert control == "control MemoryError"


def test_the_formulation_is_chosen_recorded_and_forced(tmp_path, capsys):
    assert offered_formulations(random_problem(10, "squared", "vector")) == ("compressed", "direct")
    assert offered_formulations(random_problem(10, "logistic", "binary")) == ("direct",)
    assert offered_formulations(random_problem("mhsa", "squared", "sequence")) == ("compressed", "factored", "direct")
    assert offered_formulations(random_problem("mhsa", "logistic", "binary")) == ("direct", "factored")
    problem = random_problem(10, "squared", "vector", seed=5)
    result = ct.solve(problem, "scs", tol=1e-4)
    assert result.formulation == result.summary()["formulation"] == "compressed"
    assert ct.solve(problem, "fista").formulation is None
    with pytest.raises(InvalidInputError, match="formulation: expected one of .'auto', 'compressed', 'direct'."):
        ct.solve(problem, "clarabel", formulation="factored")
    with pytest.raises(InvalidInputError, match="formulation"):
        ct.solve(problem, "fista", formulation="direct")
    rng = np.random.default_rng(0)
    data = str(tmp_path / "d.npz")
    np.savez(data, X=rng.standard_normal((30, 4, 3)), y=rng.standard_normal((30, 2)))
    argv = ["solve", data, "--program", "10", "--loss", "squared", "--beta-frac", "0.3"]
    assert main(argv) == 0
    assert "squared loss, primal form (compressed formulation), solver clarabel" in capsys.readouterr().out
    assert main(argv + ["--formulation", "direct", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["formulation"] == "direct"
    for extra, message in ((["--formulation", "factored"], "formulation: expected one of"),
                           (["--formulation", "direct", "--solver", "fista"], "--formulation: only for")):
        assert main(argv + extra) == 2
        assert message in capsys.readouterr().err


def test_the_memory_estimate_of_the_compact_forms_does_not_grow_with_N():
    def estimate(N, formulation, loss="squared", program=10):
        X = np.random.default_rng(0).standard_normal((N, 8, 6))
        y = X[:, :, :2] if program == "mhsa" else (X[:, 0, :2] if loss == "squared" else np.sign(X[:, 0, 0]))
        problem = ct.make_problem(X, y, program=program, loss=loss, beta=1.0)
        return estimate_cvxpy_bytes(problem, "primal", Clarabel, formulation=formulation)

    assert estimate(10_000, "compressed") == estimate(100, "compressed")
    fixed = BYTES_FIXED  # the interpreter's and CVXPY's own, whatever the problem
    assert estimate(10_000, "direct") - fixed > 50 * (estimate(100, "direct") - fixed)
    assert estimate(1_000, "factored", program="mhsa") - fixed < (estimate(1_000, "direct", program="mhsa") - fixed) / 3


@pytest.mark.parametrize("per_token", [False, True])
def test_the_mhsa_gram_without_the_design_equals_the_designs(per_token):
    """design_gram forms Phi^T Phi and Phi^T Y from the G_i; the dense design gives the reference."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((7, 4, 3))
    y = rng.standard_normal((7, 4, 2)) if per_token else rng.standard_normal((7, 2))
    program = ct.make_problem(X, y, program="mhsa", beta=1.0).program
    A = np.asarray(program.design(2, 7))
    Y = rng.standard_normal((A.shape[0], 2 if not per_token else 1))
    H, B = program.design_gram(2, 7, Y)
    np.testing.assert_allclose(H, A.T @ A, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(B, A.T @ Y, rtol=1e-12, atol=1e-12)
