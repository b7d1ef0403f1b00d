"""The torch proximal-gradient backend (issue 3): agreement with Clarabel, honest certificates,
budgets, devices, dtypes, chunks, and every error path."""
import json

import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.certificate import certify_canonical
from cvxtransformer.cli import main
from cvxtransformer.errors import InvalidInputError
from cvxtransformer.losses import get_loss
from solvers import BACKENDS
from solvers.fista import solve_fista
from solvers.torch_losses import torch_loss
from solvers.torch_ops import group_operator_norms, make_data_op, to_storage

from conftest import CASES, case_id, random_problem

CPU = torch.device("cpu")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


# --- torch forms agree with the numpy forms -------------------------------------------------

@pytest.mark.parametrize("name", ["squared", "logistic", "cross_entropy"])
def test_torch_losses_match_numpy(name):
    rng = np.random.default_rng(0)
    loss = get_loss(name)
    N, c = 50, (1 if name == "logistic" else 3)
    y = {"squared": rng.standard_normal((N, c)), "logistic": np.where(rng.random(N) > 0.5, 1.0, -1.0),
         "cross_entropy": rng.integers(0, c, N)}[name]
    T = loss.encode(y, c if name == "cross_entropy" else None)
    Yhat = 2.0 * rng.standard_normal(T.shape)
    tl = torch_loss(loss)
    V = loss.dual_variable(Yhat, T)
    assert float(tl.value(_t(Yhat), _t(T))) == pytest.approx(loss.value(Yhat, T), rel=1e-13)
    np.testing.assert_allclose(tl.neg_grad(_t(Yhat), _t(T)).numpy(), V, rtol=1e-13, atol=1e-15)
    for s in (1.0, 0.37):
        assert float(tl.dual_value(_t(V), _t(T), s)) == pytest.approx(loss.dual_objective(s * V, T), rel=1e-13)
    # float32 inputs, float64 accumulation: close to the float64 values
    Y32, T32 = _t(Yhat).float(), _t(T).float()
    assert float(tl.value(Y32, T32)) == pytest.approx(loss.value(Yhat, T), rel=1e-6)
    assert tl.value(Y32, T32).dtype == torch.float64


@pytest.mark.parametrize("program", [8, 10, 12])
@pytest.mark.parametrize("chunk", [None, 7])
def test_data_op_matches_program(program, chunk):
    problem = random_problem(program, "squared", "scalar" if program == 8 else "vector", seed=3, N=33, n=5, d=3)
    p = problem.program
    mask = None if p.mask is None else _t(p.mask)
    J, K = torch.arange(p.h), torch.tensor([0, 2, 3])
    X = to_storage(p.X, CPU, torch.float64)
    op = make_data_op(X, mask, p.c, J, K, CPU, torch.float64, chunk)
    rng = np.random.default_rng(1)
    Z4 = np.zeros(p.canonical_shape)
    Z4[:, :, K.numpy()] = rng.standard_normal((p.h, p.c, 3, p.d))
    np.testing.assert_allclose(op.forward(_t(Z4[:, :, K.numpy()])).numpy(), p.forward(Z4), rtol=1e-12, atol=1e-12)
    V = rng.standard_normal((p.N, p.c))
    np.testing.assert_allclose(op.adjoint(_t(V)).numpy(), p.adjoint(V)[:, :, K.numpy()], rtol=1e-12, atol=1e-12)
    H, B = op.gram(_t(problem.T))
    cols = (np.arange(p.h)[:, None, None] * p.n * p.d + K.numpy()[None, :, None] * p.d
            + np.arange(p.d)[None, None, :]).ravel()
    D = p.design()[:, cols]
    np.testing.assert_allclose(H.numpy(), D.T @ D, rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(B.numpy(), problem.T.T @ D, rtol=1e-12, atol=1e-11)
    full = make_data_op(X, mask, p.c, J, torch.arange(p.n), CPU, torch.float64, chunk)
    mat = op.materialize()
    np.testing.assert_allclose(mat.adjoint(_t(V)).numpy(), p.adjoint(V)[:, :, K.numpy()], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(group_operator_norms(full).numpy(), p.group_operator_norms()[:, 0, :], rtol=1e-10)


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
    cert = certify_canonical(problem, problem.program.to_canonical(result.Z), result.V, tol=1e-7)
    assert cert.certified and cert.relative_gap <= 1e-7
    last = result.history[-1]
    assert last["kind"] == "certified"
    assert last["relative_gap"] == pytest.approx(cert.relative_gap, abs=1e-12)
    assert cert.kkt_dual_feasibility <= 1e-2


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[7]], ids=case_id)
def test_float32_gap_is_honest(case):
    """Iterations in float32, certificate in float64: the backend's gap is the verifier's."""
    problem = random_problem(*case, seed=4, N=80, n=5, d=4)
    out = solve_fista(problem, dtype="float32", tol=1e-4)
    assert out.Z4.dtype == np.float64
    cert = certify_canonical(problem, out.Z4, out.V, tol=1e-4)
    assert out.status.startswith("certified") and cert.certified
    assert out.history[-1]["relative_gap"] == pytest.approx(cert.relative_gap, abs=1e-12)
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    assert abs(cert.primal_objective - reference) <= 1e-4 * abs(reference)


def test_float32_stops_honestly_below_its_precision():
    """Asking float32 for 1e-13 either certifies (verifier agrees) or ends uncertified, never lies."""
    problem = random_problem(10, "squared", "vector", seed=6, N=80, n=5, d=4)
    out = solve_fista(problem, dtype="float32", tol=1e-13, max_iter=3000)
    cert = certify_canonical(problem, out.Z4, out.V, tol=1e-13)
    assert out.status.startswith("certified") == cert.certified
    assert out.history[-1]["relative_gap"] == pytest.approx(cert.relative_gap, abs=1e-12)


@pytest.mark.parametrize("options", [dict(method="data"), dict(method="gram"), dict(working_set=False),
                                     dict(chunk_size=9), dict(screen=False), dict(check_every=1)],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_variants_reach_the_same_optimum(options):
    problem = random_problem(12, "squared", "vector", seed=7, N=70, n=5, d=3, heads=4)
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    result = ct.solve(problem, "fista", tol=1e-8, **options)
    assert result.certified
    assert result.certificate.primal_objective == pytest.approx(reference, rel=1e-7)


def test_exact_zeros_and_gap_safe_screening():
    """The prox returns exact zeros, and no screened group is nonzero at the Clarabel optimum."""
    problem = random_problem(10, "squared", "vector", seed=8, N=80, n=8, d=3, frac=0.5)
    out = solve_fista(problem, tol=1e-9, screen_norms="exact")
    screened = out.history[-1]["screened_mask"]
    assert screened.shape == problem.program.canonical_shape[:3] and screened.any()
    assert np.all(out.Z4[screened] == 0.0)
    assert 0 < np.count_nonzero(np.linalg.norm(out.Z4, axis=-1)) < screened.size
    reference = ct.solve(problem, "clarabel", tol=1e-9)
    ref_norms = np.linalg.norm(problem.program.to_canonical(reference.Z), axis=-1)
    assert not np.any(screened & (ref_norms > 1e-6))


def test_warm_start_from_the_optimum_certifies_at_once():
    problem = random_problem(8, "logistic", "binary", seed=9, N=60, n=5, d=4)
    first = ct.solve(problem, "fista", tol=1e-9)
    again = ct.solve(problem, "fista", tol=1e-6, init=first.Z)
    assert again.certified and again.iterations == 0


# --- budgets: the result says so, and is not certified -------------------------------------

@pytest.mark.parametrize("budget, word", [(dict(max_iter=1), "max_iter"), (dict(time_limit=1e-9), "time_limit")])
def test_budget_limited_run_is_not_certified(budget, word):
    problem = random_problem(10, "cross_entropy", "classes", seed=10, N=60, n=5, d=4, frac=0.05)
    result = ct.solve(problem, "fista", tol=1e-10, **budget)
    assert word in result.status and not result.certified
    assert result.certificate.relative_gap > 1e-10
    assert result.history and all("relative_gap" in h for h in result.history)


def test_progress_is_silent_by_default_and_shown_on_request(capsys):
    problem = random_problem(8, "squared", "scalar", seed=11)
    ct.solve(problem, "fista")
    assert capsys.readouterr().err == ""
    ct.solve(problem, "fista", progress=True)
    err = capsys.readouterr().err
    assert "rel gap" in err and "certified" in err


def test_registered_and_on_the_command_line(tmp_path, capsys):
    assert BACKENDS["fista"] == ("solvers.fista", "solve_fista", ("primal",))
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
        solve_fista(problem, **options)


def test_gram_needs_the_squared_loss_and_dual_form_is_refused_by_solve():
    problem = random_problem(8, "logistic", "binary", seed=13)
    with pytest.raises(InvalidInputError, match="method"):
        ct.solve(problem, "fista", method="gram")
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
