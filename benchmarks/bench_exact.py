"""Build, compile and solve time of the CVXPY programs as N grows, in each formulation (issues 2 and 22).

The squared loss depends on the data only through ``A^T A``, ``A^T Y`` and ``||Y||^2``: the
"compressed" formulation hands CVXPY ``1/2 ||R C - S||^2 + const`` with R of at most p rows (a
pivoted Cholesky factor of the Gram matrix, accumulated over chunks of samples), so the CVXPY
problem does not grow with N; "direct" is the dense design (N c rows); "factored" is program
"mhsa"'s map as two structured products. Every run is certified by the verifier on the whole
problem (relative gap from the returned Z and V, no refinement), and each runs in a fresh process
killed at a cap (CVXPY's compilation is not bounded by the solvers' time limits).

Cases: program (10), squared, n = 8, d = 16, c = 4, beta = 0.2 beta_max, direct up to N = 5,000 and
compressed up to N = 10^6; the torch backend on the same instances (the time ratio); program "mhsa",
squared, n = 8, c = 2, N = 2,000, d = 4, 8, 12 in every formulation; program (10) cross-entropy (no
compression exists) to show where its time goes. Writes ``docs/benchmark_exact.md`` and its figure.

    python benchmarks/bench_exact.py            # about 15 minutes on a 2-core machine
    python benchmarks/bench_exact.py --quick    # small sizes, about a minute
"""
import json
import sys
import time
from pathlib import Path

from common import DOCS, case_parser, machine, measured, run_fresh, write_doc

TOL = 1e-7  # the relative gap a run must certify
CAP = 180  # seconds before a run is killed


def one(case):
    """Run one case in this process; returns its row."""
    import numpy as np

    import cvxtransformer as ct

    program, loss, formulation, solver, N, n, d, c = (case[k] for k in ("program", "loss", "formulation", "solver",
                                                                        "N", "n", "d", "c"))
    rng = np.random.default_rng(0)
    X = np.empty((N, n, d))
    for s in range(0, N, 50_000):  # chunks: the generator's temporaries stay small at N = 10^6
        X[s:s + 50_000] = rng.standard_normal((min(50_000, N - s), n, d))
    if loss == "cross_entropy":
        y = rng.integers(0, c, N)
    elif program == "mhsa":
        y = rng.standard_normal((N, n, c))
    else:
        y = rng.standard_normal((N, c))
    problem = ct.make_problem(X, y, program=program, loss=loss, beta=1.0)
    problem = problem.with_beta(0.2 * problem.beta_max())
    row = dict(case)
    if solver == "fista":
        t0 = time.perf_counter()
        result = ct.solve(problem, "fista", tol=TOL, refine=False)
        row.update(build=0.0, compile=0.0, solver_time=result.solve_seconds, total=time.perf_counter() - t0,
                   gap=result.certificate.relative_gap, coefficients=0)
        return row
    import cvxpy  # noqa: F401 (imported before the clock starts: the builders import it lazily)

    from cvxtransformer.core.cvxpy_builders import BUILDERS, cvxpy_coefficients

    settings = dict(solver="CLARABEL") if solver == "clarabel" else dict(solver="SCS", eps_abs=1e-9, eps_rel=1e-9)
    t0 = time.perf_counter()
    built = BUILDERS["primal"](problem, formulation)
    t1 = time.perf_counter()
    built.problem.solve(**settings)
    t2 = time.perf_counter()
    cert = ct.certify(problem, built.extract_Z(), V=built.extract_V(), refine=False)
    t3 = time.perf_counter()
    row.update(build=t1 - t0, compile=built.problem.compilation_time, solver_time=built.problem.solver_stats.solve_time,
               certify=t3 - t2, total=t3 - t0, gap=cert.relative_gap,
               coefficients=int(cvxpy_coefficients(problem, formulation)))
    return row


def cases(quick):
    ten = dict(program=10, loss="squared", n=8, d=16, c=4)
    direct_N = (500, 1000) if quick else (1000, 2000, 5000)
    compressed_N = (1000, 5000) if quick else (1000, 10_000, 100_000, 200_000, 1_000_000)
    fista_N = (5000,) if quick else (10_000, 100_000, 200_000)
    out = [dict(ten, formulation="direct", solver="clarabel", N=N) for N in direct_N]
    out += [dict(ten, formulation="direct", solver="scs", N=N) for N in direct_N[:2]]
    out += [dict(ten, formulation="compressed", solver="clarabel", N=N) for N in compressed_N]
    out += [dict(ten, formulation="compressed", solver="scs", N=N) for N in compressed_N[:3]]
    out += [dict(ten, formulation="-", solver="fista", N=N) for N in fista_N]
    mhsa = dict(program="mhsa", loss="squared", n=8, c=2, solver="clarabel")
    for d in ((4,) if quick else (4, 8, 12)):
        for formulation in ("compressed", "factored", "direct"):
            out.append(dict(mhsa, d=d, formulation=formulation, N=500 if quick else 2000))
    out.append(dict(mhsa, d=8, formulation="compressed", N=10_000, solver="clarabel") if not quick else
               dict(mhsa, d=4, formulation="-", N=500, solver="fista"))
    if not quick:
        out.append(dict(mhsa, d=12, formulation="-", N=2000, solver="fista"))
    ce = dict(program=10, loss="cross_entropy", n=8, d=16, c=5, formulation="direct", solver="clarabel")
    out += [dict(ce, N=N) for N in ((200,) if quick else (500, 1000))]
    return out


def fmt(row, key, spec):
    value = row.get(key)
    return "" if value is None else format(value, spec)


def table(rows):
    lines = ["| program | loss | formulation | solver | N | d | CVXPY coefficients | build (s) | compile (s) | "
             "solver (s) | certify (s) | total (s) | rel. gap | certified |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        head = f"| {r['program']} | {r['loss']} | {r['formulation']} | {r['solver']} | {r['N']:,} | {r['d']} |"
        if "killed" in r or "error" in r:
            why = f"killed at the {r['killed']} s cap" if "killed" in r else f"failed: {r['error']}"
            lines.append(f"{head} | | | | | | {why} | | no |")
            continue
        coefficients = f"{r['coefficients']:,}" if r["coefficients"] else "(never formed)"
        lines.append(f"{head} {coefficients} | {r['build']:.2f} | {r['compile']:.2f} | {r['solver_time']:.2f} | "
                     f"{fmt(r, 'certify', '.2f')} | {r['total']:.2f} | {r['gap']:.1e} | "
                     f"{'yes' if r['gap'] <= TOL else 'NO'} |")
    return lines


def find(rows, **match):
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def targets(rows):
    """The issue's targets, each MET or MISSED with the measured number."""
    out = []
    r = find(rows, program=10, loss="squared", formulation="compressed", solver="clarabel", N=200_000)
    if r is not None:
        ok = "total" in r and r["total"] <= 60 and r["gap"] <= TOL
        out.append(f"- Program (10), squared, N = 200,000, n = 8, d = 16, c = 4, certified at {TOL:g} by Clarabel "
                   f"within 60 s in all: **{'MET' if ok else 'MISSED'}** ("
                   + (f"{r['total']:.1f} s, relative gap {r['gap']:.1e}" if "total" in r else "did not finish")
                   + "; the total includes the pass over the data that forms the Gram matrix, and the verifier's "
                     "certificate on the whole problem).")
    r = find(rows, program="mhsa", formulation="compressed", d=12, N=2000)
    if r is not None:
        ok = "total" in r and r["total"] <= 60 and r["gap"] <= TOL
        out.append("- Program \"mhsa\", squared, N = 2,000, n = 8, d = 12, c = 2 within 60 s: "
                   f"**{'MET' if ok else 'MISSED'}** ("
                   + (f"{r['total']:.1f} s, relative gap {r['gap']:.1e}" if "total" in r else
                      r.get("error", f"killed at {r.get('killed')} s"))
                   + ("" if ok else "; what costs is not N but the nuclear norm's PSD cone, of side t = d^2 + d c = "
                      "168, whose dense Hessian block in Clarabel has (t (t + 1) / 2)^2 = 2.0e8 entries at every "
                      "iteration; the torch backend's row below certifies the same problem") + ").")
    for N in (100_000,):
        a = find(rows, program=10, formulation="compressed", solver="clarabel", N=N)
        b = find(rows, program=10, solver="fista", N=N)
        if a and b and "total" in a and "total" in b:
            ratio = a["total"] / b["total"]
            out.append(f"- Clarabel / torch backend time at N = {N:,} within 20x: **{'MET' if ratio <= 20 else 'MISSED'}**"
                       f" ({a['total']:.2f} s against {b['total']:.2f} s: {ratio:.1f}x; it was 300-2,000x with "
                       "the direct formulation).")
    return out


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cvxtransformer.core.io import save_figure

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for formulation, solver, style in (("direct", "clarabel", "o-"), ("direct", "scs", "o--"),
                                       ("compressed", "clarabel", "s-"), ("compressed", "scs", "s--"),
                                       ("-", "fista", "^:")):
        sel = [r for r in rows if r["program"] == 10 and r["loss"] == "squared" and r["formulation"] == formulation
               and r["solver"] == solver and "total" in r]
        if sel:
            label = "torch backend (fista)" if solver == "fista" else f"{solver}, {formulation}"
            ax.loglog([r["N"] for r in sel], [r["total"] for r in sel], style, label=label)
    ax.set_xlabel("N (samples)")
    ax.set_ylabel("seconds to a certified solution (all in)")
    ax.set_title("Program (10), squared, n=8, d=16, c=4")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)


def main():
    args = case_parser(__doc__.splitlines()[0], CAP, DOCS / "benchmark_exact.md").parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    rows = []
    for case in cases(args.quick):
        row = run_fresh(__file__, case, args.cap)
        rows.append(row)
        print(f"bench_exact: {json.dumps(row)}", file=sys.stderr, flush=True)
    figure = Path(args.out).parent / "figures" / "benchmark_exact.png"
    plot(rows, figure)
    lines = [
        "# Build, compile and solve time of the CVXPY programs, in each formulation", "",
        "The squared loss depends on the data only through `A^T A`, `A^T Y` and `||Y||^2`. The **compressed** "
        "formulation (the default for it) hands CVXPY `1/2 ||R C - S||^2 + const` with R of at most p rows, a "
        "pivoted Cholesky factor of the Gram matrix stopped at its numerical rank, accumulated over chunks of "
        "samples (memory-mapped data is streamed): its size does not depend on N. **direct** is the dense design "
        "(N c rows), **factored** program \"mhsa\"'s map as two structured products. The formulation is chosen "
        "by `formulation=\"auto\"` and recorded in `SolveResult.formulation`; `--formulation` forces one.", "",
        "Columns: `build` our builder (the compression's pass over the data included); `compile` CVXPY's "
        "canonicalization; `solver` the solver's own time; `certify` the verifier on the whole problem (no "
        "refinement); `total` all of it, wall time; `rel. gap` the verifier's certified relative gap from the "
        f"returned Z and V; certified at {TOL:g}. Each run in a fresh process killed at {args.cap:.0f} s. "
        "Gaussian tokens, beta = 0.2 beta_max; Clarabel defaults, SCS eps 1e-9.", "",
        f"Machine: {machine()}. {measured()}", "",
        f"Regenerate: `python benchmarks/bench_exact.py{' --quick' if args.quick else ''}`", "",
        "## Targets", "", *targets(rows), "",
        "## Results", "", *table(rows), "",
        f"![time to a certified solution against N](figures/{figure.name})", "",
        "## Reading the table", "",
        "- Compressed, the CVXPY problem has at most p^2 q coefficients whatever N (p = 128 design columns and "
        "q = 4 outputs for program (10) here): compile and solver time are flat in N, and what grows is the one "
        "pass over the data that forms the Gram matrix (N p^2 multiply-adds, BLAS-3) and the certificate's pass. "
        "Direct, compile and solver time grow linearly in N.",
        "- Program \"mhsa\" has p = d^3 coefficients per output: compressed, CVXPY gets a (k x d^3) factor, k the "
        "numerical rank (about half of d^3: the G_i are symmetric), and Clarabel's cost is that of the "
        "nuclear-norm cone, of side d^2 + d c, whatever N; its Gram matrix is formed from the G_i without "
        "the design. Direct and factored grow linearly in N.",
        "- Cross-entropy and logistic have no compression: the CVXPY problem holds N exponential cones. The "
        "rows above show where the time goes: compilation is a small share, the interior-point solver the rest, "
        "growing with N (the two cross-entropy rows). The torch backend (docs/benchmark_fista.md) is the tool for "
        "these losses at large N; CVXPY's dual form, its canonicalization backends, a Parameter for beta and "
        "Clarabel's KKT factorizations are measured in docs/benchmark_cvxpy_options.md.",
    ]
    write_doc(args.out, lines)


if __name__ == "__main__":
    main()
