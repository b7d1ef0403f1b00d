"""Issue 20, item 8: memory at the edges. ``solver="auto"`` (the default of ``solve`` and of the
``solve``/``compare`` commands) takes Clarabel for a small problem and the torch backend otherwise,
and says which and why; a CVXPY build that would not fit in memory is refused before it starts,
naming the option to use; so is a network whose training would not fit; an allocation that fails
anyway is one line. The losses' sums over samples run by chunks of rows (the streamed memory per
sample is measured by benchmarks/memory.py, docs/benchmark_memory.md)."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.core import losses as losses_module
from cvxtransformer.core import validation
from cvxtransformer.core.cvxpy_builders import design_size, estimate_cvxpy_bytes
from cvxtransformer.core.errors import InvalidInputError
from cvxtransformer.solvers import SCS, Clarabel

from test_user_errors import assert_one_line_error

CORE = ["--program", "10", "--loss", "squared", "--beta-frac", "0.3", "--no-refine"]


def problem_of(N, n, d, c, program=10, **kwargs):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, n, d))
    return ct.make_problem(X, rng.standard_normal((N, c)), program=program, beta=1.0, **kwargs)


@pytest.fixture
def little_memory(monkeypatch):
    """As if this process could allocate only ``room`` more bytes."""
    def set_room(room):
        monkeypatch.setattr(validation, "available_bytes", lambda: float(room))
    return set_room


def test_auto_takes_clarabel_for_a_small_problem_and_fista_otherwise(monkeypatch):
    small = problem_of(30, 4, 3, 2)
    result = ct.solve(small.with_beta(0.3 * small.beta_max()))
    assert result.solver == "clarabel" and result.certified
    assert result.solver_choice == "auto: a small problem (2.9e+02 CVXPY coefficients <= 2e+05)"  # compressed: 12^2 x 2
    assert result.summary()["solver_choice"] == result.solver_choice
    assert ct.solve(small, solver="clarabel").solver_choice is None

    from cvxtransformer.core import cvxpy_builders

    def never(problem):
        raise AssertionError("a CVXPY problem was built")

    monkeypatch.setitem(cvxpy_builders.BUILDERS, "primal", never)
    large = problem_of(2000, 8, 16, 16)  # compressed: 128^2 x 16 = 2.6e5 coefficients, whatever N
    result = ct.solve(large.with_beta(0.3 * large.beta_max()))
    assert result.solver == "fista" and result.certified
    assert result.solver_choice == "auto: 2.6e+05 CVXPY coefficients > 2e+05"
    assert ct.solve(small, form="dual").solver == "clarabel"  # the dual form: CVXPY
    assert ct.solve(small, dtype="float32", tol=1e-4).solver_choice == "auto: option dtype is the torch backend's"


def test_the_command_line_says_which_solver_auto_took(tmp_path, capsys):
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", X=rng.standard_normal((30, 4, 3)), y=rng.standard_normal((30, 2)))
    assert main(["solve", str(tmp_path / "d.npz"), *CORE]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("program (10), squared loss, primal form (compressed formulation), solver clarabel (auto: a small "
                     "problem (2.9e+02 CVXPY coefficients <= 2e+05))")
    assert main(["solve", str(tmp_path / "d.npz"), *CORE, "--json", "--solver", "scs"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["solver"] == "scs" and summary["solver_choice"] is None


@pytest.mark.parametrize("program, c, shape", [(8, 1, (40, 1, 4 * 3, 1)), (10, 2, (40, 1, 4 * 3, 2)),
                                               (12, 2, (40, 1, 3 * 4 * 3, 2)), ("mhsa", 2, (40, 4, 27, 2))])
def test_the_estimate_counts_the_coefficients_of_the_cvxpy_design(program, c, shape):
    """design_size reads the design's shape from one sample: it is the design CVXPY gets."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((40, 4, 3))
    y = rng.standard_normal(40) if program == 8 else rng.standard_normal((40, 4, c) if program == "mhsa" else (40, c))
    problem = ct.make_problem(X, y, program=program, beta=1.0, gates=3)
    N, rows_per_sample, features, columns = shape
    assert design_size(problem) == (N * rows_per_sample, features, columns)
    assert problem.program.design().shape == (N * rows_per_sample, features)
    assert columns * features == np.prod(problem.program.shape)
    estimate = estimate_cvxpy_bytes(problem, "primal", Clarabel, formulation="direct")
    assert estimate >= 300 * N * rows_per_sample * features * columns  # Clarabel.bytes_per_coefficient
    assert estimate_cvxpy_bytes(problem, "primal", SCS, "direct") > estimate or program == "mhsa"


def test_a_cvxpy_build_that_would_not_fit_is_refused_naming_the_option(tmp_path, capsys, little_memory, monkeypatch):
    problem = problem_of(200, 8, 16, 4)
    need = estimate_cvxpy_bytes(problem, "primal", Clarabel)
    little_memory(need / 3)
    from cvxtransformer.core import cvxpy_builders

    monkeypatch.setitem(cvxpy_builders.BUILDERS, "primal", lambda *args: pytest.fail("built"))
    with pytest.raises(InvalidInputError, match=r"^solver: expected what fits in memory \(.* available\), got clarabel "
                                                r"on the CVXPY primal of program \(10\) \(6\.6e\+04 coefficients\), which "
                                                r"would take about .*; use solver='fista' \(--solver fista\)"):
        ct.solve(problem.with_beta(0.3 * problem.beta_max()), "clarabel")
    result = ct.solve(problem.with_beta(0.3 * problem.beta_max()))
    assert result.solver == "fista" and result.solver_choice.startswith("auto: CVXPY would take about ")
    np.savez(tmp_path / "d.npz", X=problem.program.X, y=problem.T)
    code = main(["solve", str(tmp_path / "d.npz"), *CORE, "--solver", "clarabel", "--out", str(tmp_path / "r.npz")])
    assert_one_line_error(code, capsys.readouterr().err, "solve", r"solver: .* use solver='fista' \(--solver fista\)")
    assert not (tmp_path / "r.npz").exists()


def test_a_network_whose_training_would_not_fit_is_refused_with_what_fits(little_memory):
    """The reported case: compare at MiniLM's width trained network (9) with one head per group of program
    (10), 24,576 heads, whose forward pass over the data takes tens of GB: killed, or a traceback."""
    from cvxtransformer.nn.networks import AlternativeAttention
    from cvxtransformer.nn.trainer import train

    rng = np.random.default_rng(3)
    X, T = rng.standard_normal((50, 4, 6)), rng.standard_normal((50, 2))
    net = AlternativeAttention(4, 6, 2, heads=400)
    little_memory(2**20)
    with pytest.raises(InvalidInputError, match=r"^network: expected what fits in memory \(1\.0 MiB available\), got "
                                                r"network alternative with 400 heads over N = 50 samples \(.* per "
                                                r"sample\), which takes .*; use fewer heads \(compare --heads\) or "
                                                r"fewer samples; about (\d+) heads would fit$") as info:
        train(net, X, T, "squared", 1.0, steps=1)
    fit = int(info.value.args[0].rsplit("about ", 1)[1].split()[0])
    assert 0 < fit < 400
    train(AlternativeAttention(4, 6, 2, heads=fit), X, T, "squared", 1.0, steps=1)  # what it says fits, fits


def test_an_allocation_that_fails_anyway_is_one_line(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(4)
    np.savez(tmp_path / "d.npz", X=rng.standard_normal((30, 4, 3)), y=rng.standard_normal((30, 2)))

    def oom(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 28991029248 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr("cvxtransformer.solving.solve", oom)
    code = main(["solve", str(tmp_path / "d.npz"), *CORE, "--out", str(tmp_path / "r.npz")])
    assert_one_line_error(code, capsys.readouterr().err, "solve",
                          r"error: out of memory \(an allocation of 27\.0 GiB failed\); make the run smaller")
    assert not (tmp_path / "r.npz").exists()


@pytest.mark.parametrize("name, c", [("squared", 3), ("logistic", 1), ("cross_entropy", 3)])
def test_the_losses_sum_and_map_by_chunks_of_rows_exactly(monkeypatch, name, c):
    """Chunks of 7 rows give the numbers of one pass (sums to rounding, maps exactly)."""
    rng = np.random.default_rng(5)
    loss = ct.get_loss(name)
    raw = {"squared": rng.standard_normal((100, c)), "logistic": np.where(rng.standard_normal(100) > 0, 1, -1),
           "cross_entropy": rng.integers(0, c, 100)}[name]
    T = torch.from_numpy(loss.encode(raw))
    Yhat, V = torch.from_numpy(rng.standard_normal((100, c))), torch.from_numpy(0.3 * rng.random((100, c)))
    calls = [lambda: loss.value(Yhat, T), lambda: loss.dual_variable(Yhat, T),
             lambda: loss.dual_objective(V, T, 0.7), lambda: loss.project_dual_domain(Yhat, T)]
    whole = [call() for call in calls]
    monkeypatch.setattr(losses_module, "ROWS", 7 * c)
    for call, one in zip(calls, whole):
        torch.testing.assert_close(call(), one, rtol=1e-13, atol=1e-13)


def test_available_memory_follows_the_process_limits():
    code = ("import resource\n"
            "from cvxtransformer.core.validation import available_bytes\n"
            "free = available_bytes()\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, resource.RLIM_INFINITY))\n"
            "print(free, available_bytes())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    free, limited = map(float, out.stdout.split())
    assert 0 < free and limited < min(free, 2 * 2**30)
