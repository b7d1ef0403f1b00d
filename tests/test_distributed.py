"""Data-parallel solves over torch.distributed (issue 13), on 2 and 3 gloo processes of this CPU machine.

Processes are started by ``torch.multiprocessing`` (fork: no re-import) and meet through a file
store in the test's folder (no port); the command line is also run once under ``torchrun``. Each
distributed solve is compared with the single-process solve of the same data: Z, P, D and the gap
to 1e-9 relative, the gathered dual point, and the single-process verifier's own certificate of
the distributed Z. Failures: a process that exits, raises or hangs makes every other one stop
with an error within a bounded time, and no result file is written.
"""
import datetime
import io
import json
import os
import subprocess
import sys
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.solvers import distributed
from cvxtransformer.solvers.distributed import ShardedLoss, shard_problem

from conftest import CASES, case_id, cuda, random_problem

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")
TOL = 1e-12
N = 41
COUNTS = {2: [21, 20], 3: [20, 0, 21]}  # N not divisible by the ranks; with 3, rank 1 has no rows
JOIN = 240  # seconds allowed to a whole group of processes (a loaded 2-core machine)


def _worker(rank, world, store, timeout, job, args, out):
    """Entry of a forked process: join the group, run ``job``, write its result (or error) to ``out``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        result = job(rank, *args)
    except BaseException as exc:  # reported to the parent, which asserts on it
        result = {"error": type(exc).__name__, "message": str(exc), "trace": traceback.format_exc()}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    distributed.finish()


def launch(tmp_path, world, job, *args, timeout=60, join=JOIN, hung=()):
    """Run ``job(rank, *args)`` on ``world`` forked processes; returns (results by rank, exit codes,
    seconds until each process ended). Processes in ``hung`` are not waited for: they are killed
    once the others have ended."""
    out = str(tmp_path / f"out{world}")
    os.makedirs(out, exist_ok=True)
    ctx = mp.get_context("fork")
    store = str(tmp_path / f"store{world}-{time.monotonic_ns()}")
    procs = [ctx.Process(target=_worker, args=(r, world, store, timeout, job, args, out)) for r in range(world)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    ended = {}
    while time.perf_counter() < start + join and len(ended) < world - len(hung):
        for r, p in enumerate(procs):
            if r not in ended and not p.is_alive():
                ended[r] = time.perf_counter() - start
        time.sleep(0.05)
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    results = {}
    for r in range(world):
        path = os.path.join(out, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                results[r] = json.load(f)
    return results, [p.exitcode for p in procs], ended


def _summary(result, problem):
    c = result.certificate
    return {"Z": np.asarray(result.Z).tolist(), "P": c.primal_objective, "D": c.dual_objective,
            "gap": c.relative_gap, "residual_gap": c.residual_relative_gap, "certified": c.certified,
            "iterations": result.iterations, "V": np.asarray(result.V).tolist(),
            "rows": [problem.program.shards.start, problem.program.shards.stop]}


def _solve_every_case(rank, counts):
    out = {}
    for case in CASES:
        problem = random_problem(*case, seed=1, N=N)
        sharded = shard_problem(problem, counts)
        assert isinstance(sharded.loss, ShardedLoss) and sharded.program.N == counts[rank]
        out[case_id(case)] = _summary(ct.solve(sharded, "fista", tol=TOL), sharded)
    return out


def _gathered(results, key, name):
    """The rows of every rank concatenated (rank order) for one case."""
    parts = [np.asarray(results[r][key][name]).reshape(-1, *np.asarray(results[0][key][name]).shape[1:])
             for r in sorted(results)]
    return np.concatenate(parts)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_every_program_and_loss_matches_one_process(tmp_path, world):
    """Every (program, loss) certifies on ``world`` processes (N not divisible by them; with 3, one
    process holds no rows) and its Z, P, D, gap and dual point match the single-process solve."""
    results, codes, _ = launch(tmp_path, world, _solve_every_case, COUNTS[world])
    assert codes == [0] * world and sorted(results) == list(range(world)), (codes, results.get(0))
    for r in range(world):
        assert "error" not in results[r], results[r].get("trace")
    for case in CASES:
        key = case_id(case)
        problem = random_problem(*case, seed=1, N=N)
        one = ct.solve(problem, "fista", tol=TOL)
        d = results[0][key]
        Z = np.asarray(d["Z"])
        for r in range(1, world):  # one Z: every process holds the same iterate, bit for bit
            assert np.array_equal(np.asarray(results[r][key]["Z"]), Z), key
            assert results[r][key]["P"] == d["P"] and results[r][key]["gap"] == d["gap"], key
        scale = max(1.0, abs(one.certificate.primal_objective))
        assert d["certified"] and d["gap"] <= TOL, (key, d["gap"])
        assert np.linalg.norm(Z - one.Z) <= 1e-9 * max(np.linalg.norm(one.Z), 1e-300), key
        assert abs(d["P"] - one.certificate.primal_objective) <= 1e-9 * scale, key
        assert abs(d["D"] - one.certificate.dual_objective) <= 1e-9 * scale, key
        assert abs(d["gap"] - one.certificate.relative_gap) <= 1e-9, key
        # the dual point: each process holds its rows; together they are the single-process V
        assert [results[r][key]["rows"] for r in range(world)] == [[sum(COUNTS[world][:r]), sum(COUNTS[world][:r + 1])]
                                                                  for r in range(world)]
        V = _gathered(results, key, "V")
        V1 = np.asarray(one.V).reshape(V.shape)
        assert np.linalg.norm(V - V1) <= 1e-9 * np.linalg.norm(V1), key
        # the single-process verifier, from the distributed Z alone, gives the distributed residual gap
        cert = ct.certify(problem, Z, tol=TOL, refine=False)
        assert abs(cert.residual_relative_gap - d["residual_gap"]) <= 1e-12, key
        assert cert.certified or d["gap"] < d["residual_gap"], key


def _features(rank):
    """Screening with exact norms along a path, the Gram and data paths, float32, the verifier's
    refinement, one-hot tokens and a time budget, on a sharded problem."""
    out = {}
    problem = random_problem(12, "squared", "vector", seed=5, N=50, n=5, d=3, gates=4, frac=0.2)
    sharded = shard_problem(problem, [30, 20])
    path = ct.solve_path(sharded, n_betas=4)
    out["path"] = [[p.beta, p.result.certificate.primal_objective, p.relative_gap, p.screened] for p in path]
    for method in ("gram", "data"):
        r = ct.solve(sharded, "fista", tol=1e-10, method=method, working_set=method == "gram")
        out[method] = [r.certificate.primal_objective, r.certificate.relative_gap, r.certified]
    r = ct.solve(sharded, "fista", tol=1e-4, dtype="float32")
    out["float32"] = [r.certificate.primal_objective, r.certificate.relative_gap, r.certified]
    cert = ct.certify(sharded, np.zeros(problem.program.shape) + 1e-3, tol=1e-6, refine=True, refine_time=30)
    out["refined"] = [cert.primal_objective, cert.relative_gap, cert.dual_source]
    rng = np.random.default_rng(3)
    tokens = np.eye(6)[rng.integers(0, 6, (40, 4))]
    onehot = ct.make_problem(tokens, rng.standard_normal((40, 2)), program=10, beta=1.0)
    onehot = onehot.with_beta(0.3 * onehot.beta_max())
    sharded_onehot = shard_problem(onehot, [25, 15])
    r = ct.solve(sharded_onehot, "fista", tol=1e-10)
    out["onehot"] = [r.certificate.primal_objective, r.certificate.relative_gap,
                     type(sharded_onehot.program.operator()).__name__]
    r = ct.solve(shard_problem(random_problem(8, "logistic", "binary", seed=2, N=60), [30, 30]), "fista",
                 tol=1e-14, time_limit=1e-9)
    out["budget"] = [r.status, r.certified, r.iterations]
    return out


@pytest.mark.slow
def test_screening_gram_newton_working_sets_and_budgets_work_across_shards(tmp_path):
    results, codes, _ = launch(tmp_path, 2, _features)
    assert codes == [0, 0] and "error" not in results[0], results.get(0, {}).get("trace")
    assert results[0] == results[1]  # the same numbers on both processes
    d = results[0]
    problem = random_problem(12, "squared", "vector", seed=5, N=50, n=5, d=3, gates=4, frac=0.2)
    path = ct.solve_path(problem, n_betas=4)
    for (beta, P, gap, screened), one in zip(d["path"], path):
        assert beta == pytest.approx(one.beta, rel=1e-12) and gap <= 1e-6
        assert P == pytest.approx(one.result.certificate.primal_objective, rel=1e-9)
        assert screened == one.screened  # exact operator norms: Gram matrices summed over the shards
    assert any(point[3] for point in d["path"])
    reference = ct.solve(problem, "fista", tol=1e-12).certificate.primal_objective
    for method in ("gram", "data"):
        assert d[method][2] and d[method][0] == pytest.approx(reference, rel=1e-9)
    assert d["float32"][2] and d["float32"][0] == pytest.approx(reference, rel=1e-4)
    one = ct.certify(problem, np.zeros(problem.program.shape) + 1e-3, tol=1e-6, refine=True, refine_time=30)
    assert d["refined"][2] == "refined" == one.dual_source
    assert d["refined"][0] == pytest.approx(one.primal_objective, rel=1e-12)
    assert d["refined"][1] == pytest.approx(one.relative_gap, rel=1e-6, abs=1e-12)
    rng = np.random.default_rng(3)
    tokens = np.eye(6)[rng.integers(0, 6, (40, 4))]
    onehot = ct.make_problem(tokens, rng.standard_normal((40, 2)), program=10, beta=1.0)
    onehot = onehot.with_beta(0.3 * onehot.beta_max())
    assert d["onehot"][2] == type(onehot.program.operator()).__name__
    assert d["onehot"][0] == pytest.approx(ct.solve(onehot, "fista", tol=1e-12).certificate.primal_objective,
                                           rel=1e-9)
    status, certified, iterations = d["budget"]
    assert "time_limit" in status and not certified and iterations == 0


# --- the command line, under torchrun and in forked processes ------------------------------------

def _save_dir(folder, X, y):
    os.makedirs(folder, exist_ok=True)
    np.save(os.path.join(folder, "X.npy"), X)
    np.save(os.path.join(folder, "y.npy"), y)


@pytest.fixture
def data_dir(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((101, 5, 3))
    y = rng.integers(0, 3, 101)
    _save_dir(str(tmp_path / "data"), X, y)
    np.savez(tmp_path / "data.npz", X=X, y=y)
    return tmp_path


ARGV = ["--program", "12", "--loss", "cross_entropy", "--gates", "3", "--beta-frac", "0.2", "--solver", "fista",
        "--tol", "1e-10", "--json"]


@pytest.mark.slow
def test_torchrun_writes_the_single_process_result(data_dir):
    """``torchrun --nproc-per-node 2 -m cvxtransformer solve DIR ... --distributed``: rank 0 prints
    and writes the result file; Z, V and the certificate are those of the single-process solve."""
    one_out, two_out = str(data_dir / "one.npz"), str(data_dir / "two.npz")
    assert main(["solve", str(data_dir / "data.npz"), *ARGV, "--out", one_out]) == 0
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    run = subprocess.run(torchrun + ["-m", "cvxtransformer", "solve", str(data_dir / "data"), *ARGV, "--distributed",
                                     "--out", two_out], capture_output=True, text=True, timeout=JOIN,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)  # one JSON object: only rank 0 prints
    with np.load(one_out) as a, np.load(two_out) as b:
        assert np.abs(a["Z"] - b["Z"]).max() <= 1e-9 * np.abs(a["Z"]).max()
        assert b["V"].shape == a["V"].shape == (101, 3)
        assert np.abs(a["V"] - b["V"]).max() <= 1e-9 * np.abs(a["V"]).max()
        one = json.loads(str(a["summary"]))
    assert summary["certified"] and summary["relative_gap"] <= 1e-10
    assert summary["primal_objective"] == pytest.approx(one["primal_objective"], rel=1e-12)
    assert summary["beta"] == pytest.approx(one["beta"], rel=1e-12)


def _cli(rank, argv, fault):
    """``cvxtransformer solve ... --distributed`` in this (already joined) process; ``fault`` makes
    rank 1 exit, raise or hang at its second certified check."""
    if fault and rank == 1:
        from cvxtransformer.solvers.proxgrad import certifier

        check, calls = certifier.Certifier.check, []

        def faulty(self, *a, **k):
            calls.append(1)
            if len(calls) == 2:
                if fault == "exit":
                    os._exit(17)
                if fault == "raise":
                    raise RuntimeError("injected failure")
                time.sleep(600)
            return check(self, *a, **k)

        certifier.Certifier.check = faulty
    err = io.StringIO()
    with redirect_stdout(io.StringIO()) as out, redirect_stderr(err):
        code = main(argv)
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["exit", "raise", "hang"])
def test_a_process_that_dies_raises_or_hangs_stops_every_process(data_dir, fault):
    result = str(data_dir / "result.npz")
    argv = ["solve", str(data_dir / "data"), *ARGV, "--tol", "1e-14", "--max-iter", "100000", "--distributed",
            "--out", result]
    timeout = 4
    results, codes, ended = launch(data_dir, 3, _cli, argv, fault, timeout=timeout, join=120,
                                   hung={1} if fault == "hang" else ())
    for r in (0, 2):  # the processes that did not fail stop with a one-line error, in bounded time
        assert codes[r] == 0 and results[r]["code"] == 2, (fault, codes, results.get(r))
        lines = results[r]["stderr"].strip().splitlines()
        assert len(lines) == 1 and "distributed: rank" in lines[0] and "another process failed" in lines[0]
        assert ended[r] < 60
    if fault == "raise":
        assert "error" in results[1] and "injected" in results[1]["message"]
    elif fault == "exit":
        assert codes[1] == 17
    else:
        assert codes[1] != 0 and 1 not in results  # still asleep: killed by the test
    assert not os.path.exists(result) and not [f for f in os.listdir(data_dir) if f.startswith(".result")]


def test_bad_values_on_one_process_fail_every_process_before_any_work(data_dir):
    X, y = np.load(data_dir / "data" / "X.npy"), np.load(data_dir / "data" / "y.npy")
    X[90, 2, 1] = np.inf  # rows of the last process only
    _save_dir(str(data_dir / "bad"), X, y)
    result = str(data_dir / "bad.npz")
    argv = ["solve", str(data_dir / "bad"), *ARGV, "--distributed", "--out", result]
    results, codes, _ = launch(data_dir, 2, _cli, argv, None)
    for r in (0, 1):  # the same error on every process, printed once (by rank 0)
        assert codes[r] == 0 and results[r]["code"] == 2 and results[r]["stdout"] == ""
    assert results[0]["stderr"].strip() == ("cvxtransformer solve: error: X: expected finite values, got 1 NaN/Inf "
                                            "entries; remove or impute them (rank 1)")
    assert results[1]["stderr"] == ""
    assert not os.path.exists(result)


def test_distributed_user_errors(data_dir, capsys):
    argv = ["solve", str(data_dir / "data"), *ARGV, "--distributed"]
    env = {k: os.environ.pop(k) for k in distributed.ENV if k in os.environ}
    try:
        assert main(argv) == 2
        assert "no torchrun environment" in capsys.readouterr().err
    finally:
        os.environ.update(env)
    assert main(argv[:-1] + ["--solver", "clarabel", "--distributed"]) == 2
    assert "--distributed: only for --solver fista" in capsys.readouterr().err


def _refused(rank):
    problem = shard_problem(random_problem(8, "squared", "scalar", seed=0, N=20))
    out = {}
    for call in (lambda: ct.solve(problem, "clarabel"), lambda: shard_problem(problem),
                 lambda: shard_problem(random_problem(8, "squared", "scalar", N=20), [5, 5])):
        try:
            call()
            out[len(out)] = "no error"
        except ct.InvalidInputError as exc:
            out[len(out)] = str(exc)
    return out


def test_what_a_sharded_problem_refuses(tmp_path):
    results, codes, _ = launch(tmp_path, 2, _refused)
    assert codes == [0, 0] and "error" not in results[0], results.get(0)
    assert "cannot solve" in results[0]["0"] and "cvxpy_value" in results[0]["0"]
    assert "already sharded" in results[0]["1"] or "a problem of one process" in results[0]["1"]
    assert "adding up to N = 20" in results[0]["2"]


@pytest.mark.cuda
@cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per process (2 GPUs)")
def test_nccl_on_two_gpus_matches_one_process(data_dir):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    one_out, two_out = str(data_dir / "one.npz"), str(data_dir / "two.npz")
    assert main(["solve", str(data_dir / "data.npz"), *ARGV, "--out", one_out]) == 0
    run = subprocess.run(torchrun + ["-m", "cvxtransformer", "solve", str(data_dir / "data"), *ARGV, "--distributed",
                                     "--device", "cuda", "--out", two_out],
                         capture_output=True, text=True, timeout=JOIN)
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(one_out) as a, np.load(two_out) as b:
        assert np.abs(a["Z"] - b["Z"]).max() <= 1e-9 * np.abs(a["Z"]).max()
