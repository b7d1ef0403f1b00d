"""Issue 20, items 3 and 4: a shard folder without its arrays is an error naming it (never dropped,
with a smaller problem certified), and processes of a distributed solve that see different data,
gates or options are refused before any work, with a message naming the rank, printed once, and
no result written. The distributed cases run on 2 gloo processes (tests/test_distributed.py's
launcher)."""
import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

from cvxtransformer.cli import main
from cvxtransformer.cli.convex import format_certificate
from cvxtransformer.core.data import open_data
from cvxtransformer.core.errors import InvalidInputError

from test_distributed import launch
from test_user_errors import assert_one_line_error

N, SHARDS = 40, 4
ARGS = ["--program", "12", "--loss", "squared", "--gates", "3", "--beta-frac", "0.3", "--solver", "fista",
        "--tol", "1e-8", "--no-refine", "--json"]


def write_shards(folder, X, y, shards=SHARDS, **gates):
    """A DATA folder of ``shards`` shard folders s0, s1, ... (rows split evenly)."""
    for i, rows in enumerate(np.array_split(np.arange(len(X)), shards)):
        shard = folder / f"s{i}"
        shard.mkdir(parents=True)
        for name, a in dict(X=X[rows], y=y[rows], **gates).items():
            np.save(shard / f"{name}.npy", a)
    return folder


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return rng.standard_normal((N, 4, 3)), rng.standard_normal((N, 2))


# ----------------------------------------------------------------------------- item 3
@pytest.mark.parametrize("damage", ["removed", "renamed", "emptied"])
def test_a_shard_folder_without_its_arrays_is_an_error_naming_it(tmp_path, capsys, arrays, damage):
    """One of four shard folders lost its X.npy: 30 of 40 rows were certified without a word."""
    data = write_shards(tmp_path / "data", *arrays)
    shard = data / "s2"
    if damage == "removed":
        (shard / "X.npy").unlink()
    elif damage == "renamed":
        (shard / "X.npy").rename(shard / "X_old.npy")
    else:
        for f in shard.iterdir():
            f.unlink()
    with pytest.raises(InvalidInputError, match=r"shard folder '.*s2' of '.*data' has no X.npy"):
        open_data(str(data))
    out = tmp_path / "r.npz"
    code = main(["solve", str(data), *ARGS, "--out", str(out)])
    _, err = capsys.readouterr()
    assert_one_line_error(code, err, "solve", r"DATA: shard folder '.*s2' of '.*data' has no X.npy \(it holds "
                                              + {"removed": r"y\.npy", "renamed": r"X_old\.npy, y\.npy",
                                                 "emptied": "nothing"}[damage] + r"\); restore the shard's X.npy")
    assert not out.exists()
    (tmp_path / "data" / ".ipynb_checkpoints").mkdir()  # hidden folders are not shards
    if damage == "removed":
        np.save(shard / "X.npy", arrays[0][20:30])
        assert open_data(str(data)).N == N


# ----------------------------------------------------------------------------- item 4
def _solve_on_each_rank(rank, argvs):
    err = io.StringIO()
    with redirect_stdout(io.StringIO()) as out, redirect_stderr(err):
        code = main(argvs[rank])
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def refused(tmp_path, argvs, match):
    """Both processes exit 2 before any work; rank 0 prints one line naming rank 1, rank 1 prints
    nothing (the same error: printed once); no result file."""
    result = tmp_path / "result.npz"
    argvs = [argv + ["--distributed", "--out", str(result)] for argv in argvs]
    results, codes, _ = launch(tmp_path, 2, _solve_on_each_rank, argvs, timeout=30, join=120)
    assert codes == [0, 0] and sorted(results) == [0, 1], (codes, results)
    assert [results[r]["code"] for r in (0, 1)] == [2, 2], results
    assert results[1]["stderr"] == "" and results[0]["stdout"] == results[1]["stdout"] == ""
    assert_one_line_error(2, results[0]["stderr"], "solve", match)
    assert not result.exists() and not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_a_shard_folder_missing_its_arrays_on_one_process(tmp_path, arrays):
    one, other = write_shards(tmp_path / "one", *arrays), write_shards(tmp_path / "other", *arrays)
    (other / "s3" / "X.npy").unlink()
    refused(tmp_path, [["solve", str(one), *ARGS], ["solve", str(other), *ARGS]],
            r"DATA: shard folder '.*other/s3' of '.*other' has no X\.npy .* \(rank 1\)$")


def test_processes_that_see_a_different_n(tmp_path, arrays):
    """A copy with 30 of the 40 rows on one machine: the split would count rows 15-20 twice and
    never read 30-40."""
    X, y = arrays
    np.savez(tmp_path / "d.npz", X=X, y=y)
    (tmp_path / "copy").mkdir()
    np.savez(tmp_path / "copy" / "d.npz", X=X[:30], y=y[:30])
    refused(tmp_path, [["solve", str(tmp_path / "d.npz"), *ARGS], ["solve", str(tmp_path / "copy" / "d.npz"), *ARGS]],
            r"distributed: rank 1 differs from rank 0 in N \(rows of DATA\) \(30 against 40 on rank 0\); every "
            r"process must read the same DATA")


def test_processes_with_different_gates(tmp_path, arrays):
    X, y = arrays
    rng = np.random.default_rng(1)
    U1, U2 = rng.standard_normal((3, 4)), rng.standard_normal((3, 3))
    one = write_shards(tmp_path / "one", X, y, U1=U1, U2=U2)
    other = write_shards(tmp_path / "other", X, y, U1=U1, U2=-U2)
    refused(tmp_path, [["solve", str(one), *ARGS], ["solve", str(other), *ARGS]],
            r"distributed: rank 1 differs from rank 0 in the gates U2 of program \(12\) \(.* against .* on rank 0\); "
            r"every process must use the same gates")
    # gates sampled with another seed are another option: refused as such, before any data is read
    refused(tmp_path, [["solve", str(one), *ARGS], ["solve", str(one), *ARGS, "--gate-seed", "7"]],
            r"distributed: rank 1 differs from rank 0 in --gate-seed \(7 against 0 on rank 0\); launch every process "
            r"with the same options")


def test_processes_that_read_different_rows_of_the_same_shape(tmp_path, arrays):
    """A stale copy: the same N and shapes, other values (rows of rank 1's range only)."""
    X, y = arrays
    one = write_shards(tmp_path / "one", X, y)
    stale = X.copy()
    stale[20:] = np.random.default_rng(2).standard_normal(stale[20:].shape)
    other = write_shards(tmp_path / "other", stale, y)
    refused(tmp_path, [["solve", str(one), *ARGS], ["solve", str(other), *ARGS]],
            r"distributed: rank 1 differs from rank 0 in DATA row 20 \(\w+ against \w+ on rank 0\); every process "
            r"must read the same DATA \(a stale or partial copy on one machine\?\)")


def test_a_different_beta_is_refused_not_a_collective_mismatch(tmp_path, arrays):
    """Different --beta on one process ended in gloo's "collective mismatch" and a SIGABRT."""
    np.savez(tmp_path / "d.npz", X=arrays[0], y=arrays[1])
    argv = ["solve", str(tmp_path / "d.npz"), *[a for a in ARGS if a not in ("--beta-frac", "0.3")]]
    refused(tmp_path, [argv + ["--beta", "0.5"], argv + ["--beta", "0.2"]],
            r"distributed: rank 1 differs from rank 0 in --beta \(0\.2 against 0\.5 on rank 0\); launch every process "
            r"with the same options")


def test_a_distributed_run_says_how_many_processes_it_used(tmp_path, arrays):
    data = write_shards(tmp_path / "data", *arrays)
    argv = ["solve", str(data), *ARGS, "--distributed"]
    results, codes, _ = launch(tmp_path, 2, _solve_on_each_rank, [argv, argv], timeout=30, join=120)
    assert codes == [0, 0] and [results[r]["code"] for r in (0, 1)] == [0, 0], results
    summary = json.loads(results[0]["stdout"])
    assert summary["processes"] == 2 and summary["certified"] and results[1]["stdout"] == ""
    assert "  processes                2  (torch.distributed" in format_certificate(summary)


def test_processes_with_different_gate_matrices_of_the_gated_family(tmp_path, arrays):
    X, y = arrays
    H = np.random.default_rng(1).standard_normal((2, 3, 3))
    one = write_shards(tmp_path / "one", X, y, H=H)
    other = write_shards(tmp_path / "other", X, y, H=H.transpose(0, 2, 1))
    gated = ["--program", "gated_mhsa", *ARGS[2:]]
    refused(tmp_path, [["solve", str(one), *gated], ["solve", str(other), *gated]],
            r"distributed: rank 1 differs from rank 0 in the gates H of gated-ReLU MHSA program \(.* against .* on "
            r"rank 0\); every process must use the same gates")
