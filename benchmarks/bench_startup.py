"""Start-up time of the command line against ``python -c "import torch"``, and what each command imports.

Every row is a fresh interpreter, run ``--repeats`` times (median and best wall time): the
reference ``import torch``; ``import cvxtransformer``; the ``--help`` of every command; and tiny
real runs (N = 50, n = 4, d = 3, c = 2): ``solve --solver fista --json`` (the target: within 1.5x
of ``import torch``), ``verify``, ``solve --solver clarabel`` (which needs CVXPY) and ``compare``
(which draws PNGs). For each real run, one more run under ``python -X importtime`` gives the
packages that cost most to import and whether CVXPY, SciPy, matplotlib, scikit-learn or
transformers were loaded. Last, where the time of the tiny fista solve goes inside its process.
Writes ``docs/benchmark_startup.md``.

    python benchmarks/bench_startup.py               # about 3 minutes
    python benchmarks/bench_startup.py --repeats 3   # quicker, noisier
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import DOCS, ROOT, machine, measured, write_doc

TARGET = 1.5
HEAVY = ("cvxpy", "scipy", "matplotlib", "sklearn", "transformers")
TINY = ["--program", "10", "--loss", "squared", "--beta-frac", "0.2"]

PHASES = """
import sys, time, cProfile, pstats, io
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from cvxtransformer.cli import main
t2 = time.perf_counter()
profile = cProfile.Profile()
profile.enable()
main(sys.argv[1:])
profile.disable()
t3 = time.perf_counter()
print(f"PHASES {t1 - t0} {t2 - t1} {t3 - t2}", file=sys.stderr)
out = io.StringIO()
pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(r"cvxtransformer|solvers|argparse")
print(out.getvalue(), file=sys.stderr)
"""


def env():
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def wall(argv, repeats):
    """Median and best wall time of ``repeats`` fresh runs of ``argv`` (its output discarded), after
    one run that is not counted (it brings the files into the page cache)."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return statistics.median(times[1:]), min(times[1:])


def imports(argv):
    """Import time per top-level package (the sum of its modules' own times, seconds) and the
    heavy packages loaded."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    cost = {}
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            own, _, name = line[len("import time:"):].split("|")
            root = name.strip().split(".")[0]
            cost[root] = cost.get(root, 0.0) + int(own) / 1e6
    top = sorted(((v, k) for k, v in cost.items() if v >= 0.02), reverse=True)
    return ", ".join(f"{k} {v:.2f}" for v, k in top), [h for h in HEAVY if h in cost]


def phases(python, argv):
    """In-process: import torch, import the command line, run; and the costliest calls of the run."""
    done = subprocess.run([python, "-c", PHASES, *argv], env=env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    lines = done.stderr.splitlines()
    t = next(line.split()[1:] for line in lines if line.startswith("PHASES"))
    calls = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[0].replace("/", "").isdigit() and ("cvxtransformer" in parts[5]
                                                                          or "solvers" in parts[5]):
            where = parts[5].replace(str(ROOT) + "/", "")
            calls.append((float(parts[3]), where))
    return [float(v) for v in t], calls[:12]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(DOCS / "benchmark_startup.md"))
    args = parser.parse_args()
    python = sys.executable
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from cvxtransformer.cli import COMMANDS

    work = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    X = np.random.default_rng(0).standard_normal((50, 4, 3))
    data, result = str(work / "data.npz"), str(work / "result.npz")
    np.savez(data, X=X[:40], y=X[:40, 0, :2], X_test=X[40:], y_test=X[40:, 0, :2])
    cli = [python, "-m", "cvxtransformer"]
    runs = [("`python -c \"import torch\"` (reference)", [python, "-c", "import torch"]),
            ("`python -c \"import cvxtransformer\"`", [python, "-c", "import cvxtransformer"]),
            ("`cvxtransformer --help`", cli + ["--help"])]
    runs += [(f"`cvxtransformer {name} --help`", cli + [name, "--help"]) for name in COMMANDS]
    solve = cli + ["solve", data, *TINY, "--solver", "fista", "--json", "--out", result]
    runs += [("`solve --solver fista --json` (tiny)", solve),
             ("`verify` of its result (tiny)", cli + ["verify", data, result, *TINY, "--json"]),
             ("`solve --solver clarabel --json` (tiny)", cli + ["solve", data, *TINY, "--json"]),
             ("`compare --solver fista --steps 20` (tiny, PNGs)",
              cli + ["compare", data, *TINY, "--models", "alternative", "--steps", "20", "--solver", "fista",
                     "--out-dir", str(work / "run"), "--quiet"])]
    subprocess.run(solve, env=env(), stdout=subprocess.DEVNULL, check=True)  # the RESULT verify reads
    rows, reference, target = [], None, None
    for label, argv in runs:
        median, best = wall(argv, args.repeats)
        reference = median if reference is None else reference
        top, heavy = imports(argv)
        rows.append((label, median, best, top, heavy))
        print(f"{label}: median {median:.2f} s, best {best:.2f} s; {top}; heavy {heavy}", flush=True)
        if "fista --json" in label:
            target = (median / reference, best / rows[0][2])
    (t_torch, t_cli, t_run), calls = phases(python, solve[3:])

    lines = [
        "# Start-up time of the command line",
        "",
        "Regenerate with `python benchmarks/bench_startup.py` (about 3 minutes). Every row is a fresh",
        f"interpreter, run {args.repeats} times after one uncounted run: the median and the best wall time,",
        "and the ratio of the median to that of `python -c \"import torch\"`, the floor of every command",
        "that computes (all of them use torch). Tiny runs: N = 50 sequences of n = 4 tokens, d = 3, c = 2,",
        "program (10), beta = 0.2 beta_max. Imports: the top-level packages that `python -X importtime`",
        "charges at least 20 ms (the sum of their modules' own import times, in seconds), and which of",
        "CVXPY, SciPy, matplotlib, scikit-learn and transformers were loaded.",
        "",
        f"Machine: {machine(threads=None)}. {measured()}",
        "Single runs vary by a few tenths of a second with the load, which the medians and best times show.",
        "",
        f"**Target: a tiny `solve --solver fista --json` within {TARGET}x of `import torch`: "
        f"{target[0]:.2f}x by the medians, {target[1]:.2f}x by the best times, "
        f"{(t_torch + t_cli + t_run) / t_torch:.2f}x in one process (below): "
        f"{'met' if max(target[0], target[1], (t_torch + t_cli + t_run) / t_torch) <= TARGET else 'NOT met'}.**",
        "",
        "| command | median (s) | best (s) | x import torch | imports (s) | heavy packages loaded |",
        "|---|---|---|---|---|---|",
    ]
    for label, median, best, top, heavy in rows:
        lines.append(f"| {label} | {median:.2f} | {best:.2f} | {median / reference:.2f} | {top or '–'} | "
                     f"{', '.join(heavy) or 'none'} |")
    lines += [
        "",
        "## Where the time of the tiny fista solve goes",
        "",
        f"In one process: `import torch` {t_torch:.2f} s, `import cvxtransformer.cli` {t_cli:.3f} s, and the",
        f"command itself (parse, read DATA, build the problem, solve, certify, print) {t_run:.3f} s. Its",
        "costliest calls (cumulative seconds, under cProfile, which slows Python code):",
        "",
        "| cumulative (s) | call |",
        "|---|---|",
    ]
    lines += [f"| {seconds:.3f} | `{where}` |" for seconds, where in calls]
    lines += [
        "",
        "What was cut: CVXPY (and through it `scipy.stats`, about 1.3 s) is imported only when a CVXPY",
        "solver or builder is used (`core/losses.py`, `core/regularizers.py` and `solvers/cvxpy_solvers.py`",
        "import it inside their CVXPY methods); matplotlib only when a plot is drawn; scikit-learn and",
        "transformers only by the estimators and the BERT data. `tests/test_startup.py` checks, in a",
        "fresh interpreter, that a torch solve, its certificate, `certify_network` and the `solve`/`verify`",
        "commands load none of CVXPY, matplotlib, scikit-learn or transformers. The command line builds",
        "the options of the command it runs only (the others keep their name and help).",
        "",
        "What `compare` adds beyond its solve: torch's optimisers import `torch._dynamo` (and sympy) when",
        "the first one is built, matplotlib draws the PNGs, and every program is certified with the",
        "verifier's refined dual point.",
    ]
    write_doc(args.out, lines)


if __name__ == "__main__":
    main()
