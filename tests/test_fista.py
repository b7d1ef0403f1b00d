"""The torch proximal-gradient backend (issue 3): agreement with Clarabel, honest certificates,
budgets, devices, dtypes, chunks, and every error path."""
import json

import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.core.errors import InvalidInputError
from cvxtransformer.solvers import SOLVERS
from cvxtransformer.solvers.proxgrad import ProxGrad

from conftest import CASES, case_id, cuda, random_problem

CPU = torch.device("cpu")


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.parametrize("program", [8, 10, 12])
@pytest.mark.parametrize("chunk", [None, 7])
@pytest.mark.parametrize("d", [3, 100])  # 100: 300 features, a Gram matrix mirrored from its lower triangle in 2 blocks
def test_restricted_operator_matches_program(program, chunk, d):
    problem = random_problem(program, "squared", "scalar" if program == 8 else "vector", seed=3, N=33, n=5, d=d)
    p = problem.program
    J, K = torch.arange(p.h), torch.tensor([0, 2, 3])
    op = p.operator("cpu", torch.float64, chunk).restrict(J, K)
    rng = np.random.default_rng(1)
    Z4 = np.zeros(p.canonical_shape)
    Z4[:, :, K.numpy()] = rng.standard_normal((p.h, p.c, 3, p.d))
    Z = Z4.reshape(p.shape)
    np.testing.assert_allclose(op.forward(_t(Z4[:, :, K.numpy()])).numpy(), p.forward(Z), rtol=1e-12, atol=1e-12)
    V = rng.standard_normal((p.N, p.c))
    G4 = p.adjoint(V).reshape(p.canonical_shape)
    np.testing.assert_allclose(op.adjoint(_t(V)).numpy(), G4[:, :, K.numpy()], rtol=1e-12, atol=1e-12)
    H, B = op.gram(_t(problem.T))
    cols = (np.arange(p.h)[:, None, None] * p.n * p.d + K.numpy()[None, :, None] * p.d
            + np.arange(p.d)[None, None, :]).ravel()
    D = p.design()[:, cols]
    np.testing.assert_allclose(H.numpy(), D.T @ D, rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(B.numpy(), problem.T.T @ D, rtol=1e-12, atol=1e-11)
    # the restricted op holds the program's data itself; with one output column it reads the tokens K in place
    # (runs [0] and [2, 3]), with several it gathers them chunk by chunk
    assert op.X.data_ptr() == p.X.__array_interface__["data"][0]
    assert op.runs == ([(0, 1, 0), (2, 4, 1)] if p.h * p.c == 1 else None)
    # block norms: the spectral norm of each (gate, token) block of the design, and their Frobenius bounds
    norms, bounds = op.block_norms().numpy(), op.block_norm_bounds().numpy()
    M = np.ones((p.N, 1)) if p.mask is None else p.mask
    for j in range(p.h):
        for i, k in enumerate(K.tolist()):
            block = M[:, j, None] * p.X[:, k, :]
            assert norms[j, i] == pytest.approx(np.linalg.norm(block, 2), rel=1e-10)
            assert bounds[j, i] == pytest.approx(np.linalg.norm(block), rel=1e-12)


# --- agreement with Clarabel, certificates recomputed by the verifier -----------------------

@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fista_matches_clarabel_and_certifies(case):
    problem = random_problem(*case, seed=2, N=60, n=5, d=4)
    reference = ct.solve(problem, "clarabel", tol=1e-9)
    result = ct.solve(problem, "fista", tol=1e-7)
    p_ref = reference.certificate.primal_objective
    p_fista = result.certificate.primal_objective
    assert result.certified and result.solver == "fista"
    assert abs(p_fista - p_ref) <= 1e-6 * abs(p_ref)
    # the verifier, recomputed from the bare Z and V, certifies the same gap the backend stopped on
    cert = ct.certify(problem, result.Z, result.V, tol=1e-7, refine=False)
    assert cert.certified and cert.relative_gap <= 1e-7
    last = result.history[-1]
    assert last.kind == "certified"
    assert last.relative_gap == pytest.approx(cert.relative_gap, abs=1e-12)
    assert cert.kkt_dual_feasibility <= 1e-2


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[7]], ids=case_id)
def test_float32_gap_is_honest(case):
    """Iterations in float32, certificate in float64: the backend's gap is the verifier's."""
    problem = random_problem(*case, seed=4, N=80, n=5, d=4)
    out = ProxGrad().solve(problem, dtype="float32", tol=1e-4)
    assert out.Z.dtype == np.float64 and out.Z.shape == problem.program.shape
    cert = ct.certify(problem, out.Z, out.V, tol=1e-4, refine=False)
    assert out.status.startswith("certified") and cert.certified
    assert out.history[-1].relative_gap == pytest.approx(cert.relative_gap, abs=1e-12)
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    assert abs(cert.primal_objective - reference) <= 1e-4 * abs(reference)


def test_float32_stops_honestly_below_its_precision():
    """Asking float32 for 1e-13 either certifies (verifier agrees) or ends uncertified, never lies."""
    problem = random_problem(10, "squared", "vector", seed=6, N=80, n=5, d=4)
    out = ProxGrad().solve(problem, dtype="float32", tol=1e-13, max_iter=3000)
    cert = ct.certify(problem, out.Z, out.V, tol=1e-13, refine=False)
    assert out.status.startswith("certified") == cert.certified
    assert out.history[-1].relative_gap == pytest.approx(cert.relative_gap, abs=1e-12)


@pytest.mark.parametrize("options", [dict(method="data"), dict(method="gram"), dict(working_set=False),
                                     dict(chunk_size=9), dict(screen=False), dict(check_every=1)],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_variants_reach_the_same_optimum(options):
    problem = random_problem(12, "squared", "vector", seed=7, N=70, n=5, d=3, gates=4)
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    result = ct.solve(problem, "fista", tol=1e-8, **options)
    assert result.certified
    assert result.certificate.primal_objective == pytest.approx(reference, rel=1e-7)


def test_exact_zeros_and_gap_safe_screening():
    """The prox returns exact zeros, and no screened group is nonzero at the Clarabel optimum."""
    problem = random_problem(10, "squared", "vector", seed=8, N=80, n=8, d=3, frac=0.5)
    out = ProxGrad().solve(problem, tol=1e-9, screen_norms="exact")
    screened = out.screened
    assert screened.shape == problem.program.shape[:-1] and screened.any()
    assert np.all(out.Z[screened] == 0.0)
    assert 0 < np.count_nonzero(np.linalg.norm(out.Z, axis=-1)) < screened.size
    reference = ct.solve(problem, "clarabel", tol=1e-9)
    ref_norms = np.linalg.norm(reference.Z, axis=-1)
    assert not np.any(screened & (ref_norms > 1e-6))


def test_warm_start_from_the_optimum_certifies_at_once():
    problem = random_problem(8, "logistic", "binary", seed=9, N=60, n=5, d=4)
    first = ct.solve(problem, "fista", tol=1e-9)
    again = ct.solve(problem, "fista", tol=1e-6, init=first.Z)
    assert again.certified and again.iterations == 0


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_slow_progress_is_not_called_a_precision_floor(monkeypatch, dtype):
    """A gap far above the working precision that shrinks by under 1% per 30 checks is slow
    convergence, not a precision floor: in float64 the inner loop runs on to its budget; in float32,
    whose floor (a million roundings, 0.12) lies above this gap, it stops as stalled."""
    from cvxtransformer.solvers.proxgrad import driver
    from cvxtransformer.solvers.proxgrad import fista as fista_module

    real_gap, real_fista, reasons = fista_module.gap_terms, fista_module.fista, []

    def slow(*args):  # the inner loop sees a gap of 1e-3 that never decreases
        primal, _ = real_gap(*args)
        return primal, primal - 1e-3 * max(1.0, abs(primal))

    def spy(*args, **kwargs):
        out = real_fista(*args, **kwargs)
        reasons.append(out[3])
        return out

    monkeypatch.setattr(fista_module, "gap_terms", slow)
    monkeypatch.setattr(driver, "fista", spy)
    problem = random_problem(10, "cross_entropy", "classes", seed=10, N=60, n=5, d=4, frac=0.05)
    out = ProxGrad().solve(problem, dtype=dtype, tol=1e-12, max_iter=700, method="data",  # first order
                           working_set=False)
    if dtype == "float64":
        assert reasons == ["max_iter"] and out.iterations == 700
    else:
        assert reasons[0] == "stalled"


# --- budgets: the result says so, and is not certified -------------------------------------

@pytest.mark.parametrize("budget, word", [(dict(max_iter=1), "max_iter"), (dict(time_limit=1e-9), "time_limit")])
def test_budget_limited_run_is_not_certified(budget, word):
    problem = random_problem(10, "cross_entropy", "classes", seed=10, N=60, n=5, d=4, frac=0.05)
    result = ct.solve(problem, "fista", tol=1e-10, **budget)
    assert word in result.status and not result.certified
    assert result.certificate.relative_gap > 1e-10
    assert result.history and all(np.isfinite(h.relative_gap) for h in result.history)


def test_progress_is_silent_by_default_and_shown_on_request(capsys):
    problem = random_problem(8, "squared", "scalar", seed=11)
    ct.solve(problem, "fista")
    assert capsys.readouterr().err == ""
    ct.solve(problem, "fista", progress=True)
    err = capsys.readouterr().err
    assert "rel gap" in err and "certified" in err


def test_registered_and_on_the_command_line(tmp_path, capsys):
    assert SOLVERS["fista"] is ProxGrad and ProxGrad.forms == ("primal",)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 4, 3))
    path = tmp_path / "d.npz"
    np.savez(path, X=X, y=X[:, 0, 0] + 0.1 * rng.standard_normal(40))
    argv = ["solve", str(path), "--program", "8", "--loss", "squared", "--beta-frac", "0.3", "--solver", "fista",
            "--json"]
    assert main(argv + ["--dtype", "float64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["certified"] and out["solver"] == "fista" and out["relative_gap"] <= 1e-6
    assert main(argv + ["--max-iter", "1", "--tol", "1e-12"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["certified"] and "max_iter" in out["status"]
    assert main(argv + ["--device", "tpu"]) == 2
    assert "device" in capsys.readouterr().err


# --- errors name the argument ----------------------------------------------------------------

@pytest.mark.parametrize("options, match", [
    (dict(device="tpu"), "device"),
    (dict(device=3), "device"),
    (dict(dtype="float16"), "dtype"),
    (dict(dtype=np.int32), "dtype"),
    (dict(max_iter=0), "max_iter"),
    (dict(max_iter=2.5), "max_iter"),
    (dict(time_limit=-1.0), "time_limit"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(tol=0.0), "tol"),
    (dict(method="newton"), "method"),
    (dict(form="dual"), "form"),
])
def test_bad_arguments(options, match):
    problem = random_problem(8, "squared", "scalar", seed=12)
    with pytest.raises(InvalidInputError, match=match):
        ProxGrad().solve(problem, **options)


def test_gram_needs_the_group_lasso_and_dual_form_is_refused_by_solve():
    problem = random_problem("mhsa", "logistic", "binary", seed=13)
    with pytest.raises(InvalidInputError, match="method"):
        ct.solve(problem, "fista", method="gram")
    problem = random_problem(8, "logistic", "binary", seed=13)
    with pytest.raises(InvalidInputError, match="form"):
        ct.solve(problem, "fista", form="dual")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_gpu_is_a_clear_error():
    problem = random_problem(8, "squared", "scalar", seed=14)
    with pytest.raises(InvalidInputError, match="device.*no CUDA GPU"):
        ct.solve(problem, "fista", device="cuda")


# --- CUDA (skipped without a GPU) ------------------------------------------------------------

@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-8), ("float32", 1e-4)])
@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[8]], ids=case_id)
def test_cuda_matches_cpu(case, dtype, tol):
    problem = random_problem(*case, seed=15, N=80, n=5, d=4)
    cpu = ct.solve(problem, "fista", tol=1e-9)
    gpu = ct.solve(problem, "fista", tol=tol, device="cuda", dtype=dtype)
    assert gpu.certified
    assert gpu.certificate.primal_objective == pytest.approx(cpu.certificate.primal_objective, rel=tol)


@pytest.mark.cuda
@cuda
def test_cuda_chunks_match_whole():
    problem = random_problem(12, "logistic", "binary", seed=16, N=90, n=5, d=4)
    whole = ct.solve(problem, "fista", tol=1e-9, device="cuda")
    chunked = ct.solve(problem, "fista", tol=1e-9, device="cuda", chunk_size=8)
    assert chunked.certificate.primal_objective == pytest.approx(whole.certificate.primal_objective, rel=1e-8)


@pytest.mark.parametrize("weighted", [False, True])
def test_gated_gram_by_patterns_of_open_gates(weighted):
    """Program (12) with few gates on many samples sums its Gram matrix (and the Newton model's weighted one)
    per pattern of open gates: equal to the gated design's ``D^T diag(w) D``, entry by entry."""
    problem = random_problem(12, "squared", "vector", seed=4, N=600, n=5, d=3, gates=4)
    p = problem.program
    op = p.operator("cpu", torch.float64).restrict(torch.arange(p.h), torch.tensor([0, 2, 3]))
    assert op._patterns() is not None  # 16 patterns at most: fewer products than the 10 pairs of gates
    w = np.random.default_rng(0).uniform(0.0, 2.0, p.N)
    cols = (np.arange(p.h)[:, None, None] * p.n * p.d + np.array([0, 2, 3])[None, :, None] * p.d
            + np.arange(p.d)[None, None, :]).ravel()
    D = p.design()[:, cols]
    H = op.weighted_gram(_t(w[:, None]))[0] if weighted else op.gram(_t(problem.T))[0]
    expected = D.T @ (w[:, None] * D) if weighted else D.T @ D
    np.testing.assert_allclose(H.numpy(), expected, rtol=1e-12, atol=1e-11)


def test_first_working_set_takes_the_blocks_that_stand_out():
    """The pivot of the first working set: the blocks above the largest relative drop of the scores, up to
    the cap."""
    from cvxtransformer.solvers.proxgrad.working_sets import first_size

    scores = torch.tensor([10.0, 9.9, 9.8, 9.2, 9.2, 9.1, 9.1, 9.0, 9.0, 9.0, 8.9, 8.9, 8.9, 8.8, 8.8, 8.8])
    assert first_size(scores, 10) == 3  # drop after 3 (9.8 -> 9.2)
    assert first_size(scores[torch.randperm(16)], 10) == 3  # order of the blocks does not matter
    assert first_size(torch.tensor([10.0, 8.7, 1.3, 1.1, 1.05, 1.04, 1.03, 1.02]), 10) == 2
    assert first_size(torch.tensor([10.0, 9.9, 9.8, 5.0, 4.9, 4.8, 4.7, 4.6]), 10) == 3
    assert first_size(torch.tensor([10.0, 9.9, 9.8, 5.0, 4.9, 4.8, 4.7, 4.6]), 2) == 2  # ... up to the cap
    assert first_size(torch.tensor([5.0, 4.0]), 10) == 2


def test_first_working_set_holds_every_planted_token_that_stands_above_the_rest():
    """Three planted tokens of sixteen, uncorrelated tokens: only they violate the KKT conditions at 0 (scores
    5, 4.1 and 3.6 against 0.66 or less for the rest). The pivot is taken among every unscreened token's score,
    so the first working set holds all three (the pivot among the three violators alone took one, and more
    rounds and checks followed), and the solve certifies with that one set, never grown."""
    from cvxtransformer.solvers.proxgrad import working_sets
    from cvxtransformer.solvers.proxgrad.working_sets import first_size

    rng = np.random.default_rng(0)
    N, n, d = 2000, 16, 8
    X = rng.standard_normal((N, n, d))
    W = np.zeros((n, d))
    W[[2, 7, 11]] = rng.standard_normal((3, d)) * np.array([[1.0], [0.9], [0.8]])
    problem = ct.make_problem(X, np.einsum("ikd,kd->i", X, W) + 0.1 * rng.standard_normal(N), program=8,
                              beta_frac=0.2)
    scores = np.linalg.norm(problem.scores_at_zero().reshape(n, d), axis=1) / problem.beta
    assert sorted(np.flatnonzero(scores > 1)) == [2, 7, 11]
    assert first_size(torch.from_numpy(scores[scores > 1]), 10) == 1  # the violators alone: the pivot after one
    first = []
    original = working_sets.BlockWorkingSet.next

    def recording(self, chk, x, enabled, p0):
        out = original(self, chk, x, enabled, p0)
        first.append(self.ws.any(axis=0).copy())
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(working_sets, "ONE_ROUND", 0)  # the pivot rule, even on so few samples
        mp.setattr(working_sets.BlockWorkingSet, "next", recording)
        out = ProxGrad().solve(problem, tol=1e-8)
    assert sorted(np.flatnonzero(first[0])) == [2, 7, 11]
    assert out.status.startswith("certified") and all(np.array_equal(ws, first[0]) for ws in first)  # never grown
    ref = ct.solve(problem, "clarabel", tol=1e-9)
    assert ct.certify(problem, out.Z).primal_objective == pytest.approx(ref.certificate.primal_objective, rel=1e-7)


def planted_on_correlated_tokens():
    """Program (8), squared loss: 400 samples of 8 correlated tokens of 6 coordinates, 3 planted, 0.1 beta_max."""
    rng = np.random.default_rng(7)
    N, n, d = 400, 8, 6
    X = rng.standard_normal((N, n, d)) + 0.8 * rng.standard_normal((N, 1, d))
    w = np.zeros((n, d))
    w[rng.choice(n, 3, replace=False)] = rng.standard_normal((3, d))
    return ct.make_problem(X, np.einsum("ikd,kd->i", X, w) + 0.5 * rng.standard_normal(N), program=8,
                           beta_frac=0.1)


def test_an_unchecked_polish_that_misses_leaves_the_solve_to_go_on_and_is_not_repeated(monkeypatch):
    """A small support's polish returned unchecked (few samples) that is not the optimum (here the Newton point
    scaled by 0.9): the certified check says so, the solve goes on on the same working set, never polishes that
    support again (one Polisher per working set), and ends certified at Clarabel's optimum."""
    from cvxtransformer.solvers.proxgrad import newton

    problem = planted_on_correlated_tokens()
    supports, real = [], newton.polish

    def missing(sm, x, beta, **kwargs):
        supports.append((torch.linalg.vector_norm(x, dim=-1) > 0).numpy().tobytes())
        out = real(sm, x, beta, **kwargs)
        return None if out is None else (0.9 * out if len(supports) == 1 else out)

    monkeypatch.setattr(newton, "polish", missing)
    result = ct.solve(problem, "fista", tol=1e-8)
    certified = [h for h in result.history if h.kind == "certified"]
    assert len(certified) >= 3 and certified[1].relative_gap > 1e-3  # the scaled point: far from tol
    assert result.certified and len(supports) == len(set(supports)) >= 1
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    assert result.certificate.primal_objective == pytest.approx(reference, rel=1e-8)


def test_a_small_first_set_takes_the_tokens_that_stand_out_and_one_polish_solves_it():
    """Within ONE_ROUND (a small Gram matrix) the first set of a squared loss takes the tokens that stand out clearly
    (scores of 3 planted tokens of 8 at least STANDOUT times the rest, which violate too), and that set, polished at
    the first check whatever its gap, is solved to tol at once (not loosely: a second round would follow): one
    certified check after the one at 0, at Clarabel's optimum. On correlated tokens none stands out and every
    violating token is taken."""
    from cvxtransformer.solvers.proxgrad import driver, working_sets

    first = []
    original = working_sets.BlockWorkingSet.next

    def recording(self, chk, x, enabled, p0):
        out = original(self, chk, x, enabled, p0)
        first.append(np.flatnonzero(self.ws.any(axis=0)))
        return out

    for rho, planted_only in ((0.0, True), (0.8, False)):
        rng = np.random.default_rng(0)
        N, n, d = 1000, 8, 16
        X = np.sqrt(1 - rho) * rng.standard_normal((N, n, d)) + np.sqrt(rho) * rng.standard_normal((N, 1, d))
        planted = np.sort(rng.choice(n, 3, replace=False))
        W = np.zeros((n, d))
        W[planted] = rng.standard_normal((3, d)) / np.sqrt(d)
        problem = ct.make_problem(X, np.einsum("ikd,kd->i", X, W) + 0.5 * rng.standard_normal(N), program=8,
                                  beta_frac=0.1)
        scores = np.sort(np.linalg.norm(problem.scores_at_zero(), axis=1))[::-1] / problem.beta
        assert np.all(scores > 1) and (scores[2] >= working_sets.STANDOUT * scores[3]) == planted_only
        assert N * (n * d) ** 2 <= working_sets.ONE_ROUND  # every token's Gram matrix is small
        first.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(working_sets.BlockWorkingSet, "next", recording)
            result = ct.solve(problem, "fista")
        assert first[0].tolist() == (planted.tolist() if planted_only else list(range(n)))
        certified = [h for h in result.history if h.kind == "certified"]
        assert result.certified and len(certified) == 2 and result.iterations == driver.GRAM_FIRST_CHECK
        reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
        assert result.certificate.primal_objective == pytest.approx(reference, rel=1e-7)


def test_a_later_round_takes_the_violator_that_stands_out_alone():
    """Correlated tokens (rho = 0.8), three planted: the first set holds two; at its solution the third violates
    the KKT conditions clearly more than the other five, whose scores only reflect the missing token. The second
    round takes that token alone (its score at least twice the next: ``STANDOUT``), not every violator (a Gram
    matrix of all eight tokens), and the solve ends at the optimum with those three."""
    from cvxtransformer.solvers.proxgrad import working_sets

    rng = np.random.default_rng(0)
    N, n, d, rho = 2000, 8, 8, 0.8
    X = rng.standard_normal((N, n, d)) * np.sqrt(1 - rho) + np.sqrt(rho) * rng.standard_normal((N, 1, d))
    W = np.zeros((n, d))
    W[rng.choice(n, 3, replace=False)] = rng.standard_normal((3, d)) / np.sqrt(d)
    problem = ct.make_problem(X, np.einsum("ikd,kd->i", X, W) + 0.5 * rng.standard_normal(N), program=8,
                              beta_frac=0.05)
    sets, scores, original = [], [], working_sets.BlockWorkingSet.next

    def recording(self, chk, x, enabled, p0):
        scores.append(self.scores(chk.G).flatten().clone())
        out = original(self, chk, x, enabled, p0)
        sets.append(np.flatnonzero(self.ws.any(axis=0)).tolist())
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(working_sets, "ONE_ROUND", 0)  # the pivot rule, even on so few samples
        mp.setattr(working_sets.BlockWorkingSet, "next", recording)
        out = ProxGrad().solve(problem, tol=1e-8)
    assert sets[0] == [5, 6] and sets[1] == [3, 5, 6] and sets[-1] == [3, 5, 6]
    others = [float(v) for k, v in enumerate(scores[1]) if k not in (3, 5, 6)]
    assert min(others) > 1 and scores[1][3] >= working_sets.STANDOUT * max(others)  # the others violate too
    assert sorted(np.flatnonzero((out.Z != 0).any(axis=1))) == [3, 5, 6]
    ref = ct.solve(problem, "clarabel", tol=1e-9)
    assert ct.certify(problem, out.Z).primal_objective == pytest.approx(ref.certificate.primal_objective, rel=1e-7)


@pytest.mark.parametrize("program, n_out", [(8, "scalar"), (10, "vector")])
def test_grown_gram_equals_the_gram_of_the_grown_set(monkeypatch, program, n_out):
    """A working set that gains tokens gets its Gram matrix from the previous one and the new columns:
    equal to the Gram matrix summed afresh (entry by entry), and the solve certifies at Clarabel's optimum."""
    from cvxtransformer.solvers.proxgrad import driver, working_sets

    problem = random_problem(program, "squared", n_out, seed=5, N=300, n=16, d=3, frac=0.001)
    seen, grown = [], driver._Run._grown_gram
    monkeypatch.setattr(working_sets, "ONE_ROUND", 0)  # a set that grows, even on so few samples

    def spy(self, op, key):
        out = grown(self, op, key)
        if out is not None:
            H, B = op.gram(self.Tw)
            seen.append((float((out[0] - H).abs().max() / H.abs().max()), float((out[1] - B).abs().max())))
        return out

    monkeypatch.setattr(driver._Run, "_grown_gram", spy)
    result = ct.solve(problem, "fista", tol=1e-8, p0=2, chunk_size=64)
    assert seen and all(h < 1e-13 and b < 1e-9 for h, b in seen)
    assert result.certified
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    assert result.certificate.primal_objective == pytest.approx(reference, rel=1e-7)


@pytest.mark.parametrize("program, loss", [(8, "squared"), (10, "cross_entropy"), (12, "squared"), ("10wd", "squared"),
                                           ("12wd", "cross_entropy")])
def test_fewer_samples_than_coordinates_are_solved_on_the_span_of_each_token(program, loss):
    """With N <= d / 2 the torch backend solves the program on the span of each token's data (at most N
    coordinates instead of d): the same optimum (against the solve on every coordinate), a solution in that
    span, the full program's screened mask, and warm starts mapped through it."""
    rng = np.random.default_rng(0)
    N, n, d = 12, 3, 40
    X = rng.standard_normal((N, n, d))
    X[:, 1] = X[:, 1, :5] @ rng.standard_normal((5, d))  # token 1 spans 5 dimensions only
    y = {"squared": X[:, 0, :3] @ rng.standard_normal((3, 2)) + X[:, 1, :2], "cross_entropy": rng.integers(0, 3, N)}
    P = ct.make_problem(X, y[loss][:, 0] if program == 8 else y[loss], program=program, loss=loss, beta=1.0,
                        gates=2).with_beta_frac(0.1)
    Q, small = P.program.on_features()
    assert Q.shape == (n, d, N) and small.X.shape == (N, n, N) and small.name == P.program.name
    gram = np.einsum("kdr,kds->krs", Q, Q)
    np.testing.assert_allclose(gram, np.stack([np.diag((np.arange(N) < r).astype(float)) for r in (N, 5, N)]),
                               atol=1e-12)  # orthonormal columns, zero beyond each token's rank
    np.testing.assert_allclose(small.forward(rng.standard_normal(small.shape)).shape, (N, P.program.n_outputs))
    fewer, every = ct.solve(P, "fista", tol=1e-9), ct.solve(P, "fista", tol=1e-9, features=False)
    assert fewer.certified and every.certified
    p = every.certificate.primal_objective
    assert abs(fewer.certificate.primal_objective - p) <= 2e-9 * p
    Z4 = fewer.Z.reshape(P.program.canonical_shape)
    outside = Z4 - np.einsum("hckr,kdr->hckd", np.einsum("hckd,kdr->hckr", Z4, Q), Q)
    assert np.abs(outside).max() <= 1e-12 * np.abs(Z4).max()  # the solution lies in the span of each token's data
    assert fewer.screened.shape == every.screened.shape
    warm = ct.solve(P, "fista", tol=1e-9, init=every.Z)
    assert warm.certified and warm.iterations <= fewer.iterations
    assert ct.make_problem(X[:, :, :20], y[loss][:, 0] if program == 8 else y[loss], program=program, loss=loss,
                           beta=1.0, gates=2).program.on_features() is None  # N > d / 2: every coordinate


def test_a_small_support_is_polished_from_the_first_check_of_a_gram_form(monkeypatch):
    """On a Gram form the gap is first checked after GRAM_FIRST_CHECK iterations (then every check_every / 2), and
    a small support is polished from there, whatever its gap, its groups that a Newton step carries
    through 0 dropped: on correlated tokens with 3 planted of 8, that polish ends the solve at the first check,
    at Clarabel's optimum. Where a certified check costs about a gap of the Gram form (few samples), the polished
    point goes to that check unchecked (history: the certified checks at 0 and at the first check, nothing
    between); where it costs more (a slower pass rate), the subproblem's gap is checked, then the polished point
    (two inner checks at the same iteration, the second certified)."""
    from cvxtransformer.solvers.proxgrad import driver

    problem, n = planted_on_correlated_tokens(), 8
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    result = ct.solve(problem, "fista", tol=1e-8)
    assert result.certified and result.iterations == driver.GRAM_FIRST_CHECK
    assert [(h.kind, h.iteration) for h in result.history] == [("certified", 0), ("certified", 2)]
    assert 0 < result.certificate.support_size < n
    assert result.certificate.primal_objective == pytest.approx(reference, rel=1e-8)
    monkeypatch.setattr(driver, "PASS_RATE", 1e6)  # a check as costly as on many samples
    result = ct.solve(problem.with_beta(problem.beta), "fista", tol=1e-8)
    inner = [h for h in result.history if h.kind == "inner"]
    assert result.certified and result.iterations == driver.GRAM_FIRST_CHECK
    assert [h.iteration for h in inner] == [driver.GRAM_FIRST_CHECK] * 2 and inner[0].relative_gap > 0.5
    assert inner[1].relative_gap <= 1e-8 and 0 < result.certificate.support_size < n
    assert result.certificate.primal_objective == pytest.approx(reference, rel=1e-8)
