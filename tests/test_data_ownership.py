"""Issue #33, item 3: exactly the data given.

* A problem owns what it certifies: ``make_problem`` copies the caller's in-memory arrays (X, y, the
  gates) and keeps them read-only; a memory-mapped X is not copied, and a change of its file is
  refused at certify time (its fingerprint).
* A RESULT written by ``solve --out`` names its data (SHA-256 of X and y by shard, and of the gates);
  ``verify`` refuses, in one line naming the part, a RESULT solved on other data, and says when an
  old RESULT without fingerprint could not be checked.
* A distributed solve records each process's rows as that process read them: two processes whose
  copies differ in a row no probe reads give a RESULT that matches the copy that was used.
"""
import hashlib
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.core.fingerprint import fingerprint, fingerprint_rows

from test_data_integrity import write_shards
from test_distributed import launch
from test_user_errors import assert_one_line_error

ARGS = ["--program", "12", "--loss", "squared", "--gates", "3", "--beta-frac", "0.3", "--tol", "1e-8", "--json"]
SOLVE = ["--solver", "fista", "--no-refine"]


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return rng.standard_normal((40, 4, 3)), rng.standard_normal((40, 2))


def fresh_certificate(X, y, **options):
    P = ct.make_problem(X, y, beta=1.0, **options)
    P = P.with_beta(0.3 * P.beta_max())
    return P, ct.certify(P, np.full(P.program.shape, 0.01), refine=False)


# ----------------------------------------------------------------------------- the problem owns its data
@pytest.mark.parametrize("program", [10, 12, "gated_mhsa"])
def test_issue33_changing_the_callers_arrays_after_make_problem_changes_nothing(arrays, program):
    """X changed in place after make_problem was certified with the old gates and beta_max (P 24.5
    where the data given gives 15.7): the problem now certifies the data it was given."""
    X, y = arrays
    rng = np.random.default_rng(1)
    options = {12: dict(program=12, U1=rng.standard_normal((3, 4)), U2=rng.standard_normal((3, 3))),
               "gated_mhsa": dict(program="gated_mhsa", H=rng.standard_normal((2, 3, 3)))}.get(program, {"program": 10})
    y = X[:, :, :2].copy() if program == "gated_mhsa" else y
    kept = {k: np.array(v) for k, v in dict(X=X, y=y, **options).items() if isinstance(v, np.ndarray)}
    P, before = fresh_certificate(X, y, **options)
    X *= 3.0                                                   # the caller's arrays, changed in place
    y += 1.0
    for v in options.values():
        if isinstance(v, np.ndarray):
            v *= -1.0
    after = ct.certify(P, np.full(P.program.shape, 0.01), refine=False)
    _, fresh = fresh_certificate(kept["X"], kept["y"], **{k: kept.get(k, v) for k, v in options.items()})
    for cert in (before, after):
        assert cert.primal_objective == fresh.primal_objective and cert.dual_objective == fresh.dual_objective
    np.testing.assert_array_equal(P.program.X, kept["X"])
    for name, a in dict(X=P.program.X, T=P.T, **P.program.gate_arrays()).items():
        assert not a.flags.writeable, name
        with pytest.raises(ValueError, match="read-only"):
            a[(0,) * a.ndim] = 0.0


def test_issue33_a_converted_array_is_not_copied_twice(arrays):
    X, y = arrays
    X32 = X.astype(np.float32)
    P = ct.make_problem(X32, y, program=10, beta=1.0)
    assert P.program.X.flags.owndata and P.program.X.dtype == np.float64   # the conversion, no second copy
    X32[0] = 100.0
    assert np.array_equal(P.program.X, X32.astype(np.float64)) is False


def test_issue33_a_memory_map_is_not_copied_and_a_change_of_its_file_is_refused(tmp_path, arrays):
    X, y = arrays
    np.save(tmp_path / "X.npy", X)
    for mode in ("r", "r+"):
        Xm = np.load(tmp_path / "X.npy", mmap_mode=mode)
        P = ct.make_problem(Xm, y, program=10, beta=1.0)
        assert isinstance(P.program.X, np.memmap) and not P.program.X.flags.writeable
        assert (P.program.X is Xm) == (mode == "r")            # a read-only map is kept as it is
        P = P.with_beta(0.3 * P.beta_max())
        Z = np.full(P.program.shape, 0.01)
        cert = ct.certify(P, Z, refine=False)
        assert cert.primal_objective == fresh_certificate(X, y, program=10)[1].primal_objective
        writer = np.load(tmp_path / "X.npy", mmap_mode="r+")   # another process rewrites a row of the file
        writer[5] += 1.0
        writer.flush()
        with pytest.raises(ct.InvalidInputError, match=r"X: expected the memory-mapped data the problem was built "
                                                       r"on, got a file whose content changed since"):
            ct.certify(P, Z, refine=False)
        writer[5] = X[5]
        writer.flush()
        assert ct.certify(P, Z, refine=False).primal_objective == cert.primal_objective
    np.save(tmp_path / "y.npy", y)                             # mapped targets (squared loss: T is a view)
    P = ct.make_problem(X, np.load(tmp_path / "y.npy", mmap_mode="r"), program=10, beta=1.0)
    writer = np.load(tmp_path / "y.npy", mmap_mode="r+")
    writer[0] = 7.0
    writer.flush()
    with pytest.raises(ct.InvalidInputError, match="y: expected the memory-mapped data the problem was built on"):
        ct.certify(P, np.zeros(P.program.shape), refine=False)


def test_issue33_fingerprint_is_sha256_of_dtype_shape_and_bytes_in_chunks(tmp_path, monkeypatch):
    from cvxtransformer.core import fingerprint as module

    a = np.random.default_rng(0).standard_normal((50, 3, 2))
    expected = hashlib.sha256(b"<f8(50, 3, 2);" + a.tobytes()).hexdigest()
    assert fingerprint(a) == expected
    monkeypatch.setattr(module, "CHUNK_BYTES", 100)            # many chunks, and a memory map
    np.save(tmp_path / "a.npy", a)
    assert fingerprint(np.load(tmp_path / "a.npy", mmap_mode="r")) == fingerprint(a[:, :, ::-1][:, :, ::-1]) == expected
    assert fingerprint(a.astype(np.float32)) != expected and fingerprint(a.reshape(25, 6, 2)) != expected
    assert fingerprint_rows([a[:7], a[7:30], a[30:]]) == expected != fingerprint_rows([a[:7], a[8:]])


# ----------------------------------------------------------------------------- RESULT names its data
def cli(*argv):
    err = io.StringIO()
    with redirect_stdout(io.StringIO()) as out, redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("part", ["X", "y", "U2"])
def test_issue33_verify_refuses_a_result_solved_on_other_data_naming_the_part(tmp_path, arrays, part):
    X, y = arrays
    rng = np.random.default_rng(1)
    gates = dict(U1=rng.standard_normal((3, 4)), U2=rng.standard_normal((3, 3)))
    np.savez(tmp_path / "d.npz", X=X, y=y, **gates)
    result = tmp_path / "r.npz"
    assert cli("solve", str(tmp_path / "d.npz"), *ARGS, *SOLVE, "--out", str(result))[0] == 0
    stored = json.loads(str(np.load(result)["fingerprint"]))
    assert stored["pieces"] == [{"rows": [0, 40], "X": fingerprint(X), "y": fingerprint(y)}]
    assert stored["N"] == 40 and stored["gates"] == fingerprint(gates["U1"], gates["U2"])
    code, out, err = cli("verify", str(tmp_path / "d.npz"), str(result), *ARGS)
    assert code == 0 and err == "" and json.loads(out)["data_fingerprint"].startswith("checked")
    changed = dict(X=X.copy(), y=y.copy(), **{k: v.copy() for k, v in gates.items()})
    changed[part][-1] += 1e-12 * (1 + np.abs(changed[part][-1]))      # the last row, a rounding's worth
    np.savez(tmp_path / "e.npz", **changed)
    code, out, err = cli("verify", str(tmp_path / "e.npz"), str(result), *ARGS)
    match = (r"RESULT: it was solved with other gates: U1, U2 \(DATA\) differ" if part == "U2" else
             rf"RESULT: it was solved on other data: {part} differs from DATA's \(SHA-256 fingerprint\); verify")
    assert_one_line_error(code, err, "verify", match)
    assert out == ""


def test_issue33_verify_names_the_shard_that_differs(tmp_path, arrays):
    X, y = arrays
    data = write_shards(tmp_path / "data", X, y, 4)
    result = tmp_path / "r.npz"
    assert cli("solve", str(data), *ARGS, *SOLVE, "--out", str(result))[0] == 0
    assert [p["rows"] for p in json.loads(str(np.load(result)["fingerprint"]))["pieces"]] == [[0, 10], [10, 20],
                                                                                              [20, 30], [30, 40]]
    assert cli("verify", str(data), str(result), *ARGS)[0] == 0
    np.savez(tmp_path / "whole.npz", X=X, y=y)                # the same rows, not sharded: the same data
    assert cli("verify", str(tmp_path / "whole.npz"), str(result), *ARGS)[0] == 0
    regrouped = write_shards(tmp_path / "regrouped", X, y, 3)  # shards of 14, 13, 13 rows
    assert cli("verify", str(regrouped), str(result), *ARGS)[0] == 0
    X2 = np.load(regrouped / "s1" / "X.npy")
    X2[0, 0, 0] += 1.0                                        # row 14: in RESULT's piece of rows 10:20
    np.save(regrouped / "s1" / "X.npy", X2)
    code, _, err = cli("verify", str(regrouped), str(result), *ARGS)
    assert_one_line_error(code, err, "verify", r"RESULT: it was solved on other data: X of shards 0 "
                                              r"\('.*regrouped/s0', rows 10:14\), 1 \('.*regrouped/s1', rows 0:6\) "
                                              r"differs from DATA's")
    y2 = np.load(data / "s2" / "y.npy")
    y2[3, 1] = -y2[3, 1]
    np.save(data / "s2" / "y.npy", y2)
    code, _, err = cli("verify", str(data), str(result), *ARGS)
    assert_one_line_error(code, err, "verify", r"RESULT: it was solved on other data: y of shard 2 \('.*data/s2'\) "
                                              r"differs from DATA's")
    (data / "s3" / "X.npy").unlink()
    np.save(data / "s3" / "X.npy", X[30:38])                  # a shard of another length
    np.save(data / "s3" / "y.npy", y[30:38])
    code, _, err = cli("verify", str(data), str(result), *ARGS)
    assert_one_line_error(code, err, "verify", r"RESULT: it was solved on other data: 40 rows, DATA has 38; ")


def test_issue33_a_result_without_fingerprint_still_verifies_and_says_so(tmp_path, arrays):
    X, y = arrays
    np.savez(tmp_path / "d.npz", X=X, y=y)
    result = tmp_path / "r.npz"
    assert cli("solve", str(tmp_path / "d.npz"), *ARGS, *SOLVE, "--out", str(result))[0] == 0
    old = {k: v for k, v in np.load(result).items() if k != "fingerprint"}
    np.savez(tmp_path / "old.npz", **old)
    code, out, err = cli("verify", str(tmp_path / "d.npz"), str(tmp_path / "old.npz"), *ARGS)
    assert code == 0 and json.loads(out)["certified"]
    assert err.strip() == ("cvxtransformer verify: note: RESULT holds no data fingerprint (written by an older "
                           "version, or not by solve --out): it could not be checked that DATA is the data it was "
                           "solved on")
    assert json.loads(out)["data_fingerprint"].startswith("not checked")
    np.savez(tmp_path / "bad.npz", **old, fingerprint=np.array("{not json"))
    code, _, err = cli("verify", str(tmp_path / "d.npz"), str(tmp_path / "bad.npz"), *ARGS)
    assert_one_line_error(code, err, "verify", "RESULT: its fingerprint is not one that cvxtransformer solve writes")


# ----------------------------------------------------------------------------- distributed
def _solve_on_each_rank(rank, argvs):
    return dict(zip(("code", "stdout", "stderr"), cli(*argvs[rank])))


@pytest.mark.slow
@pytest.mark.parametrize("shards", [2, 3])
def test_issue33_distributed_result_records_the_rows_each_process_read(tmp_path, arrays, shards):
    """Two copies differ in row 21, which no probe of the processes' check reads: both processes
    solve (rank 1 on its copy), and RESULT names the data that was used: rank 0's rows of one copy
    and rank 1's of the other. verify on the copy rank 0 read names the shard that differs."""
    X, y = arrays
    one = write_shards(tmp_path / "one", X, y, shards)
    other_X = X.copy()
    other_X[21, 2, 1] += 0.5
    other = write_shards(tmp_path / "other", other_X, y, shards)
    result = tmp_path / "r.npz"
    argvs = [["solve", str(folder), *ARGS, *SOLVE, "--distributed", "--out", str(result)] for folder in (one, other)]
    results, codes, _ = launch(tmp_path, 2, _solve_on_each_rank, argvs, timeout=30, join=180)
    assert codes == [0, 0] and [results[r]["code"] for r in (0, 1)] == [0, 0], results
    pieces = json.loads(str(np.load(result)["fingerprint"]))["pieces"]
    assert sum(e - s for s, e in (p["rows"] for p in pieces)) == 40
    # 2 shards: one a process; 3 shards (14, 13, 13 rows): rank 1 read rows 6:13 of shard 1, and shard 2
    where = r"X of shard 1 \('.*one/s1'" + ("" if shards == 2 else ", rows 6:13") + r"\)"
    code, _, err = cli("verify", str(one), str(result), *ARGS)
    assert_one_line_error(code, err, "verify", rf"RESULT: it was solved on other data: {where} differs from DATA's")
    code, out, err = cli("verify", str(other), str(result), *ARGS)
    assert code == 0 and err == "" and json.loads(out)["data_fingerprint"].startswith("checked"), err


def test_read_only_arrays_reach_torch_without_a_copy_or_a_warning(monkeypatch):
    """A problem's read-only arrays become tensors that share their memory, with no warning said (torch says one
    per process about read-only arrays: silenced); once it has been said, no warnings context is entered."""
    import warnings

    from cvxtransformer.core import arrays
    a = np.arange(6.0)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = arrays.from_numpy(a)
        assert t.data_ptr() == a.ctypes.data and t.tolist() == a.tolist()
        assert arrays._READ_ONLY_SAID == [True]
        monkeypatch.setattr(warnings, "catch_warnings", None)  # entered again: a TypeError
        assert arrays.from_numpy(a).data_ptr() == a.ctypes.data
