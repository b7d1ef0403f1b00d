"""Issue 44, the shell's edges: a RESULT's gates (item 1), data that changes during a run (item 2), the
memory of the gates (item 3), ``kill -9`` during ``--out``'s write (item 6) and the time limits of the
CVXPY solvers (item 7). Each bad input is one line on stderr naming the argument, exit code 2, and no
file written or changed."""
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

from cvxtransformer.cli import main

from test_user_errors import assert_one_line_error


def cli(*argv):
    err = io.StringIO()
    with redirect_stdout(io.StringIO()) as out, redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


# ----------------------------------------------------------------------------- 1. RESULT's gates
GATED = {  # family: (its gate arrays, y's shape)
    "12": (("U1", "U2"), (30, 2)),
    "gated_mhsa": (("H",), (30, 4, 2)),
    "mixer": (("G",), (30, 2, 3)),
}


def gated_data(tmp_path, program):
    """DATA holding the gates of ``program`` (3 of them, seed 5), and the same data with the gates negated."""
    from cvxtransformer.core.registry import family

    names, y_shape = GATED[program]
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((30, 4, 3)), rng.standard_normal(y_shape)
    kinds = family(program).program.gate_array_kinds
    assert tuple(kinds) == names
    shapes = {"U1": (3, 4), "U2": (3, 3), "H": (3, 3, 3), "G": (3, 4)}
    gates = {k: np.random.default_rng(5).standard_normal(shapes[k]) for k in names}
    np.savez(tmp_path / "d.npz", X=X, y=y, **gates)
    np.savez(tmp_path / "negated.npz", X=X, y=y, **{k: -v for k, v in gates.items()})
    return gates


@pytest.mark.parametrize("program", sorted(GATED))
def test_issue44_verify_refuses_result_gates_that_its_fingerprint_does_not_record(tmp_path, program):
    """The reported case (mixer): G replaced by -G in RESULT and Z by the optimum for -G, the fingerprint
    kept, was CERTIFIED with "checked: DATA is the data RESULT was solved on". Now refused, for every
    gated family; the same file without its fingerprint certifies (so the refusal is what stops it), and
    says RESULT's gates are used."""
    gates = gated_data(tmp_path, program)
    args = ["--program", program, "--loss", "squared", "--beta-frac", "0.3", "--json"]
    for data, out in (("d.npz", "r.npz"), ("negated.npz", "r_negated.npz")):
        assert cli("solve", tmp_path / data, *args, "--solver", "clarabel", "--out", tmp_path / out)[0] == 0
    forged = dict(np.load(tmp_path / "r.npz"))
    negated = np.load(tmp_path / "r_negated.npz")
    for k in gates:
        np.testing.assert_array_equal(forged[k], gates[k])
        forged[k] = -gates[k]
    forged["Z"], forged["V"] = negated["Z"], negated["V"]
    np.savez(tmp_path / "forged.npz", **forged)
    before = (tmp_path / "forged.npz").read_bytes()
    code, out, err = cli("verify", tmp_path / "d.npz", tmp_path / "forged.npz", *args)
    shown = ", ".join(gates)
    assert_one_line_error(code, err, "verify", rf"RESULT: its gates {shown} are not the ones its fingerprint "
                                               r"records \(the gates Z was solved with\)")
    assert out == "" and (tmp_path / "forged.npz").read_bytes() == before
    assert cli("verify", tmp_path / "d.npz", tmp_path / "r.npz", *args)[0] == 0     # the RESULT as written
    del forged["fingerprint"]
    np.savez(tmp_path / "unfingerprinted.npz", **forged)
    code, out, err = cli("verify", tmp_path / "d.npz", tmp_path / "unfingerprinted.npz", *args)
    summary = json.loads(out)
    assert code == 0 and summary["certified"] and summary["gates"] == "RESULT", err
    assert summary["data_fingerprint"].startswith("not checked") and "RESULT's gates" in err


@pytest.mark.parametrize("program", sorted(GATED))
def test_issue44_gates_from_data_or_sampled_must_be_those_the_fingerprint_records(tmp_path, program):
    """RESULT without its gates (removed), its fingerprint kept: DATA's gates must be the recorded ones,
    and so must gates sampled from --gates and --gate-seed."""
    gates = gated_data(tmp_path, program)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((30, 4, 3)), rng.standard_normal(GATED[program][1])
    np.savez(tmp_path / "plain.npz", X=X, y=y)
    args = ["--program", program, "--loss", "squared", "--beta-frac", "0.3", "--json"]
    for data, out in (("d.npz", "r.npz"), ("plain.npz", "sampled.npz")):
        sampled = ["--gates", "3", "--gate-seed", "5"] if data == "plain.npz" else []
        assert cli("solve", tmp_path / data, *args, *sampled, "--solver", "clarabel", "--out", tmp_path / out)[0] == 0
        kept = {k: v for k, v in np.load(tmp_path / out).items() if k not in gates}
        np.savez(tmp_path / out, **kept)
    shown = ", ".join(gates)
    assert cli("verify", tmp_path / "d.npz", tmp_path / "r.npz", *args)[0] == 0      # DATA's gates: recorded
    code, _, err = cli("verify", tmp_path / "negated.npz", tmp_path / "r.npz", *args)
    assert_one_line_error(code, err, "verify", rf"RESULT: it was solved with other gates: {shown} \(DATA\) differ")
    code, out, err = cli("verify", tmp_path / "plain.npz", tmp_path / "sampled.npz", *args, "--gates", "3",
                         "--gate-seed", "5")
    assert code == 0 and json.loads(out)["gates"] == "sampled (--gates 3 --gate-seed 5)", err
    code, _, err = cli("verify", tmp_path / "plain.npz", tmp_path / "sampled.npz", *args, "--gates", "3",
                       "--gate-seed", "6")
    assert_one_line_error(code, err, "verify", rf"RESULT: it was solved with other gates: {shown} \(sampled "
                                               r"\(--gates 3 --gate-seed 6\)\) differ .*; pass the --gates and "
                                               r"--gate-seed of the solve")


# ----------------------------------------------------------------------------- 6. kill -9 during --out's write
KILLED_WRITER = """
import sys, time
import numpy as np
from cvxtransformer.cli import main
from cvxtransformer.core import io as ctio
if sys.argv[3] == "named":
    ctio.O_TMPFILE = None                                   # as on a file system without unnamed files
real = np.savez
def slow_savez(f, **arrays):
    real(f, **arrays)
    f.write(b"0" * 2**20)                                   # a MiB more, then the kill
    f.flush()
    print("writing", flush=True)
    time.sleep(120)
np.savez = slow_savez
main(["solve", sys.argv[1], "--program", "10", "--loss", "squared", "--beta-frac", "0.3", "--out", sys.argv[2]])
"""


@pytest.mark.parametrize("kind", ["unnamed", "named"])
def test_issue44_kill_9_during_the_write_leaves_no_temporary_file(tmp_path, kind):
    """``kill -9`` while ``solve --out`` writes: the earlier file intact, and no temporary file (an unnamed
    one, O_TMPFILE); where the file system has no unnamed files, the named one left behind is removed by
    the next write into that folder (its process is gone), while other names are kept."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from test_shell_edges import _env
    from test_user_errors import leftovers

    if kind == "unnamed":
        try:
            os.close(os.open(tmp_path, getattr(os, "O_TMPFILE", 0) | os.O_WRONLY))
        except OSError:
            pytest.skip("the file system of the test's folder has no unnamed files (O_TMPFILE)")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", X=rng.standard_normal((30, 4, 3)), y=rng.standard_normal((30, 2)))
    out = tmp_path / "r.npz"
    out.write_bytes(b"an earlier result")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "d.npz"), str(out), kind],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert proc.stdout.readline().strip() == "writing", proc.stderr.read()[-3000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        proc.kill()
    assert out.read_bytes() == b"an earlier result"
    left = leftovers(tmp_path)
    if kind == "unnamed":
        assert left == []
        return
    assert left == [p.name for p in tmp_path.iterdir() if p.name.startswith(f".r.npz.ct{proc.pid}@")], left
    host = socket.gethostname()
    others = [f".r.npz.ct{os.getpid()}@{host}.abc123.tmp",     # a running process's (this one)
              f".r.npz.ct{proc.pid}@other-{host}.abc123.tmp",  # another host's
              f"r.npz.ct{proc.pid}@{host}.abc123.tmp"]         # not a hidden temporary name
    for name in others:
        (tmp_path / name).write_bytes(b"")
    code, _, err = cli("solve", tmp_path / "d.npz", "--program", "10", "--loss", "squared", "--beta-frac", "0.3",
                       "--out", tmp_path / "other.npz")
    assert code == 0, err
    assert sorted(leftovers(tmp_path)) == sorted(others) and out.read_bytes() == b"an earlier result"
