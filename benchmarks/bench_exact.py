"""Build and solve time of the CVXPY programs as N grows (issue 2).

Program (10), squared loss, n = 8, d = 16, c = 4, beta = 0.2 beta_max, on i.i.d. Gaussian
tokens; Clarabel and SCS, primal and dual forms. For each run: the time to build the
``cvxpy.Problem`` (our builder), CVXPY's compile time (canonicalization), the solver's own
time, the wall time of ``Problem.solve``, and the certified relative gap recomputed by the
verifier. Writes ``docs/benchmark_exact.md``.

    python benchmarks/bench_exact.py            # N = 500 ... 5000 (a few minutes)
    python benchmarks/bench_exact.py --quick    # N = 200, 500
"""
import argparse
import time
from pathlib import Path

import numpy as np
from common import DOCS, machine, write_doc

import cvxtransformer as ct
from cvxtransformer.core.cvxpy_builders import BUILDERS
from cvxtransformer.core.io import save_figure

SOLVER_SETTINGS = {"clarabel": dict(solver="CLARABEL"), "scs": dict(solver="SCS", eps_abs=1e-7, eps_rel=1e-7)}


def run(N, solver, form, n=8, d=16, c=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n, d))
    Y = rng.standard_normal((N, c))
    problem = ct.make_problem(X, Y, program=10, loss="squared", beta=1.0)
    problem = problem.with_beta(0.2 * problem.beta_max())
    t0 = time.perf_counter()
    built = BUILDERS[form](problem)
    t1 = time.perf_counter()
    built.problem.solve(**SOLVER_SETTINGS[solver])
    t2 = time.perf_counter()
    cert = ct.certify(problem, built.extract_Z(), V=built.extract_V(), refine=False)
    return dict(N=N, solver=solver, form=form, build=t1 - t0, compile=built.problem.compilation_time,
                solver_time=built.problem.solver_stats.solve_time, total=t2 - t0, gap=cert.relative_gap)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(DOCS / "benchmark_exact.md"))
    args = parser.parse_args()
    sizes = (200, 500) if args.quick else (500, 1000, 2000, 5000, 10000)
    rows = []
    for N in sizes:
        for solver in ("clarabel", "scs"):
            for form in ("primal", "dual"):
                r = run(N, solver, form)
                rows.append(r)
                print(f"N={N:6d} {solver:8s} {form:6s} build {r['build']:.3f}s compile {r['compile']:.2f}s "
                      f"solver {r['solver_time']:.2f}s total {r['total']:.2f}s rel.gap {r['gap']:.1e}", flush=True)
    lines = ["# Build and solve time of the CVXPY programs", "",
             "Program (10), squared loss, n = 8, d = 16, c = 4, beta = 0.2 beta_max, i.i.d. Gaussian tokens.",
             "`build`: our builder (`cvxtransformer.core.cvxpy_builders`); `compile`: CVXPY's canonicalization;",
             "`solver`: the solver's own time; `total`: build + `Problem.solve` wall time; `rel. gap`: the verifier's",
             "certified relative gap from the returned Z and V, without refinement (Clarabel defaults; SCS eps 1e-7).",
             "",
             f"Machine: {machine()}.", "",
             "Regenerate: `python benchmarks/bench_exact.py`" + (" --quick" if args.quick else ""), "",
             "| N | solver | form | build (s) | compile (s) | solver (s) | total (s) | compile share | rel. gap |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['N']} | {r['solver']} | {r['form']} | {r['build']:.3f} | {r['compile']:.2f} | "
                     f"{r['solver_time']:.2f} | {r['total']:.2f} | {r['compile'] / r['total']:.0%} | {r['gap']:.1e} |")
    figure = Path(args.out).parent / "figures" / "benchmark_exact.png"
    plot(rows, figure)
    lines += ["", f"![build and solve time against N](figures/{figure.name})"]
    write_doc(args.out, lines)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for solver in ("clarabel", "scs"):
        for form, style in (("primal", "-"), ("dual", "--")):
            sel = [r for r in rows if r["solver"] == solver and r["form"] == form]
            Ns = [r["N"] for r in sel]
            line, = ax.loglog(Ns, [r["total"] for r in sel], style, marker="o", label=f"{solver} {form}: total")
            ax.loglog(Ns, [r["compile"] for r in sel], style, marker="x", color=line.get_color(), alpha=0.5,
                      label=f"{solver} {form}: compile")
    ax.set_xlabel("N (samples)")
    ax.set_ylabel("seconds")
    ax.set_title("Program (10), n=8, d=16, c=4: CVXPY build+solve")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
