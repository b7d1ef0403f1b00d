"""What every benchmark shares: a description of the machine, writing its page of docs/, one case
of a benchmark run in a fresh process, and the time to a certified gap of a solve capped in wall
time in a fresh process."""
import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT))


def _sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, shell=True).stdout.strip()
    except OSError:
        return ""


def machine(threads=None, packages=()):
    """CPU model, cores, RAM, Python and the versions that matter (and of ``packages``), as one line."""
    import cvxpy as cp
    import numpy as np
    import torch

    model = _sh("lscpu | grep 'Model name' | head -1 | cut -d: -f2").strip() or platform.processor() or "unknown CPU"
    mem = _sh("free -g | awk '/Mem:/ {print $2}'") or "?"
    threads = torch.get_num_threads() if threads is None else threads
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            versions.append(f"{name} not installed")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{model}, {os.cpu_count()} cores, {mem} GiB RAM, {gpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__} ({threads} threads), numpy {np.__version__}, CVXPY {cp.__version__}"
            + "".join(", " + v for v in versions))


def load():
    """The 1-minute load average, measured now (other work on a shared machine slows a benchmark)."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


START = (time.time(), load())  # when this module was imported: at a benchmark's start


def commit():
    """The commit of the code measured: its short hash, and whether tracked files outside docs/ differed from
    it (the pages and figures a benchmark writes are not the code it measures)."""
    head = _sh(f"git -C '{ROOT}' rev-parse --short HEAD") or "unknown"
    changed = _sh(f"git -C '{ROOT}' status --porcelain --untracked-files=no -- . ':(exclude)docs'")
    return head + (" with uncommitted changes" if changed else "")


def measured(start=None):
    """What a page states of its run, measured and never asserted: the commit, when it started, how
    long it took, and the 1-minute load average at the start and at the end (``start``: ``(time.time(),
    load())`` at the start; default: when the benchmark imported this module). A load near or above
    the number of cores means other work shared the machine and slowed the timings."""
    t0, load0 = START if start is None else start
    return (f"Measured at commit {commit()}, started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}, "
            f"{(time.time() - t0) / 60:.1f} min; 1-minute load average {load0} at the start and {load()} at the end "
            f"({os.cpu_count()} cores; measured by os.getloadavg, nothing else was stopped).")


def case_parser(description, cap, out):
    """The options of a benchmark that runs each case in a fresh process: ``--quick``, ``--cap``,
    ``--out``, and the hidden ``--one CASE`` (JSON) by which it runs one case and prints its row."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--cap", type=float, default=cap, help="seconds before a run is killed")
    parser.add_argument("--out", default=str(out))
    return parser


def run_fresh(script, case, cap):
    """``script --one case`` in a fresh process killed after ``cap`` seconds: its row (JSON, the last
    line it prints) with its wall time in ``wall``, or the case with ``killed`` or ``error``."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, str(script), "--one", json.dumps(case)], capture_output=True,
                             text=True, timeout=cap, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return dict(case, killed=cap)
    if out.returncode:
        return dict(case, error=(out.stderr.strip().splitlines() or ["no output"])[-1][:200])
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["wall"] = time.perf_counter() - t0
    return row


def write_doc(path, lines):
    """Write a docs page (atomically) and say so."""
    from cvxtransformer.core.io import atomic_open

    with atomic_open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")


def replace_block(text, part, lines, command, page="the page"):
    """``text`` with the block of ``part`` between its generated markers (``<!-- generated: PART`` ...
    ``<!-- end generated: PART -->``) replaced by ``lines``, the command that wrote it named in the first marker."""
    import re

    start, end = f"<!-- generated: {part}", f"<!-- end generated: {part} -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{page}: no block for {part!r} (markers {start} ... {end})")
    block = "\n".join([f"{start} by `{command}`: do not edit by hand -->", ""] + lines + ["", end])
    return pattern.sub(lambda _: block, text)


def _time_to_gap(build, args, solver, cap, tol, options=None):
    """The solve of :func:`time_to_gap`, in the child process."""
    import warnings

    import cvxtransformer as ct

    problem = build(*args)
    t = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = ct.solve(problem, solver, tol=tol, refine=False, time_limit=cap, **(options or {}))
    except ct.CvxTransformerError as exc:
        return dict(seconds=time.perf_counter() - t, gap=None, note=str(exc).split(";")[0][:60], rank=None)
    except MemoryError:
        return dict(seconds=time.perf_counter() - t, gap=None, note="out of memory", rank=None)
    c, seconds = r.certificate, time.perf_counter() - t
    note = "" if c.certified else r.status[:60]
    if c.certified and seconds > cap:  # the solver's own limit does not bound CVXPY's compilation
        note = f"certified after the {cap:g} s cap"
    return dict(seconds=seconds, gap=c.relative_gap, rank=c.support_size, certified=c.certified and seconds <= cap,
                note=note)


def time_to_gap(build, args, solver, cap, tol=1e-6, options=None):
    """Seconds to a certified relative gap ``tol`` (verifier's gap, the solver's own dual point, no
    refinement) of ``build(*args)`` by ``solver``, in a fresh process that is killed when the solve
    passes ``cap`` seconds of wall time: the cap covers CVXPY's compilation too, which the solvers'
    own time limits do not bound. (A fresh process, not a fork: a fork of a process whose OpenMP
    threads are running can deadlock.) ``build`` must be importable by the child; ``options`` go to
    ``ct.solve``. Returns a dict:
    seconds, gap, rank (support size), certified (within the cap), note."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(os.getpid)  # the child's imports, outside the cap
        job = pool.apply_async(_time_to_gap, (build, args, solver, cap, tol, options))
        try:
            return job.get(timeout=cap + 10)  # + the problem's construction
        except multiprocessing.TimeoutError:
            return dict(seconds=cap, gap=None, note=f"stopped at the {cap:g} s cap", rank=None)
