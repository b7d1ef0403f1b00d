"""What a new user touches first (issue 16), one test group per numbered item: exit codes, one-line
errors, options that are checked or passed on, file modes under the umask, no half-written files,
safe .npz loading, help and documentation."""
import argparse
import errno
import io
import json
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import cvxpy as cp
import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.cli import COMMANDS, build_parser, main
from cvxtransformer.core import io as ctio
from cvxtransformer.core.errors import InvalidInputError

ROOT = Path(__file__).resolve().parents[1]
CORE = ["--program", "10", "--loss", "squared"]


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4, 3))
    paths = {}
    for name, y in {"scalar": rng.standard_normal(30), "vector": rng.standard_normal((30, 2))}.items():
        paths[name] = str(tmp_path / f"{name}.npz")
        np.savez(paths[name], X=X, y=y)
    return paths


@pytest.fixture
def umask():
    """Set the process umask for one test; restore it after."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, command, match):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    prefix = f"cvxtransformer {command}: error: " if command else "cvxtransformer: error: "
    assert lines[0].startswith(prefix), lines[0]
    assert re.search(match, lines[0]), lines[0]


def leftovers(folder):
    """Files that a failed write may have left: temporary files (any name ending .tmp)."""
    return [p.name for p in Path(folder).rglob("*") if p.name.endswith(".tmp")]


# ----------------------------------------------------------------------------- 1. solve --out
UNWRITABLE = [
    ("missing/r.npz", r"--out: folder '.*missing' does not exist; create it or pass another path"),
    ("a_folder", r"--out: '.*a_folder' is a folder; pass a file name"),
    ("a_file/r.npz", r"--out: '.*a_file' is a file, not a folder; pass another path"),
    pytest.param("/proc/r.npz", r"--out: cannot create a file in folder '/proc'",
                 marks=pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")),
    pytest.param("read_only/r.npz", r"--out: cannot create a file in folder '.*read_only' \(Permission denied\)",
                 marks=pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits (the /proc "
                                                                    "case covers a place nobody can write)")),
]


@pytest.mark.parametrize("out, match", UNWRITABLE)
def test_solve_checks_out_before_solving(tmp_path, capsys, data, monkeypatch, out, match):
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "read_only").mkdir(mode=0o555)
    monkeypatch.chdir(tmp_path)

    def never(*args, **kwargs):
        raise AssertionError("the solver ran before --out was checked")

    monkeypatch.setattr("cvxtransformer.solving.solve", never)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, out_text, err = run(capsys, ["solve", data["vector"], *CORE, "--beta", "1", "--out", out])
    assert_one_line_error(code, err, "solve", match)
    assert out_text == "" and sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_write_that_fails_after_the_solve_is_one_line_and_leaves_the_old_file(tmp_path, capsys, data,
                                                                                 monkeypatch):
    out = tmp_path / "r.npz"
    out.write_bytes(b"the previous result")

    def disk_full(f, **arrays):
        f.write(b"half of a file")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "savez", disk_full)
    code, _, err = run(capsys, ["solve", data["vector"], *CORE, "--beta-frac", "0.3", "--out", str(out)])
    assert_one_line_error(code, err, "solve", r"cannot write '.*r\.npz' \(No space left on device\)")
    assert out.read_bytes() == b"the previous result" and not leftovers(tmp_path)


# ----------------------------------------------------------------------------- 2. --tol
@pytest.mark.parametrize("value", ["5", "1", "0", "-1", "nan", "inf", "1e-6x"])
@pytest.mark.parametrize("command", ["solve", "verify", "demo", "compare"])
def test_tol_outside_0_1_is_a_usage_error(tmp_path, capsys, data, command, value):
    argv = {"solve": ["solve", data["vector"], *CORE, "--beta", "1"],
            "verify": ["verify", data["vector"], data["vector"], *CORE, "--beta", "1"],
            "demo": ["demo"],
            "compare": ["compare", data["vector"], *CORE, "--beta", "1", "--out-dir", str(tmp_path / "o")]}[command]
    code, _, err = run(capsys, argv + ["--tol", value])
    assert_one_line_error(code, err, command,
                          r"argument --tol: expected a (relative gap in \(0, 1\)|finite number|number)")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("tol", [5, 1, 0, -1e-6, float("nan"), True, "1e-6"])
def test_tol_of_the_python_api(tol):
    X = np.random.default_rng(0).standard_normal((20, 3, 2))
    problem = ct.make_problem(X, X[:, 0, 0], program=8, beta=0.5)
    for call in (lambda: ct.solve(problem, tol=tol), lambda: ct.certify(problem, problem.zeros(), tol=tol)):
        with pytest.raises(InvalidInputError, match=r"^tol: expected a relative gap in \(0, 1\), e\.g\. 1e-6, got "):
            call()


def test_solver_warnings_go_into_the_status_not_onto_stderr(capsys, data, recwarn):
    code, out, err = run(capsys, ["solve", data["vector"], *CORE, "--beta-frac", "0.3", "--solver", "scs",
                                  "--max-iter", "3", "--no-refine", "--json"])
    summary = json.loads(out)
    assert code == 1 and summary["certified"] is False and err == ""
    assert summary["status"].startswith(("optimal_inaccurate", "user_limit")), summary["status"]
    assert "Solution may be inaccurate" in summary["status"]
    assert not [w for w in recwarn if "inaccurate" in str(w.message)]


# ----------------------------------------------------------------------------- 3. Python API, docstrings
def test_recover_weights_takes_the_problem_and_the_program_shape():
    X = np.random.default_rng(1).standard_normal((30, 4, 3))
    problem = ct.make_problem(X, X[:, 1, :2], program=10, beta=1.0)
    problem = problem.with_beta(0.2 * problem.beta_max())
    result = ct.solve(problem)
    heads = ct.recover_weights(problem, result.Z)
    nonzero = int(np.count_nonzero(np.linalg.norm(result.Z, axis=-1)))
    assert result.Z.shape == (2, 4, 3) and heads.heads == nonzero == result.certificate.support_size
    assert ct.nonconvex_objective(problem, heads) == pytest.approx(problem.primal_objective(result.Z), rel=1e-10)
    with pytest.raises(InvalidInputError, match=r"Z: expected shape \(2, 4, 3\) for program \(10\), got "
                                                 r"shape \(4, 3\)"):
        ct.recover_weights(problem, result.Z[0])
    with pytest.raises(InvalidInputError, match=r"problem: expected a ConvexProblem from make_problem, got ndarray"):
        ct.recover_weights(result.Z, problem)


def test_docstring_examples_and_the_readme_snippet_run_in_the_tests():
    """pytest runs every docstring example of the package (--doctest-modules on its testpaths);
    tests/test_readme.py runs the README's Python blocks."""
    import doctest

    pytest.importorskip("sklearn", reason="cvxtransformer.estimators needs scikit-learn")
    import cvxtransformer.estimators
    import cvxtransformer.solving
    import cvxtransformer.verify

    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'addopts = "[^"]*--doctest-modules', text)
    assert re.search(r'testpaths = \[[^]]*"cvxtransformer"[^]]*"solvers"', text)
    finder = doctest.DocTestFinder()
    examples = {t.name for module in (cvxtransformer.solving, cvxtransformer.verify, cvxtransformer.estimators)
                for t in finder.find(module) if t.examples}
    assert {"cvxtransformer.solving.solve", "cvxtransformer.verify.certify", "cvxtransformer.estimators"} <= examples
    assert "def test_python_snippets_run" in (ROOT / "tests" / "test_readme.py").read_text()


# ----------------------------------------------------------------------------- 4. modes, atomic writes
def write_all(folder):
    """One file by each writer of core/io.py, and a certified result."""
    import matplotlib.pyplot as plt

    ctio.save_npz(folder / "a.npz", x=np.arange(3))
    ctio.write_json(folder / "a.json", {"x": 1.0})
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    ctio.save_figure(fig, folder / "a.png")
    X = np.random.default_rng(0).standard_normal((10, 3, 2))
    ct.solve(ct.make_problem(X, X[:, 0, :], program=10, beta=0.5)).save(folder / "result.npz")
    return ["a.npz", "a.json", "a.png", "result.npz"]


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o027])
def test_written_files_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    names = write_all(tmp_path)
    for name in names:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask, name
    folder = ctio.prepare_out_dir(tmp_path / "new" / "sub")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o777 & ~mask
    assert not leftovers(tmp_path)


def test_rewriting_a_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "private.json"
    path.write_text("{}")
    path.chmod(0o600)
    ctio.write_json(path, {"new": True})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and json.loads(path.read_text()) == {"new": True}


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_solve_out_follows_the_umask(tmp_path, capsys, data, umask, mask):
    umask(mask)
    out = tmp_path / "r.npz"
    code, _, _ = run(capsys, ["solve", data["vector"], *CORE, "--beta-frac", "0.3", "--out", str(out)])
    assert code == 0 and stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask


@pytest.mark.slow
def test_experiment_outputs_follow_the_umask(tmp_path, capsys, umask):
    """grok writes JSON, .npz and PNG files through core/io; 0o027 tells them from 0o600 and 0o644."""
    umask(0o027)
    out = tmp_path / "grok"
    assert main(["grok", "--quick", "--modulus", "7", "--steps", "4", "--out-dir", str(out), "--json"]) == 0
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} >= {".json", ".npz", ".png"}
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o640, p
    assert stat.S_IMODE(out.stat().st_mode) == 0o750 and not leftovers(tmp_path)


def failing_writers():
    import matplotlib.pyplot as plt

    def in_body(exc):
        def write(path):
            with ctio.atomic_open(path) as f:
                f.write(b"half")
                raise exc
        return write

    def figure(path):
        fig, ax = plt.subplots()
        fig.savefig = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("renderer failed"))
        try:
            ctio.save_figure(fig, path)
        finally:
            assert not plt.fignum_exists(fig.number)  # closed even on failure

    def disk_full(path):
        def savez(f, **arrays):
            f.write(b"half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real, np.savez = np.savez, savez
        try:
            ctio.save_npz(path, x=np.zeros(3))
        finally:
            np.savez = real

    return {"error in the body": (in_body(RuntimeError("boom")), RuntimeError),
            "interrupted": (in_body(KeyboardInterrupt()), KeyboardInterrupt),
            "figure": (figure, RuntimeError),
            "not JSON": (lambda path: ctio.write_json(path, {"x": object()}), TypeError),
            "disk full": (disk_full, InvalidInputError)}


@pytest.mark.parametrize("case", list(failing_writers()))
@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_write_leaves_no_file_and_no_temporary_file(tmp_path, case, existing):
    write, error = failing_writers()[case]
    path = tmp_path / "out.bin"
    if existing:
        path.write_bytes(b"old content")
    with pytest.raises(error):
        write(path)
    assert (path.read_bytes() == b"old content") if existing else not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out.bin"] if existing else [])


# ----------------------------------------------------------------------------- 5. corrupt .npz
def corrupt_files(folder):
    buf = io.BytesIO()
    np.savez_compressed(buf, X=np.random.default_rng(0).standard_normal((30, 4, 3)), y=np.zeros(30))
    good = buf.getvalue()
    files = {"truncated": good[: len(good) // 2], "random bytes": bytes(range(256)) * 4, "empty": b""}
    damaged = bytearray(good)
    damaged[200:230] = bytes(30)  # inside the deflated data of X
    files["damaged deflate"] = bytes(damaged)
    with zipfile.ZipFile(folder / "zip.npz", "w") as z:
        z.writestr("notes.txt", "a zip, but not of .npy files")
    files["zip of text"] = (folder / "zip.npz").read_bytes()
    np.savez(folder / "objects.npz", X=np.array([{"a": 1}], dtype=object))
    files["object arrays"] = (folder / "objects.npz").read_bytes()
    for name, raw in files.items():
        (folder / f"{name}.npz").write_bytes(raw)
    return {name: folder / f"{name}.npz" for name in files}


def test_a_corrupt_npz_never_suggests_unpickling(tmp_path, capsys, data):
    for name, path in corrupt_files(tmp_path).items():
        with pytest.raises(InvalidInputError) as info:
            ctio.load_npz(path, "DATA", ("X", "y"))
        message = str(info.value)
        assert "pickle" not in message.lower(), (name, message)
        assert re.match(r"DATA: '.*' (is not a readable \.npz file \((corrupt or not in the \.npz format|it holds "
                        r"object arrays, which are not loaded|it is empty|not in the \.npz format: it looks like "
                        r"another binary format)\); write it with numpy\.savez|has no array 'X' \(it "
                        r"holds \['notes.txt'\]\))", message), message
        code, _, err = run(capsys, ["solve", str(path), *CORE, "--beta", "1"])
        assert_one_line_error(code, err, "solve", r"DATA: .* (is not a readable \.npz file|has no array 'X')")
        code, _, err = run(capsys, ["verify", data["vector"], str(path), *CORE, "--beta", "1"])
        assert_one_line_error(code, err, "verify", r"RESULT: .* (is not a readable \.npz file|has no array 'Z')")


def test_randomly_damaged_npz_files_load_or_give_the_message(tmp_path):
    rng = np.random.default_rng(1)
    for writer in (np.savez, np.savez_compressed):
        buf = io.BytesIO()
        writer(buf, X=rng.standard_normal((5, 3)), y=np.arange(5))
        good = buf.getvalue()
        for trial in range(150):
            raw = bytearray(good)
            if trial % 2:
                raw = raw[: rng.integers(0, len(raw))]
            else:
                for i in rng.integers(0, len(raw), 3):
                    raw[i] = rng.integers(0, 256)
            path = tmp_path / "f.npz"
            path.write_bytes(bytes(raw))
            try:
                ctio.load_npz(path, "DATA")
            except InvalidInputError as exc:
                assert "pickle" not in str(exc).lower()


# ----------------------------------------------------------------------------- 6. options passed on or refused
@pytest.mark.parametrize("solver, expected", [("clarabel", {"max_iter": 7, "time_limit": 2.5}),
                                              ("scs", {"max_iters": 7, "time_limit_secs": 2.5})])
def test_max_iter_and_time_limit_reach_the_solver(capsys, data, monkeypatch, solver, expected):
    """The solver gets the iteration budget, and the time left of the limit (issue 44: the build and CVXPY's
    compilation count in it; here they take milliseconds)."""
    from cvxpy.reductions.solvers.solving_chain import SolvingChain

    seen = {}
    real = SolvingChain.solve_via_data

    def record(self, problem, data, warm_start=False, verbose=False, solver_opts=None):
        seen.update(solver_opts)
        return real(self, problem, data, warm_start, verbose, solver_opts)

    monkeypatch.setattr(SolvingChain, "solve_via_data", record)
    run(capsys, ["solve", data["vector"], *CORE, "--beta-frac", "0.3", "--solver", solver, "--max-iter", "7",
                 "--time-limit", "2.5", "--json"])
    limit = next(k for k in expected if k.startswith("time"))
    assert {k: seen[k] for k in expected if k != limit} == {k: v for k, v in expected.items() if k != limit}
    assert 2.0 < seen[limit] <= 2.5


def test_max_iter_stops_clarabel(capsys, data):
    code, out, _ = run(capsys, ["solve", data["vector"], *CORE, "--beta-frac", "0.3", "--max-iter", "1", "--json"])
    summary = json.loads(out)
    assert code == 1 and summary["iterations"] == 1 and summary["certified"] is False
    assert summary["relative_gap"] > 1e-3 and summary["status"].startswith("user_limit")


@pytest.mark.parametrize("command", ["solve", "verify", "compare"])
def test_classes_only_with_cross_entropy(tmp_path, capsys, data, command):
    result = tmp_path / "z.npz"
    np.savez(result, Z=np.zeros((2, 4, 3)))
    argv = {"solve": ["solve", data["vector"]], "verify": ["verify", data["vector"], str(result)],
            "compare": ["compare", data["vector"], "--out-dir", str(tmp_path / "o")]}[command]
    code, _, err = run(capsys, argv + [*CORE, "--beta", "1", "--classes", "3"])
    assert_one_line_error(code, err, command, r"--classes: only for --loss cross_entropy, got --loss squared")


@pytest.mark.parametrize("arrays, match", [
    ({"Z": np.zeros((2, 4, 3)), "V": np.zeros((3, 3))}, r"RESULT: V: expected shape \(30, 2\)"),
    ({"Z": np.zeros((2, 4, 3)), "V": np.full((30, 2), np.nan)}, r"RESULT: V: expected finite values"),
    ({"Z": np.zeros((4, 3))}, r"RESULT: Z has shape \(4, 3\), program \(10\) on this data needs \(2, 4, 3\)"),
    ({"Z": np.zeros((2, 4, 3)), "U1": np.zeros((2, 4))},
     r"RESULT: it holds only U1 of the gate arrays U1, U2 \(program \(12\)\)"),
])
def test_verify_refuses_what_it_cannot_use(tmp_path, capsys, data, arrays, match):
    result = tmp_path / "r.npz"
    np.savez(result, **arrays)
    code, _, err = run(capsys, ["verify", data["vector"], str(result), *CORE, "--beta", "1"])
    assert_one_line_error(code, err, "verify", match)


def test_verify_says_when_the_stored_beta_differs(tmp_path, capsys, data):
    out = tmp_path / "r.npz"
    assert run(capsys, ["solve", data["vector"], *CORE, "--beta-frac", "0.3", "--out", str(out)])[0] == 0
    stored = float(np.load(out)["beta"])
    code, text, err = run(capsys, ["verify", data["vector"], str(out), *CORE, "--beta", "1"])
    assert code == 1 and "verdict                  NOT CERTIFIED" in text
    assert "solver status            none (a given Z)" in text and "verified" not in text
    assert err.strip() == (f"cvxtransformer verify: note: RESULT was solved at beta = {stored:.10g}; certifying at "
                           "beta = 1 (from --beta/--beta-frac)")
    code, text, err = run(capsys, ["verify", data["vector"], str(out), *CORE, "--beta", "1", "--json"])
    summary = json.loads(text)
    assert summary["result_beta"] == stored and summary["beta"] == 1 and summary["status"] == "none (a given Z)"
    code, text, err = run(capsys, ["verify", data["vector"], str(out), *CORE, "--beta-frac", "0.3", "--json"])
    assert code == 0 and err == "" and json.loads(text)["certified"] is True


def test_torch_options_only_with_fista(capsys, data):
    for option in (["--device", "cpu"], ["--dtype", "float32"], ["--progress"]):
        code, _, err = run(capsys, ["solve", data["vector"], *CORE, "--beta", "1", "--solver", "clarabel", *option])
        assert_one_line_error(code, err, "solve", rf"{option[0]}: only for --solver fista, got --solver clarabel")
    code, out, _ = run(capsys, ["solve", data["vector"], *CORE, "--beta", "1", "--dtype", "float32", "--tol", "1e-4"])
    assert "solver fista (auto: option dtype is the torch backend's)" in out  # --solver auto, the default


# ----------------------------------------------------------------------------- 7. one-line usage errors
def test_usage_errors_are_one_line_for_every_command(capsys):
    for name in COMMANDS:
        for argv in ([name, "--no-such-option"], [name, "--help-me"]):
            code, _, err = run(capsys, argv)
            assert_one_line_error(code, err, name, rf"\(see cvxtransformer {re.escape(name)} --help\)$")
    for argv, match in (([], "the following arguments are required: COMMAND"),
                        (["bogus"], "invalid choice: 'bogus'"),
                        (["--bogus"], "the following arguments are required: COMMAND")):
        code, _, err = run(capsys, argv)
        assert_one_line_error(code, err, None, match)


@pytest.mark.parametrize("argv, match", [
    (["solve"], "the following arguments are required: DATA, --program, --loss"),
    (["solve", "d.npz", *CORE], "one of the arguments --beta --beta-frac is required"),
    (["solve", "d.npz", *CORE, "--beta", "1", "--beta-frac", "0.1"], "--beta-frac: not allowed with argument --beta"),
    (["solve", "d.npz", "--program", "9", "--loss", "squared", "--beta", "1"], r"--program: expected one of 8, 10"),
    (["solve", "d.npz", *CORE, "--beta", "inf"], "--beta: expected a finite number, got 'inf'"),
    (["solve", "d.npz", *CORE, "--beta", "1", "--max-iter", "0"], "--max-iter: expected an integer >= 1, got 0"),
    (["solve", "d.npz", *CORE, "--beta", "1", "--time-limit", "-1"], "--time-limit: expected a number > 0"),
    (["solve", "d.npz", *CORE, "--beta", "1", "--form", "both"], "--form: invalid choice: 'both'"),
    (["verify", "d.npz"], "the following arguments are required: RESULT.npz"),
    (["demo", "--seed", "x"], "--seed: expected a number, got 'x'"),
])
def test_usage_errors_name_the_argument(capsys, argv, match):
    code, _, err = run(capsys, argv)
    assert_one_line_error(code, err, argv[0], match)


@pytest.mark.parametrize("command, argv, match", [
    ("compare", ["--out-dir", "{file}"], r"--out-dir: .*an existing file"),
    ("grok", ["--out-dir", "{file}"], r"--out-dir: '.*' is an existing file; pass a folder"),
    ("grok-suite", ["--out-dir", "{file}/sub"], r"--out-dir: cannot create folder"),
    ("kernel", ["--out-dir", "{file}/sub"], r"--out-dir: cannot create folder"),
    ("spectral", ["--out-dir", "{file}"], r"--out-dir: '.*' is an existing file"),
    ("energy", ["--model", "unfolded", "--out-dir", "{file}/sub"], r"--out-dir: cannot create folder"),
    ("energy", ["--model", "bogus", "--out-dir", "{dir}"], r"--model: expected one of 'unfolded', 'standard'"),
    ("grok-suite", ["--settings", "97:x", "--out-dir", "{dir}"], r"--settings: expected items P:L"),
    ("compare", ["--models", "bogus", "--out-dir", "{dir}"], r"--models: expected a comma-separated list"),
    ("compare", ["--heads", "0", "--out-dir", "{dir}"], r"--heads: expected an integer in \[1, 1000000\]"),
])
def test_output_folders_and_options_of_the_other_commands(tmp_path, capsys, data, command, argv, match):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    argv = [a.format(file=a_file, dir=tmp_path / "out") for a in argv]
    if command == "compare":
        argv = [data["vector"], *CORE, "--beta", "1"] + argv
    code, _, err = run(capsys, [command, *argv])
    assert_one_line_error(code, err, command, match)
    assert a_file.read_text() == "x" and not list(tmp_path.rglob("*.json")) and not list(tmp_path.rglob("*.png"))


# ----------------------------------------------------------------------------- 8. help
def test_help_of_every_command_imports_no_heavy_package():
    code = ("import contextlib, io, sys\n"
            "from cvxtransformer.cli import COMMANDS, main\n"
            "for name in [None, *COMMANDS]:\n"
            "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "        code = main(['--help'] if name is None else [name, '--help'])\n"
            "    assert code == 0 and 'usage: cvxtransformer' in out.getvalue(), name\n"
            "heavy = ('torch', 'cvxpy', 'scipy', 'matplotlib', 'sklearn', 'transformers')\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


def _subparsers():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_option_has_help_and_its_default_shown_once():
    for name, parser in _subparsers().items():
        text = parser.format_help()
        for action in parser._actions:
            if action.option_strings and action.help is not argparse.SUPPRESS:
                assert action.help, (name, action.option_strings)
        assert not re.search(r"\(default[^)]*\)\s*\(default", " ".join(text.split())), (name, text)
    solve = " ".join(_subparsers()["solve"].format_help().split())
    for expected in ("8: attention-only, scalar output", "squared (real targets), logistic (labels in {-1, +1})",
                     "primal: the program; dual: its dual", "(default: auto)", "(default: primal)",
                     "(default: 1e-06)", "fista (torch proximal gradient)"):
        assert expected in solve, expected
    assert '"fista"' in ct.solve.__doc__


def test_version(capsys):
    code, out, _ = run(capsys, ["--version"])
    assert code == 0 and out.strip() == f"cvxtransformer {ct.__version__}"


# ----------------------------------------------------------------------------- 9. conventions for users
def test_the_package_cites_docs_conventions_not_spec_md():
    cited = [str(p.relative_to(ROOT)) for folder in ("cvxtransformer", "solvers") for p in (ROOT / folder).rglob("*.py")
             if "SPEC.md" in p.read_text()]
    assert cited == []
    for name, parser in _subparsers().items():
        assert "SPEC.md" not in parser.format_help(), name
    conventions = (ROOT / "docs" / "conventions.md").read_text()
    for heading in ("## Data", "## Losses: summed over samples", "## The group-lasso programs",
                    "## The nuclear-norm program", "## Certificates", "## Recovery of the nonconvex weights"):
        assert heading in conventions, heading


# ----------------------------------------------------------------------------- 10. the torch line
def test_readme_says_how_to_install_the_cpu_build_of_torch():
    readme = (ROOT / "README.md").read_text()
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in readme
    assert "python -m pip install --quiet torch==2.13.0\n" in (ROOT / ".ci" / "run").read_text()


# ----------------------------------------------------------------------------- 11. compare's plots
@pytest.mark.slow
def test_compare_names_and_labels_its_plots_as_the_command_line_does(tmp_path, capsys, data, umask, monkeypatch):
    """One short compare run: legends use the CLI's model names, lines carry no unexplained marker,
    time axes use a LogLocator, attention panels are labelled; its files follow the umask (item 4)."""
    from matplotlib.ticker import LogLocator

    from cvxtransformer.comparison import plots

    figures, real = {}, plots.save_figure

    def capture(fig, path, dpi=120):
        axes = [(ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), ax.get_xscale(),
                 type(ax.xaxis.get_major_locator()), [t.get_text() for t in ax.get_legend().get_texts()]
                 if ax.get_legend() else [], [line.get_marker() for line in ax.get_lines()],
                 bool(ax.get_images())) for ax in fig.axes]
        figures[os.path.basename(path)] = axes
        real(fig, path, dpi)

    monkeypatch.setattr(plots, "save_figure", capture)
    umask(0o027)
    out = tmp_path / "run"
    code, _, err = run(capsys, ["compare", data["vector"], *CORE, "--beta-frac", "0.3", "--steps", "3",
                                "--models", "alternative,softmax", "--out-dir", str(out), "--quiet"])
    assert code == 0, err
    objective = figures["objective.png"]
    for title, xlabel, ylabel, xscale, locator, legend, markers, _ in objective:
        assert title and ylabel and xscale == "log"
        if xlabel == "training time (s)":  # a log time axis with its ticks
            assert locator is LogLocator
            assert all(m in ("None", "", None, "*") for m in markers), markers
            if "*" in markers:  # the convex solve's end (issue #44), explained in the legend
                assert any(entry.endswith(" s") and "solved and certified" in entry for entry in legend), legend
        else:  # objective against step: its only marker is the cross of a collapsed network
            assert xlabel.startswith("step") and all(m in ("None", "", None, "x") for m in markers), markers
        runs = [entry.split(": ")[0] for entry in legend if not entry.startswith("convex")]  # then what bounds it
        assert set(runs) <= {"alternative (9), m = 8", "softmax (3)"}
    assert {"alternative (9), m = 8: bounded by program (10)", "softmax (3): no bound covers it"} <= set(objective[0][5])
    panels = [ax for ax in figures["attention.png"] if ax[7]]
    assert len(panels) == 3 and all(title and xlabel and ylabel for title, xlabel, ylabel, *_ in panels)
    assert [p[0].split(" ")[0] for p in panels] == ["convex", "alternative", "softmax"]
    for p in out.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o640, p


def test_short_runs_get_log_ticks_that_do_not_overlap(monkeypatch):
    import matplotlib.pyplot as plt

    from cvxtransformer.comparison import plots

    kept = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, dpi=120: kept.setdefault("fig", fig))
    t = np.linspace(1e-3, 3e-3, 6)  # a few milliseconds of training: one decade or less
    runs = {"alternative": dict(model="alternative", seconds=t, objective=10 - t, lower_bound=5.0)}
    plots.plot_objective(runs, {10: dict(primal_objective=6.0, dual_objective=6.0)}, "unused.png")
    fig = kept["fig"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [label.get_window_extent(renderer) for label in ax.get_xticklabels()
                 if label.get_visible() and label.get_text()]
        for a, b in zip(boxes, boxes[1:]):
            assert not a.overlaps(b), [label.get_text() for label in ax.get_xticklabels()]
    plt.close(fig)


# ----------------------------------------------------------------------------- 12. docs/compare_example.md
def test_compare_example_promises_equal_numbers_only_on_the_same_machine():
    text = " ".join((ROOT / "docs" / "compare_example.md").read_text().split())
    sentences = [s for s in re.split(r"(?<=\.) ", text) if re.search(r"deterministic|run to run|reproduc", s)]
    assert sentences and all("same machine" in s for s in sentences), sentences
    assert "SPEC.md" not in text
