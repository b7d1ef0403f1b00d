"""Data larger than memory (issue 13): DATA folders and shards, memory maps streamed in chunks, and
a solve whose private memory is bounded by a limit four times smaller than its data."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.core import data as data_module
from cvxtransformer.core.data import StreamedRows, open_data, split_rows, storage
from cvxtransformer.core.errors import InvalidInputError
from cvxtransformer.core.attention import AttentionProgram, sample_gates
from cvxtransformer.core.mhsa import LinearMHSAProgram
from cvxtransformer.testing import write_planted_folder

from conftest import cuda

CPU = torch.device("cpu")


def _save(folder, **arrays):
    os.makedirs(folder, exist_ok=True)
    for name, a in arrays.items():
        np.save(os.path.join(folder, name + ".npy"), a)
    return str(folder)


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return rng.standard_normal((23, 4, 3)), rng.standard_normal((23, 2))


def test_a_folder_shards_and_a_folder_of_shards_hold_the_same_rows(tmp_path, arrays):
    X, y = arrays
    one = _save(tmp_path / "one", X=X, y=y)
    shards = [_save(tmp_path / "parts" / f"p{i}", X=X[s:e], y=y[s:e]) for i, (s, e) in enumerate([(0, 10), (10, 23)])]
    np.savez(tmp_path / "d.npz", X=X, y=y)
    for source in (one, shards, str(tmp_path / "parts"), str(tmp_path / "d.npz")):
        data = open_data(source)
        assert data.N == 23 and data.shape == (23, 4, 3) and data.gates == {}
        for start, stop in [(0, 23), (3, 8), (8, 15), (20, 20)]:
            Xr, yr = data.rows(start, stop)
            np.testing.assert_array_equal(Xr, X[start:stop])
            np.testing.assert_array_equal(yr, y[start:stop])
    data = open_data(shards)
    assert isinstance(data.rows(2, 9)[0], np.memmap)        # inside one shard: a view of the file
    assert not isinstance(data.rows(8, 15)[0], np.memmap)   # across two: a copy of those rows
    assert data.counts == [10, 13] and data.split(2, 1) == (10, 23)  # one shard per process
    assert data.split(3, 1) == split_rows(23, 3, 1) == (8, 16)
    assert [split_rows(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_gates_are_read_and_must_agree(tmp_path, arrays):
    X, y = arrays
    U1, U2 = sample_gates(3, 4, 3, seed=1)
    data = open_data(_save(tmp_path / "g", X=X, y=y, U1=U1, U2=U2))
    assert set(data.gates) == {"U1", "U2"}
    np.testing.assert_array_equal(data.gates["U1"], U1)
    other = _save(tmp_path / "h", X=X, y=y, U1=U1 + 1, U2=U2)
    with pytest.raises(InvalidInputError, match="U1.npy differs from the first shard"):
        open_data([str(tmp_path / "g"), other])


@pytest.mark.parametrize("make, match", [
    (lambda t, X, y: _save(t / "a", X=X), r"has no y.npy"),
    (lambda t, X, y: _save(t / "b", y=y) and str(t / "b"), r"holds no X.npy"),
    (lambda t, X, y: _save(t / "c", X=X, y=y[:5]), r"y.npy has shape \(5, 2\), expected 23 rows"),
    (lambda t, X, y: _save(t / "d", X=X[:, :, 0], y=y), r"X.npy must be a C-ordered array of shape \(N, n, d\)"),
    (lambda t, X, y: _save(t / "e", X=np.asfortranarray(X), y=y), r"Fortran order"),
    (lambda t, X, y: [_save(t / "f", X=X, y=y), _save(t / "g", X=X[:, :3], y=y)], r"shards differ in shape"),
    (lambda t, X, y: str(t / "missing"), r"'.*missing' not found"),
])
def test_bad_folders_are_refused_by_name(tmp_path, arrays, make, match):
    with pytest.raises(InvalidInputError, match=match):
        open_data(make(tmp_path, *arrays))


def test_object_arrays_are_never_unpickled(tmp_path, arrays):
    X, y = arrays
    folder = _save(tmp_path / "o", X=X)
    np.save(os.path.join(folder, "y.npy"), np.array([{"a": 1}] * 23, dtype=object), allow_pickle=True)
    with pytest.raises(InvalidInputError, match="not a readable .npy file"):
        open_data(folder)


def _mapped(tmp_path, X, dtype):
    path = str(tmp_path / f"X{np.dtype(dtype).name}.npy")
    np.save(path, X.astype(dtype))
    return np.load(path, mmap_mode="r")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("chunk", [None, 5])
def test_memory_mapped_programs_are_streamed_and_exact(tmp_path, dtype, chunk):
    """A memory map is read chunk by chunk (float32 converted per chunk); every product of the operators,
    restricted or not, equals the in-memory one (the same float64 values)."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((37, 5, 3)).astype(dtype).astype(float)
    Xm = _mapped(tmp_path, X, dtype)
    U1, U2 = sample_gates(3, 5, 3, seed=2)
    mem, mapped = AttentionProgram(12, X, 2, U1, U2), AttentionProgram(12, Xm, 2, U1, U2)
    op, opm = mem.operator("cpu", torch.float64, chunk), mapped.operator("cpu", torch.float64, chunk)
    assert isinstance(opm.X, StreamedRows) == (dtype == np.float32)  # float64 on the CPU: the map itself
    J, K = torch.tensor([0, 2]), torch.tensor([1, 3, 4])
    T = torch.from_numpy(rng.standard_normal((37, 2)))
    V = torch.from_numpy(rng.standard_normal((37, 2)))
    # a restriction of a restriction takes indices local to it: gates J[1], tokens K[[0, 2]]
    nested = [(op.restrict(J, K).restrict([1], [0, 2]), opm.restrict(J, K).restrict([1], [0, 2])),
              (op.restrict([2], [1, 4]), opm.restrict([2], [1, 4]))]
    for a, b in nested:
        torch.testing.assert_close(b.rows(0, 37), a.rows(0, 37), rtol=0, atol=0)
    torch.testing.assert_close(nested[0][1].rows(0, 37), nested[1][0].rows(0, 37), rtol=0, atol=0)
    torch.testing.assert_close(nested[0][1].mask, nested[1][0].mask, rtol=0, atol=0)
    for a, b in [(op, opm), (op.restrict(J, K), opm.restrict(J, K)), nested[0]]:
        Z = torch.from_numpy(rng.standard_normal(a.shape))
        torch.testing.assert_close(b.forward(Z), a.forward(Z), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(b.adjoint(V), a.adjoint(V), rtol=1e-12, atol=1e-12)
        for x, y in zip(b.gram(T), a.gram(T)):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-11)
        torch.testing.assert_close(b.block_norms(), a.block_norms(), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(b.block_norm_bounds(), a.block_norm_bounds(), rtol=1e-12, atol=1e-12)
    assert opm.restrict(J, K).X is opm.X  # never copied whole
    op32 = mapped.operator("cpu", torch.float32, chunk)
    assert isinstance(op32.X, StreamedRows) == (dtype == np.float64)
    Z = torch.from_numpy(rng.standard_normal(op.shape))
    torch.testing.assert_close(op32.forward(Z.float()).double(), op.forward(Z), rtol=1e-5, atol=1e-4)
    mhsa, mhsa_m = LinearMHSAProgram(X, 2, pooled=False), LinearMHSAProgram(Xm, 2, pooled=False)
    a, b = mhsa.operator("cpu", torch.float64, chunk), mhsa_m.operator("cpu", torch.float64, chunk)
    Z = torch.from_numpy(rng.standard_normal(a.shape))
    V = torch.from_numpy(rng.standard_normal((37, 10)))
    torch.testing.assert_close(b.forward(Z), a.forward(Z), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b.adjoint(V), a.adjoint(V), rtol=1e-12, atol=1e-11)
    assert b.operator_norm() == pytest.approx(a.operator_norm(), rel=1e-12)


@pytest.mark.parametrize("program, loss, target", [(12, "cross_entropy", "classes"), ("mhsa", "logistic", "binary"),
                                                   ("12wd", "cross_entropy", "classes")])
def test_a_certified_check_reads_streamed_data_once(tmp_path, monkeypatch, program, loss, target):
    """On streamed data, yhat, the dual point and A^T V come from one pass (each row read once), and the
    check's numbers are those of the verifier's function with a forward and an adjoint pass."""
    from cvxtransformer.core.certificate import scaled_residual
    from cvxtransformer.solvers.proxgrad.certifier import Certifier

    rng = np.random.default_rng(7)
    X = rng.standard_normal((53, 4, 3)).astype(np.float32)
    y = rng.integers(0, 3, 53) if target == "classes" else np.where(rng.standard_normal(53) > 0, 1.0, -1.0)
    problem = ct.make_problem(_mapped(tmp_path, X, np.float32), y, program=program, loss=loss, beta=1.0, gates=3)
    problem = problem.with_beta(0.3 * problem.beta_max())
    op = problem.program.operator("cpu", torch.float64, 10)
    assert op.streams and isinstance(op.X, StreamedRows)
    read = []
    monkeypatch.setattr(StreamedRows, "__getitem__", lambda self, rows, get=StreamedRows.__getitem__:
                        read.append(rows.stop - rows.start) or get(self, rows))
    T = torch.from_numpy(problem.T)
    Z = torch.from_numpy(0.01 * rng.standard_normal(problem.program.canonical_shape))
    check = Certifier(problem, op, T).check(Z)
    assert sum(read) == 53
    read.clear()
    P, _, _, D, G = scaled_residual(problem.loss, problem.regularizer, op.forward, op.adjoint, T, Z)
    assert sum(read) == 2 * 53
    assert check.primal == pytest.approx(float(P), rel=1e-14) and check.dual == pytest.approx(float(D), rel=1e-13)
    torch.testing.assert_close(check.G, G, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("program, loss, target", [(12, "logistic", "binary"), ("mhsa", "squared", "sequence"),
                                                   ("10wd", "squared", "vector")])
def test_a_memory_mapped_float32_problem_solves_like_its_copy(tmp_path, program, loss, target):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((60, 4, 3)).astype(np.float32).astype(float)
    y = {"binary": np.where(rng.standard_normal(60) > 0, 1.0, -1.0), "sequence": rng.standard_normal((60, 4, 2)),
         "vector": rng.standard_normal((60, 3))}[target]
    folder = _save(tmp_path / "data", X=X.astype(np.float32), y=y)
    Xm, ym = open_data(folder).rows()
    assert isinstance(Xm, np.memmap) and Xm.dtype == np.float32
    problems = [ct.make_problem(A, y, program=program, loss=loss, beta=1.0, gates=3) for A in (X, Xm)]
    assert problems[1].program.X is Xm  # kept as the map: no float64 copy of the data
    beta = 0.2 * problems[0].beta_max()
    assert problems[1].beta_max() == pytest.approx(problems[0].beta_max(), rel=1e-12)
    one, mapped = (ct.solve(p.with_beta(beta), "fista", tol=1e-10) for p in problems)
    assert mapped.certified and mapped.certificate.relative_gap <= 1e-10
    np.testing.assert_allclose(mapped.Z, one.Z, rtol=1e-8, atol=1e-10)
    assert mapped.certificate.recovered_objective == pytest.approx(mapped.certificate.primal_objective, rel=1e-9)


def test_the_command_line_reads_folders(tmp_path, capsys):
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((50, 4, 3)), rng.integers(0, 3, 50)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    parts = [_save(tmp_path / f"s{i}", X=X[s:e], y=y[s:e]) for i, (s, e) in enumerate([(0, 20), (20, 50)])]
    argv = ["--program", "10", "--loss", "cross_entropy", "--beta-frac", "0.3", "--solver", "fista", "--json",
            "--tol", "1e-10"]
    outs = []
    for source in ([str(tmp_path / "d.npz")], parts):
        out = str(tmp_path / f"r{len(outs)}.npz")
        assert main(["solve", *source, *argv, "--out", out]) == 0
        capsys.readouterr()
        outs.append(out)
    with np.load(outs[0]) as a, np.load(outs[1]) as b:
        np.testing.assert_allclose(b["Z"], a["Z"], rtol=1e-9, atol=1e-12)
    verify = ["verify", _save(tmp_path / "all", X=X, y=y), outs[1], "--program", "10", "--loss", "cross_entropy",
              "--beta-frac", "0.3", "--tol", "1e-10", "--json"]
    assert main(verify) == 0
    assert json.loads(capsys.readouterr().out)["certified"]
    assert main(["solve", str(tmp_path / "nothing"), *argv]) == 2
    assert "not found" in capsys.readouterr().err


MEMORY_SCRIPT = textwrap.dedent("""
    import os, re, resource, sys
    import numpy as np, torch
    torch.set_num_threads(1)
    import cvxtransformer as ct
    from cvxtransformer.core.data import open_data

    def vm_data():
        return int(re.search(r"VmData:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024

    folder, limit, solver, loss = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    rng = np.random.default_rng(0)  # every code path once on a small problem (imports, first buffers)
    Xs = rng.standard_normal((200, 4, 3))
    small = ct.make_problem(Xs, Xs[:, 0, 0] if loss == "squared" else np.sign(Xs[:, 0, 0]), program=8, loss=loss,
                            beta=1.0)
    ct.solve(small.with_beta(0.2 * small.beta_max()), solver)
    a = np.ones((300, 300)); a @ a
    resource.setrlimit(resource.RLIMIT_DATA, (vm_data() + limit, resource.RLIM_INFINITY))
    X, y = open_data(folder).rows()
    y = y if loss == "squared" else np.where(y > 0, 1.0, -1.0)
    problem = ct.make_problem(X, y, program=8, loss=loss, beta=1.0)
    result = ct.solve(problem.with_beta(0.1 * problem.beta_max()), solver, tol=1e-8)
    print("solved", X.nbytes, result.certified, result.certificate.relative_gap, result.formulation)
    try:
        np.load(os.path.join(folder, "X.npy"))  # the control: the data itself does not fit under the limit
        print("control loaded")
    except MemoryError:
        print("control MemoryError")
""")


def write_big_folder(folder, limit, n=16, d=32):
    """A DATA folder whose float32 X.npy (N, n, d) is four times ``limit`` bytes, with the targets of a
    sparse linear teacher; written chunk by chunk (never whole in memory)."""
    write_planted_folder(folder, 4 * limit // (n * d * 4), n, d)
    assert os.path.getsize(folder / "X.npy") >= 4 * limit
    return folder


def solve_under_memory_limit(folder, limit, solver, loss="squared"):
    """Solve program (8) with ``loss`` on the DATA ``folder`` with ``solver`` in a fresh process whose
    private memory is bounded by ``limit`` bytes (``RLIMIT_DATA``); returns its (solved, control) lines."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(folder), str(limit), solver, loss],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip().splitlines()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA bounds mmap'd memory on Linux only")
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_a_memory_map_four_times_the_memory_limit_is_solved_and_certified(tmp_path, loss):
    """``RLIMIT_DATA`` bounds every private allocation of the process after the limit is set (numpy,
    torch, malloc); a read-only memory map is page cache the kernel may drop, so it is not counted. The
    data file is four times the limit, and loading it whole under the limit fails (the control)."""
    limit = 128 * 2**20  # the fixed part (chunk buffers, and the Newton model's for the logistic loss) is ~80 MiB
    solved, control = solve_under_memory_limit(write_big_folder(tmp_path / "big", limit), limit, "fista", loss)
    _, nbytes, certified, gap, _ = solved.split()
    assert int(nbytes) >= 4 * limit and certified == "True" and float(gap) <= 1e-8
    assert control == "control MemoryError"


@pytest.mark.cuda
@cuda
def test_cuda_streams_a_memory_map_that_does_not_fit(tmp_path, monkeypatch):
    rng = np.random.default_rng(6)
    X = rng.standard_normal((90, 5, 4)).astype(np.float32)
    Xm = _mapped(tmp_path, X, np.float32)
    monkeypatch.setattr(data_module, "device_budget", lambda device: 0)  # as if the GPU were full
    assert isinstance(storage(Xm, torch.device("cuda"), torch.float64), StreamedRows)
    problem = ct.make_problem(Xm, np.where(rng.standard_normal(90) > 0, 1.0, -1.0), program=12, loss="logistic",
                              beta=1.0, gates=3)
    problem = problem.with_beta(0.2 * problem.beta_max())
    cpu, gpu = ct.solve(problem, "fista", tol=1e-9), ct.solve(problem, "fista", tol=1e-9, device="cuda")
    assert gpu.certified and gpu.certificate.primal_objective == pytest.approx(cpu.certificate.primal_objective,
                                                                               rel=1e-8)
