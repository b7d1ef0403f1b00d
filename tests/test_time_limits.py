"""Issue 20, item 1: every loop of every solver honours ``time_limit`` and ``max_iter``; an overflow
is a SolverError that says what overflowed and what to do; data whose magnitude would overflow
float64 is refused up front, by name. The commands that hung run here under a timeout."""
import math
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.core.errors import InvalidInputError, SolverError
from cvxtransformer.core.regularizers import GroupLasso
from cvxtransformer.solvers.proxgrad.fista import Budget, fista

CORE = ["--program", "10", "--loss", "squared"]
LIMIT = 5  # seconds allowed by the failing commands (--time-limit 5, --refine-time 5)


RUNNER = """
import contextlib, io, json, sys, time
from cvxtransformer.cli import main
import cvxtransformer.solving, cvxtransformer.verify  # imports are not what is timed
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as text, contextlib.redirect_stderr(err):
        code = main(argv)
    out.append([code, text.getvalue(), err.getvalue(), time.perf_counter() - t0])
print(json.dumps(out))
"""


def commands(*argvs, timeout=120):
    """Several command lines in one fresh interpreter, under a timeout: (code, stdout, stderr, seconds) each."""
    import json

    run = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(argvs)], capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scale")
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((30, 4, 3)), rng.standard_normal((30, 2))
    paths = {"data": folder / "d.npz"}
    np.savez(paths["data"], X=X, y=y)
    for scale in (1e100, 1e150):
        paths[scale] = folder / f"x{scale:.0e}.npz"
        np.savez(paths[scale], X=scale * X, y=y)
    paths["Z"] = folder / "z.npz"
    np.savez(paths["Z"], Z=np.full((2, 4, 3), 1e300))
    return {k: str(v) for k, v in paths.items()}


@pytest.mark.slow
def test_the_commands_that_hung_return_at_once_with_one_line_naming_the_array(files):
    """``solve --solver fista --time-limit 5 --max-iter 50`` on X of 1e100 (1e150 with --beta-frac)
    never returned, nor ``verify`` of a Z of 1e300 with --refine-time 5 (or it raised an
    AttributeError): now each is one line naming the array, exit 2, well within its time limit
    (and --beta-frac does not blame beta)."""
    fista = ["--solver", "fista", "--time-limit", str(LIMIT), "--max-iter", "50"]
    runs = commands(["solve", files[1e100], *CORE, "--beta", "1", *fista],
                    ["solve", files[1e150], *CORE, "--beta-frac", "0.2", *fista],
                    ["verify", files["data"], files["Z"], *CORE, "--beta", "1", "--refine-time", str(LIMIT)])
    for (code, out, err, seconds), scale in zip(runs, (1e100, 1e150, None)):
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1 and seconds < LIMIT, (code, err, seconds)
        if scale is None:
            assert lines[0].startswith("cvxtransformer verify: error: RESULT: Z: expected magnitudes float64 can "
                                       "handle"), lines[0]
            assert "max |RESULT: Z| = 1e+300" in lines[0]
            continue
        assert lines[0].startswith("cvxtransformer solve: error: X: expected magnitudes float64 can handle"), lines[0]
        assert f"max |X| = {np.abs(np.load(files[scale])['X']).max():.3g}" in lines[0] and "rescale X" in lines[0]
        assert "beta" not in lines[0].split(";")[0]


@pytest.mark.parametrize("program, scale, ok", [(10, 1e60, True), (10, 1e80, False), ("mhsa", 1e20, True),
                                                ("mhsa", 1e30, False), (10, 1e-60, True), (10, 1e-80, False)])
def test_the_bound_scales_with_the_degree_of_the_map(program, scale, ok):
    """The map of programs (8)/(10)/(12) is linear in X and that of "mhsa" cubic: the bound on its norm
    is ``max|X| ** degree`` (times sizes), and norms beyond 1e75 (or below 1e-75) are refused."""
    rng = np.random.default_rng(1)
    X = scale * rng.standard_normal((20, 3, 2))
    y = rng.standard_normal((20, 2))
    if ok:
        problem = ct.make_problem(X, y, program=program, beta=1.0)
        expected = (3 if program == "mhsa" else 1) * math.log10(np.abs(X).max())
        assert expected < problem.program.log_norm() < expected + 5
        assert math.isfinite(problem.beta_max())
    else:
        with pytest.raises(InvalidInputError, match=r"^X: expected magnitudes float64 can handle"):
            ct.make_problem(X, y, program=program, beta=1.0)


def test_targets_gates_z_and_v_are_checked_by_name():
    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((20, 3, 2)), rng.standard_normal(20)
    with pytest.raises(InvalidInputError, match=r"^y: expected magnitudes .* max \|y\| = 1e\+200"):
        ct.make_problem(X, np.r_[1e200, y[1:]], program=8, beta=1.0)
    with pytest.raises(InvalidInputError, match=r"^U1: expected magnitudes"):
        ct.make_problem(X, y, program=12, U1=np.full((2, 3), 1e200), U2=np.ones((2, 2)), beta=1.0)
    problem = ct.make_problem(X, y, program=8, beta=1.0)
    for Z in (np.full((3, 2), 1e200), np.full((3, 2), 1e300)):
        with pytest.raises(InvalidInputError, match=r"^Z: expected magnitudes"):
            ct.certify(problem, Z)
        with pytest.raises(InvalidInputError, match=r"^init: expected magnitudes"):
            ct.solve(problem, "fista", init=Z)
    with pytest.raises(InvalidInputError, match=r"^V: expected magnitudes"):
        ct.certify(problem, problem.zeros(), V=np.full(20, 1e250))
    assert ct.certify(problem, np.full((3, 2), 1e10), refine=False).primal_objective > 1e18  # large, but finite


# ----------------------------------------------------------------------------- the loops themselves
class Stubborn:
    """A smooth term whose curvature along a step of squared length ``dd`` is ``need(dd)``: with
    ``100 sqrt(dd)`` it is never below ``L dd`` (steps have ``dd ~ 4 / L^2``), so backtracking can
    only stop by the clock; a constant 1e308 makes L overflow (1.1 x 1.7e308); NaN is a NaN."""

    quadratic = True

    def __init__(self, need, delay=0.0):
        self.need, self.delay = need, delay

    def image(self, x):
        time.sleep(self.delay)
        return x.clone()

    def grad(self, y, iy):
        return torch.ones_like(y), None

    def curvature(self, d, ixn, iy):
        return self.need(float(torch.dot(d, d)))


def _fista(sm, budget):
    return fista(sm, torch.zeros(4, dtype=torch.float64), GroupLasso(1e-3), 1.0, 1e-9, budget)


def test_backtracking_honours_the_time_limit():
    t0 = time.perf_counter()
    *_, L, reason = _fista(Stubborn(lambda dd: 100.0 * math.sqrt(dd), delay=0.01), Budget(50, 0.3))
    assert reason == "time_limit" and time.perf_counter() - t0 < 2.0 and L > 1.0


@pytest.mark.parametrize("need, what", [(1.7e308, "the Lipschitz estimate of the gradient is inf"),
                                        (math.nan, "the curvature along a step is nan"),
                                        (math.inf, "the curvature along a step is inf")])
def test_an_overflowing_step_is_a_solver_error_that_says_what_to_do(need, what):
    """Without a time limit the loop still ends: L grows by 1.25 at least per pass, so a step that is
    never accepted ends in an overflow, which is an error, never a loop on NaN."""
    with pytest.raises(SolverError, match=rf"^solver: fista: {what} \(float64 overflowed\); rescale the data"):
        _fista(Stubborn(lambda dd: need), Budget(50, None))


def test_a_non_finite_objective_inside_a_solve_is_a_solver_error(monkeypatch):
    from cvxtransformer.solvers.proxgrad import certifier

    rng = np.random.default_rng(3)
    X = rng.standard_normal((20, 3, 2))
    problem = ct.make_problem(X, X[:, 0, 0], program=8, beta=1.0)
    real = certifier.Certifier.check

    def overflowed(self, x, *args):
        out = real(self, x, *args)
        out.primal = math.inf
        return out

    monkeypatch.setattr(certifier.Certifier, "check", overflowed)
    with pytest.raises(SolverError, match=r"the objective at the iterate is inf \(float64 overflowed\)"):
        ct.solve(problem.with_beta(0.2 * problem.beta_max()), "fista")
    # the verifier's refinement runs the same code: its failure leaves the other dual points, and says so
    cert = ct.certify(problem, problem.zeros() + 0.01, refine=True)
    assert cert.dual_source == "residual" and cert.refine_status.startswith("failed: solver: fista:")
    assert math.isfinite(cert.relative_gap)


# Sizes whose full solve to tol 1e-15 takes 9 s ((12), proximal Newton stalls at 8e-15) and 13 s (mhsa)
# on a 2-core AMD EPYC: a 0.5 s limit stops each one early on a machine many times faster.  (At
# N = 400, proximal Newton reached its float64 floor in 0.5 s on a faster machine and said "stalled".)
@pytest.mark.parametrize("program, loss, shape, gates",
                         [(12, "logistic", (5000, 8, 16), 16), ("mhsa", "cross_entropy", (2000, 6, 5), 4)])
def test_a_real_solve_stops_at_its_time_limit(program, loss, shape, gates):
    """A solve that cannot reach tol 1e-15 in time stops within its limit and says so."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal(shape)
    N = shape[0]
    y = np.where(rng.standard_normal(N) > 0, 1, -1) if loss == "logistic" else rng.integers(0, 3, N)
    problem = ct.make_problem(X, y, program=program, loss=loss, beta=1.0, gates=gates)
    problem = problem.with_beta(1e-3 * problem.beta_max())
    t0 = time.perf_counter()
    result = ct.solve(problem, "fista", tol=1e-15, time_limit=0.5, max_iter=10**9, refine=False)
    assert time.perf_counter() - t0 < 0.5 + 3.0
    assert "time_limit reached" in result.status and not result.certified


def pass_seconds(problem, Z, repeats=2):
    """``repeats`` timed passes over the data: the forward map at Z and the adjoint of its image (what a
    certificate check costs), through the problem's own operator."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        problem.program.adjoint(problem.program.forward(Z))
        times.append(time.perf_counter() - t0)
    return times


def assert_recomputed(problem, result):
    """The certificate is the one recomputed from Z and its dual point: P(Z), D(V), V feasible, the verdict,
    and the scores A^T V that the gap-safe screening used."""
    cert, Z = result.certificate, result.Z
    assert cert.primal_objective == pytest.approx(float(problem.primal_objective(Z)), rel=1e-10)
    assert cert.dual_objective == pytest.approx(float(problem.dual_objective(cert.V)), rel=1e-10)
    G = problem.program.adjoint(cert.V)
    np.testing.assert_allclose(cert.G, G, rtol=1e-9, atol=1e-12 * np.abs(G).max())
    assert problem.regularizer.dual_norm(G) <= problem.beta * (1 + 1e-9)
    gap = cert.primal_objective - cert.dual_objective
    assert cert.duality_gap == pytest.approx(gap, rel=1e-12)
    assert cert.certified == (cert.relative_gap <= cert.tol) and cert.relative_gap == pytest.approx(
        gap / cert.dual_objective, rel=1e-12)


@pytest.mark.slow
def test_issue33_gated_mhsa_time_limits_bound_the_whole_call():
    """Issue 33, item 4: gated_mhsa at d = 10 with 8 gates, ``time_limit=1, refine_time=1``, took 12 s at
    N = 2,000 and 31 s at N = 8,000 (start-up, certificate checks, the verifier's refinement and its
    certificate ran past the limits, a pass over the data each). The whole call now ends within the two
    limits and a few passes over the data (timed here, so the bound follows the machine's speed and load)
    besides the evaluation of the recovered heads, and what it reports is recomputed from Z. (Before: 7.0 s
    at N = 6,000, one pass 0.45 s; after: 2.2 to 3.6 s on the same loaded 2-core machine.)"""
    rng = np.random.default_rng(0)
    N = 6000
    X, Y = rng.standard_normal((N, 8, 10)), rng.standard_normal((N, 8, 2))
    problem = ct.make_problem(X, Y, program="gated_mhsa", gates=8, beta_frac=0.1)
    Z = 1e-3 * rng.standard_normal(problem.program.shape)
    before = pass_seconds(problem, Z)
    t0 = time.perf_counter()
    result = ct.solve(problem, solver="fista", time_limit=1, refine_time=1)
    seconds = time.perf_counter() - t0
    one_pass = max(before + pass_seconds(problem, Z))  # the slowest, timed around the call: the load changes
    # the certificate's recovered objective evaluates the network of the recovered heads: its cost grows with
    # their number (not bounded by the limits; docs/reliability.md), timed here as well
    t0 = time.perf_counter()
    problem.reduction.objective(problem, problem.reduction.invert(problem, result.Z, "balanced"))
    recovery = time.perf_counter() - t0
    assert seconds <= 1 + 1 + 4 * one_pass + recovery + 0.5, (seconds, one_pass, recovery)
    assert "time_limit reached" in result.status and not result.certified
    cert = result.certificate
    assert cert.refine_status.startswith(("skipped: the time limit leaves", "time_limit reached")), cert.refine_status
    assert_recomputed(problem, result)


def test_a_refinement_past_the_deadline_is_skipped_and_says_so():
    """``certify(..., deadline=)`` already past: no refinement, its status says why, and the certificate is
    the one from Z and the given dual point, as with ``refine=False``."""
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((40, 4, 3)), rng.standard_normal(40)
    problem = ct.make_problem(X, y, program=8, beta_frac=0.3)
    Z = 0.01 * rng.standard_normal(problem.program.shape)
    late = ct.certify(problem, Z, refine=True, deadline=time.perf_counter())
    plain = ct.certify(problem, Z, refine=False)
    assert late.refine_status.startswith("skipped: the time limit leaves 0 s") and late.refine_seconds == 0.0
    assert (late.primal_objective, late.dual_objective, late.dual_source) == (
        plain.primal_objective, plain.dual_objective, plain.dual_source)
    on_time = ct.certify(problem, Z, refine=True, deadline=time.perf_counter() + 60)
    assert on_time.dual_source == "refined" and on_time.dual_objective > plain.dual_objective
    for cert in (late, on_time):
        np.testing.assert_allclose(cert.G, problem.program.adjoint(cert.V), rtol=1e-10, atol=1e-14)
