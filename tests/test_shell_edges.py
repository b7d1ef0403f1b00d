"""The shell's remaining edges (issue 33, item 4): each case as a user met it, each now one line on
stderr and exit code 2 (130/143 for Ctrl-C/SIGTERM), no traceback, no hang, no file left behind."""
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.core import io as ctio
from cvxtransformer.core.errors import InvalidInputError

from test_user_errors import assert_one_line_error, leftovers, run

ROOT = Path(__file__).resolve().parents[1]
CORE = ["--loss", "squared", "--beta", "0.1"]


def _env():
    """The environment of a command-line subprocess: this checkout first on PYTHONPATH, the caller's
    entries kept (packages installed on PYTHONPATH, as on a machine without pip's site-packages)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4, 3))
    np.savez("d.npz", X=X, y=rng.standard_normal(30))
    np.savez("y0d.npz", X=X, y=np.array(1.0))
    np.savez("yw0.npz", X=X, y=np.zeros((30, 0)))
    np.savez("yw0seq.npz", X=X, y=np.zeros((30, 4, 0)))
    return tmp_path


def solve(capsys, *argv):
    return run(capsys, ["solve", *argv, *CORE])


def test_issue33_y_as_a_0d_array_or_of_width_0_is_named(capsys, folder):
    code, out, err = solve(capsys, "y0d.npz", "--program", "10")
    assert_one_line_error(code, err, "solve", r"DATA: y in 'y0d\.npz' is one number \(a 0-d array\)")
    for data, program in (("yw0.npz", "10"), ("yw0seq.npz", "mhsa")):
        code, out, err = solve(capsys, data, "--program", program)
        assert_one_line_error(code, err, "solve", r"y: expected at least one output per sample, got shape \(30, (4, )?0\)")
    with pytest.raises(InvalidInputError, match=r"^y: expected at least one output"):
        ct.make_problem(np.ones((5, 2, 2)), np.zeros((5, 0)), program=10, beta=1.0)


@pytest.mark.parametrize("solver, value, limit", [("clarabel", 2**32, 2**32 - 1), ("clarabel", 10**30, 2**32 - 1),
                                                  ("scs", 10**30, 2**31 - 1), ("scs", 2**31, 2**31 - 1)])
def test_issue33_max_iter_beyond_the_solvers_counter_is_refused_naming_the_limit(capsys, folder, solver, value, limit):
    code, out, err = solve(capsys, "d.npz", "--program", "10", "--solver", solver, "--max-iter", str(value))
    assert_one_line_error(code, err, "solve", rf"max_iter: expected an integer in \[1, {limit}\] for solver '{solver}'")
    assert out == ""


def test_issue33_the_largest_budget_is_taken(capsys, folder):
    code, out, err = solve(capsys, "d.npz", "--program", "10", "--solver", "clarabel", "--max-iter", str(2**32 - 1))
    assert code == 0 and "CERTIFIED" in out, err


def test_issue33_a_negative_gate_seed_is_a_usage_error(capsys, folder):
    code, out, err = solve(capsys, "d.npz", "--program", "12", "--gate-seed", "-1")
    assert_one_line_error(code, err, "solve", r"argument --gate-seed: expected an integer >= 0 \(a seed\), got -1")


@pytest.mark.parametrize("out, match", [("", r"--out: expected a file name, got ''"),
                                        ("newdir/", r"--out: 'newdir/' ends with '/', which names a folder; give a "
                                                    r"file name \(e\.g\. 'newdir/result\.npz'\)")])
def test_issue33_an_empty_out_or_one_ending_in_a_separator_is_refused(capsys, folder, out, match):
    before = sorted(os.listdir(folder))
    code, stdout, err = solve(capsys, "d.npz", "--program", "10", "--out", out)
    assert_one_line_error(code, err, "solve", match)
    assert sorted(os.listdir(folder)) == before and stdout == ""


@pytest.mark.parametrize("program", ["12", "gated_mhsa", "mixer"])
def test_issue33_a_billion_gates_are_refused_before_they_are_sampled(capsys, folder, program):
    from cvxtransformer.core.registry import family
    from cvxtransformer.core.validation import format_bytes

    t0 = time.perf_counter()
    code, out, err = solve(capsys, "d.npz", "--program", program, "--gates", "1000000000")
    assert_one_line_error(code, err, "solve", r"gates: expected what fits in memory \(.* available\), got 1000000000 "
                                              r"gates, whose masks, gated designs and coefficients take about .*; use "
                                              r"fewer gates \(--gates\); about \d+ would fit")
    assert time.perf_counter() - t0 < 5
    # the estimate is what the text says: the program's own count per gate (issue 44: what grows with N included)
    data = np.load("d.npz")
    per_gate = family(program).program.gate_bytes(data["X"], data["y"], data["y"].reshape(30, 1))
    assert f"take about {format_bytes(1e9 * per_gate)};" in err


@pytest.mark.parametrize("role", ["DATA", "RESULT", "shard"])
def test_issue33_a_fifo_as_input_is_refused_at_once(capsys, folder, role):
    os.mkfifo("pipe")
    if role == "DATA":
        code, out, err = solve(capsys, "pipe", "--program", "10")
    elif role == "RESULT":
        code, out, err = run(capsys, ["verify", "d.npz", "pipe", "--program", "10", *CORE])
    else:
        os.mkdir("shard")
        np.save("shard/y.npy", np.zeros(30))
        os.mkfifo("shard/X.npy")
        code, out, err = solve(capsys, "shard", "--program", "10")
    name = "shard/X.npy" if role == "shard" else "pipe"
    assert_one_line_error(code, err, "solve" if role != "RESULT" else "verify",
                          rf"{role if role != 'shard' else 'DATA'}: '{name}' is a FIFO \(named pipe\), not a regular file")


def test_issue33_a_fifo_as_out_without_a_reader_is_refused_not_waited_on(capsys, folder, monkeypatch):
    monkeypatch.setattr(ctio, "FIFO_WAIT", 0.3)
    os.mkfifo("pipe")
    t0 = time.perf_counter()
    code, out, err = solve(capsys, "d.npz", "--program", "10", "--out", "pipe")
    assert_one_line_error(code, err, "solve", r"output: no process reads the FIFO 'pipe' \(waited 0.3 s\); start its reader")
    assert time.perf_counter() - t0 < 30 and not leftovers(folder)


@pytest.mark.parametrize("moment", ["created", "linked", "created unnamed"])
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_issue33_a_signal_as_the_temporary_file_appears_leaves_no_tmp(capsys, folder, monkeypatch, sig, code, word,
                                                                      moment):
    """The signal arrives right after the temporary file is created (a named one: the file system has no
    unnamed files; or an unnamed one), or right after the unnamed file is linked under a temporary name
    (issue 44: the target exists), before its name is kept: the moment that left .tmp files. It now waits
    until the name is kept, and the cleanup removes the file."""
    if moment == "created":
        monkeypatch.setattr(ctio, "O_TMPFILE", None)  # the named fallback
    real = getattr(ctio, "_link" if moment == "linked" else "_temporary")

    def then_signal(*args, **kwargs):
        made = real(*args, **kwargs)
        signal.pthread_kill(threading.main_thread().ident, sig)
        for _ in range(50):  # bytecodes in which an unblocked signal's handler would run
            time.sleep(0.001)
        return made

    monkeypatch.setattr(ctio, "_link" if moment == "linked" else "_temporary", then_signal)
    if moment == "linked":
        Path("r.npz").write_bytes(b"an earlier result")
    result = solve(capsys, "d.npz", "--program", "10", "--out", "r.npz")
    assert result[0] == code and result[2].strip() == f"cvxtransformer solve: {word}", result
    assert not leftovers(folder) and not [f for f in os.listdir(folder) if f.startswith(".r.npz")]
    assert Path("r.npz").read_bytes() == b"an earlier result" if moment == "linked" else not os.path.exists("r.npz")


def test_issue33_python_api_arguments_get_the_projects_errors():
    X = np.random.default_rng(0).standard_normal((30, 4, 3))
    y = X[:, 1, :2]
    for seed in (-1, "a", 1.5):
        with pytest.raises(InvalidInputError, match=rf"^gate_seed: expected an integer >= 0, got {seed!r}"):
            ct.make_problem(X, y, program=12, beta=1.0, gate_seed=seed)
    P = ct.make_problem(X, y, program=10, beta=1.0)
    for value, match in ((-5, r"an integer >= 1, got -5"), (1.5, r"an integer >= 1, got 1.5"),
                         (2**40, r"an integer in \[1, 4294967295\] for solver 'clarabel'")):
        with pytest.raises(InvalidInputError, match=rf"^max_iter: expected {match}"):
            ct.solve(P, "clarabel", max_iter=value)
    for solver in ("clarabel", "scs", "fista"):
        for value in ("5", math.nan, -1):
            with pytest.raises(InvalidInputError, match=r"^time_limit: expected a finite number > 0"):
                ct.solve(P, solver, time_limit=value)
    with pytest.raises(InvalidInputError, match=r"^weights: expected AttentionHeads .* got NoneType"):
        ct.nonconvex_objective(P, None)
    G = ct.make_problem(X, X[:, :, :2], program="gated_mhsa", beta=1.0, gates=2)
    with pytest.raises(InvalidInputError, match=r"^weights: expected GatedMHSAHeads .* got NoneType"):
        ct.nonconvex_objective(G, None)


def test_issue33_certify_takes_a_tensor_that_requires_grad():
    X = np.random.default_rng(0).standard_normal((30, 4, 3))
    P = ct.make_problem(X, X[:, 1, :2], program=10, beta=1.0)
    P = P.with_beta(0.3 * P.beta_max())
    Z = ct.solve(P, "clarabel").Z
    tensor = torch.tensor(Z, requires_grad=True)
    from_tensor, from_array = ct.certify(P, tensor, refine=False), ct.certify(P, Z, refine=False)
    assert from_tensor.primal_objective == from_array.primal_objective
    assert from_tensor.dual_objective == from_array.dual_objective and from_tensor.certified


# ----------------------------------------------------------------------------- fresh processes
def _command(*argv, **kwargs):
    return subprocess.run([sys.executable, "-m", "cvxtransformer", *argv], capture_output=True, text=True, env=_env(),
                          **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("limit_mib", [300, 700])
def test_issue33_a_memory_limit_at_start_is_one_line(tmp_path, limit_mib):
    """300 MiB: torch's library cannot be mapped (was an ImportError traceback); 700 MiB: OpenBLAS spun
    forever in its start-up allocation (was a hang)."""
    np.savez(tmp_path / "d.npz", X=np.ones((5, 2, 2)), y=np.ones(5))
    argv = ["prlimit", f"--as={limit_mib * 2**20}", sys.executable, "-m", "cvxtransformer", "solve",
            str(tmp_path / "d.npz"), "--program", "10", *CORE]
    if not os.path.exists("/usr/bin/prlimit"):
        argv = ["bash", "-c", f"ulimit -v {limit_mib * 1024} && exec \"$@\"", "bash", *argv[2:]]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env())
    assert_one_line_error(out.returncode, out.stderr, "solve", rf"not enough memory to start \(the address-space "
                                                               rf"limit is {limit_mib} MiB; .*\); raise the memory limit")


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["scs", "clarabel"])
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_issue33_a_signal_during_a_native_solve_ends_it_at_once(tmp_path, solver, sig, code, word):
    """An SDP (program (6), d = 10) that SCS and Clarabel take half a minute or more over at tol 1e-10 (SCS
    27 s, Clarabel longer, on a loaded 2-core machine; SCS over 55 s on the 16-core GPU machine): the
    signal is sent once the solver prints its iteration header. SIGTERM used to wait for SCS
    to return (still running 600 s later), Ctrl-C was reported as SCS's failure with exit code 2."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", X=rng.standard_normal((100, 3, 10)), y=rng.standard_normal((100, 3, 2)))
    out = tmp_path / "r.npz"
    proc = subprocess.Popen([sys.executable, "-u", "-m", "cvxtransformer", "solve", str(tmp_path / "d.npz"),
                             "--program", "mhsa", "--loss", "squared", "--beta-frac", "0.01", "--solver", solver,
                             "--tol", "1e-10", "--verbose", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    try:
        for line in proc.stdout:  # the solver's header, then its iterations
            if line.lstrip().startswith("iter"):
                break
        time.sleep(0.2)
        assert proc.poll() is None, "the solve ended before the signal"
        proc.send_signal(sig)
        t0 = time.perf_counter()
        _, err = proc.communicate(timeout=60)
        seconds = time.perf_counter() - t0
    finally:
        proc.kill()
    assert proc.returncode == code and err.strip().splitlines()[-1] == f"cvxtransformer solve: {word}", err[-2000:]
    assert "Traceback" not in err and seconds < 30 and not out.exists() and not leftovers(tmp_path)
