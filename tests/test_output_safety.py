"""Issue 20, item 2: ``--out`` never destroys anything. An input of the command (DATA, a DATA folder's
arrays, a shard, under any spelling or link) is refused; a symlink is written through to its target;
a character device or a FIFO is written directly (``--out /dev/null`` works, for root too); a
read-only file is refused; Ctrl-C and SIGTERM, mid-solve or mid-write, leave the earlier result and
no temporary file."""
import os
import signal
import stat
import threading
import time

import numpy as np
import pytest

from cvxtransformer.cli import main
from cvxtransformer.core import io as ctio
from cvxtransformer.core.errors import InvalidInputError

from test_user_errors import assert_one_line_error, leftovers

ARGS = ["--program", "10", "--loss", "squared", "--beta-frac", "0.3", "--no-refine"]


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((30, 4, 3)), rng.standard_normal((30, 2))
    np.savez(tmp_path / "d.npz", X=X, y=y)
    for name, (s, e) in {"a": (0, 12), "b": (12, 30)}.items():
        (tmp_path / "shards" / name).mkdir(parents=True)
        np.save(tmp_path / "shards" / name / "X.npy", X[s:e])
        np.save(tmp_path / "shards" / name / "y.npy", y[s:e])
    return tmp_path


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def solve(capsys, source, out):
    code = main(["solve", *([source] if isinstance(source, str) else source), *ARGS, "--out", str(out)])
    return (code, *capsys.readouterr())


@pytest.mark.parametrize("source, out", [
    ("d.npz", "d.npz"),                         # the reported case
    ("d.npz", "shards/../d.npz"),               # another spelling
    ("d.npz", "hard.npz"),                      # a hard link to DATA
    ("d.npz", "link.npz"),                      # a symlink to DATA
    ("shards", "shards/a/X.npy"),               # a DATA folder's arrays
    (["shards/a", "shards/b"], "shards/b/y.npy"),  # a shard
])
def test_an_input_of_the_command_is_never_an_output(capsys, data, monkeypatch, source, out):
    monkeypatch.chdir(data)
    os.link("d.npz", "hard.npz")
    os.symlink("d.npz", "link.npz")
    before = snapshot(data)
    code, stdout, err = solve(capsys, source, out)
    assert_one_line_error(code, err, "solve", r"--out: '.*' (\(a link to '.*'\) )?is an input of this command"
                                              r"( \(the same file as '.*'\))?; writing it would destroy it")
    assert stdout == "" and snapshot(data) == before and os.path.islink("link.npz")


def test_a_symlink_is_written_through_and_stays_a_link(capsys, data, monkeypatch):
    monkeypatch.chdir(data)
    (data / "results").mkdir()
    (data / "results" / "r.npz").write_bytes(b"an earlier result")
    os.symlink("results/r.npz", "latest.npz")
    os.symlink("results/new.npz", "dangling.npz")
    for link in ("latest.npz", "dangling.npz"):
        code, _, err = solve(capsys, "d.npz", link)
        assert code == 0, err
        assert os.path.islink(link) and np.load(link)["Z"].shape == (2, 4, 3)
    assert sorted(os.listdir("results")) == ["new.npz", "r.npz"] and not leftovers(data)


def test_out_dev_null_and_a_fifo_are_written_directly(capsys, data):
    code, _, err = solve(capsys, str(data / "d.npz"), os.devnull)
    assert code == 0 and err == "" and stat.S_ISCHR(os.stat(os.devnull).st_mode)
    fifo = data / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(open(fifo, "rb").read()))
    reader.start()
    code, _, err = solve(capsys, str(data / "d.npz"), fifo)
    reader.join(30)
    assert code == 0 and stat.S_ISFIFO(os.stat(fifo).st_mode) and received[0][:2] == b"PK"  # a .npz (zip)
    assert not leftovers(data)


def test_a_read_only_file_is_the_users_decision(capsys, data):
    out = data / "keep.npz"
    out.write_bytes(b"an earlier result")
    out.chmod(0o444)
    code, _, err = solve(capsys, str(data / "d.npz"), out)
    assert_one_line_error(code, err, "solve", r"--out: '.*keep\.npz' is read-only; make it writable \(chmod u\+w\)")
    assert out.read_bytes() == b"an earlier result"
    with pytest.raises(InvalidInputError, match=r"^output: '.*keep\.npz' is read-only"):
        ctio.save_npz(out, x=np.zeros(2))  # the Python writers too
    assert out.read_bytes() == b"an earlier result" and not leftovers(data)


# ----------------------------------------------------------------------------- interruptions
def _interrupt_when(event, sig):
    """Send ``sig`` to the main thread once ``event`` is set (as a shell's kill reaches a command)."""
    main_thread = threading.main_thread().ident

    def send():
        if event.wait(60):
            signal.pthread_kill(main_thread, sig)
    threading.Thread(target=send, daemon=True).start()


@pytest.mark.parametrize("phase", ["solve", "write"])
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_and_sigterm_leave_the_earlier_result_and_no_temporary_file(capsys, data, monkeypatch, phase, sig,
                                                                         code, word):
    out = data / "r.npz"
    out.write_bytes(b"an earlier result")
    started = threading.Event()

    def work():  # short sleeps: Python runs a signal handler between two of them
        for _ in range(200):
            time.sleep(0.1)

    if phase == "solve":
        def slow_solve(*args, **kwargs):
            started.set()
            work()
        monkeypatch.setattr("cvxtransformer.solving.solve", slow_solve)
    else:
        real = np.savez

        def slow_savez(f, **arrays):
            f.write(b"half of a file")
            started.set()
            work()
            real(f, **arrays)
        monkeypatch.setattr(np, "savez", slow_savez)
    handler = signal.getsignal(signal.SIGTERM)
    _interrupt_when(started, sig)
    t0 = time.perf_counter()
    result = solve(capsys, str(data / "d.npz"), out)
    assert result[0] == code and result[2].strip() == f"cvxtransformer solve: {word}", result
    assert time.perf_counter() - t0 < 10 and started.is_set()
    assert out.read_bytes() == b"an earlier result" and not leftovers(data)
    assert signal.getsignal(signal.SIGTERM) is handler  # restored when the command ends


@pytest.mark.slow
def test_a_real_sigterm_from_outside_ends_a_running_solve_cleanly(tmp_path):
    """The same through a real process: ``kill -TERM`` while the torch backend runs (slow: a fresh
    interpreter; the in-process tests above are the fast ones)."""
    import subprocess
    import sys

    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", X=rng.standard_normal((1000, 6, 6)), y=np.where(rng.standard_normal(1000) > 0, 1, -1))
    out = tmp_path / "r.npz"
    out.write_bytes(b"an earlier result")
    proc = subprocess.Popen([sys.executable, "-m", "cvxtransformer", "solve", str(tmp_path / "d.npz"), "--program",
                             "12", "--loss", "logistic", "--beta-frac", "0.01", "--solver", "fista", "--tol", "1e-15",
                             "--max-iter", "100000000", "--progress", "--out", str(out)],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()  # the solve has started
        assert first.startswith("fista"), first
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "cvxtransformer solve: terminated", err[-2000:]
    assert out.read_bytes() == b"an earlier result" and not leftovers(tmp_path)
