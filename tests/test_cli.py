"""The command line: the interface of issue 2, JSON fields, exit codes, and user errors."""
import json
import re
import os
import subprocess
import sys

import cvxpy as cp
import numpy as np
import pytest

from cvxtransformer.cli import main

REQUIRED = ["program", "loss", "form", "solver", "beta", "beta_max", "primal_objective", "dual_objective",
            "duality_gap", "relative_gap", "kkt_stationarity", "kkt_dual_feasibility", "heads_recovered",
            "recovered_objective", "status", "certified", "solve_seconds"]


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4, 3))
    paths = {}
    for name, y in {"scalar": rng.standard_normal(30), "vector": rng.standard_normal((30, 2)),
                    "binary": np.where(rng.standard_normal(30) > 0, 1.0, -1.0),
                    "classes": rng.integers(0, 3, 30), "sequence": rng.standard_normal((30, 4, 2))}.items():
        paths[name] = str(tmp_path / f"{name}.npz")
        np.savez(paths[name], X=X, y=y)
    return paths


def run_json(capsys, argv):
    code = main(argv + ["--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.mark.parametrize("program, loss, kind, shape", [
    (8, "logistic", "binary", (4, 3)), (10, "squared", "vector", (2, 4, 3)),
    (10, "squared", "sequence", (8, 4, 3)), (12, "cross_entropy", "classes", (5, 3, 4, 3))])
@pytest.mark.parametrize("solver", ["clarabel", "scs"])
def test_solve_then_verify(tmp_path, capsys, data, program, loss, kind, shape, solver):
    out = str(tmp_path / "result.npz")
    args = ["--program", str(program), "--loss", loss, "--beta-frac", "0.3"]
    code, summary = run_json(capsys, ["solve", data[kind], *args, "--solver", solver, "--gates", "5",
                                      "--out", out, "--tol", "1e-4"])
    assert code == 0 and all(k in summary for k in REQUIRED) and summary["certified"] is True
    with np.load(out) as f:
        assert f["Z"].shape == shape
        assert f["V"].shape == ((30,) if program == 8 else (30, shape[-3]))
        assert ("U1" in f.files) == (program == 12)
    code, verified = run_json(capsys, ["verify", data[kind], out, *args, "--gates", "5", "--tol", "1e-4"])
    assert code == 0 and verified["certified"]
    assert verified["primal_objective"] == summary["primal_objective"]
    assert verified["relative_gap"] <= 1e-4


def test_verify_reports_an_uncertified_solution(tmp_path, capsys, data):
    out = str(tmp_path / "z.npz")
    np.savez(out, Z=np.ones((2, 4, 3)))
    code, summary = run_json(capsys, ["verify", data["vector"], out, "--program", "10", "--loss", "squared",
                                      "--beta", "1.0"])
    assert code == 1 and summary["certified"] is False and summary["relative_gap"] > 1e-3


def test_human_readable_output(capsys, data):
    assert main(["solve", data["scalar"], "--program", "8", "--loss", "squared", "--beta-frac", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "CERTIFIED" in out and "duality gap" in out and "heads recovered" in out


@pytest.mark.parametrize("argv, match", [
    (["solve", "MISSING.npz", "--program", "8", "--loss", "squared", "--beta", "1"], r"DATA: file 'MISSING.npz' not found"),
    (["solve", "{text}", "--program", "8", "--loss", "squared", "--beta", "1"], r"DATA: .* is not a readable .npz file"),
    (["solve", "{noy}", "--program", "8", "--loss", "squared", "--beta", "1"], r"DATA: .* has no array 'y'"),
    (["solve", "{nan}", "--program", "8", "--loss", "squared", "--beta", "1"], r"X: expected finite values"),
    (["solve", "{scalar}", "--program", "8", "--loss", "squared", "--beta", "0"], r"--beta: expected a number > 0"),
    (["solve", "{scalar}", "--program", "8", "--loss", "squared", "--beta", "-2"], r"--beta: expected a number > 0"),
    (["solve", "{scalar}", "--program", "8", "--loss", "logistic", "--beta", "1"], r"y: expected labels in \{-1, \+1\}"),
    (["solve", "{vector}", "--program", "8", "--loss", "squared", "--beta", "1"], r"y: expected shape \(N,\) for program \(8\)"),
    (["solve", "{scalar}", "--program", "8", "--loss", "squared", "--beta", "1", "--solver", "mosek"], r"--solver: invalid choice"),
    (["solve", "{empty}", "--program", "8", "--loss", "squared", "--beta", "1"], r"X: expected non-empty"),
])
def test_user_errors_exit_2_with_one_line_and_no_file(tmp_path, capsys, data, argv, match):
    rng = np.random.default_rng(0)
    files = dict(data)
    files["text"] = str(tmp_path / "text.npz")
    open(files["text"], "w").write("not an npz")
    files["noy"] = str(tmp_path / "noy.npz")
    np.savez(files["noy"], X=rng.standard_normal((5, 2, 2)))
    files["nan"] = str(tmp_path / "nan.npz")
    np.savez(files["nan"], X=np.full((5, 2, 2), np.nan), y=np.zeros(5))
    files["empty"] = str(tmp_path / "empty.npz")
    np.savez(files["empty"], X=np.zeros((0, 2, 2)), y=np.zeros(0))
    out = tmp_path / "result.npz"
    argv = [a.format(**files) for a in argv] + ["--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("cvxtransformer solve: error: ")
    assert re.search(match, err), err
    assert not out.exists() and not any(p.suffix == ".tmp" for p in tmp_path.iterdir())


def test_missing_dependency_and_failing_solver(tmp_path, capsys, data, monkeypatch):
    out = tmp_path / "r.npz"
    base = ["solve", data["scalar"], "--program", "8", "--loss", "squared", "--beta-frac", "0.5", "--out", str(out)]
    monkeypatch.setattr(cp, "installed_solvers", lambda: ["SCS"])
    assert main(base) == 2
    assert "clarabel is not installed; pip install clarabel" in capsys.readouterr().err
    monkeypatch.undo()

    def fail(self, *a, **k):
        raise cp.error.SolverError("boom")

    from cvxpy.reductions.solvers.solving_chain import SolvingChain

    monkeypatch.setattr(SolvingChain, "solve_via_data", fail)  # the solver's call (after CVXPY's compilation)
    assert main(base + ["--solver", "scs"]) == 2
    assert "solver: scs failed" in capsys.readouterr().err
    assert not out.exists()


def test_verify_shape_mismatch(tmp_path, capsys, data):
    out = str(tmp_path / "z.npz")
    np.savez(out, Z=np.ones((4, 3)))
    assert main(["verify", data["vector"], out, "--program", "10", "--loss", "squared", "--beta", "1"]) == 2
    assert "RESULT: Z has shape (4, 3), program (10) on this data needs (2, 4, 3)" in capsys.readouterr().err


@pytest.mark.slow
def test_entry_point_runs_without_traceback(tmp_path, data):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    bad = subprocess.run([sys.executable, "-m", "cvxtransformer", "solve", data["scalar"], "--program", "8",
                          "--loss", "squared", "--beta", "0"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "beta" in bad.stderr
    demo = subprocess.run([sys.executable, "-m", "cvxtransformer", "demo", "--json"], capture_output=True,
                          text=True, env=env)
    assert demo.returncode == 0, demo.stderr
    summary = json.loads(demo.stdout.strip().splitlines()[-1])
    assert summary["certified"] and summary["relative_gap"] <= 1e-6


def test_help_is_fast_lists_every_command_and_imports_no_heavy_package():
    code = ("import sys; from cvxtransformer.cli import main; code = main(['--help']); "
            "print(code, sorted(m for m in ('numpy', 'torch', 'cvxpy', 'scipy', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 []"
    listing = subprocess.run([sys.executable, "-m", "cvxtransformer", "--help"], capture_output=True, text=True)
    assert listing.returncode == 0
    for name in ("solve", "verify", "demo", "compare", "grok", "grok-suite", "kernel", "spectral"):
        assert re.search(rf"^\s+{re.escape(name)}\s", listing.stdout, re.M), name
