"""What CVXPY and Clarabel offer for the logistic and cross-entropy programs, measured (issue 22, item 3).

These losses have no compression (the squared loss's data term is a Gram matrix; theirs is a sum of
N exponential-cone terms), so the CVXPY problem grows with N whatever the formulation. Where does the
time go, and does anything CVXPY offers change it? Each variant is run in a fresh process (killed at
a cap) and certified by the verifier on the whole problem (relative gap from the returned Z and V):

- ``primal``: the project's default, ``yhat = A(Z)`` as a constraint, CVXPY's default
  canonicalization backend (C++);
- ``canon_backend``: the same problem canonicalized by CVXPY's SciPy and COO backends;
- ``dual``: the dual programs (21)/(28) (``form="dual"``), whose variable is V (N x c);
- ``faer``: Clarabel's supernodal multithreaded KKT factorization (``direct_solve_method="faer"``,
  2 threads) instead of its default QDLDL;
- ``parameter``: beta as a ``cvxpy.Parameter``, so a path of three betas compiles once (DPP) and
  re-solves, against three fresh builds.

    python benchmarks/bench_cvxpy_options.py            # about 6 minutes on a 2-core machine
    python benchmarks/bench_cvxpy_options.py --quick    # small sizes, about a minute
"""
import copy
import json
import sys
import time

from common import DOCS, case_parser, machine, measured, run_fresh, write_doc

CAP = 400  # seconds before a run is killed
PATH = (0.2, 0.1, 0.05)  # beta / beta_max of the path of the "parameter" rows


def instance(case):
    import numpy as np

    import cvxtransformer as ct

    rng = np.random.default_rng(0)
    X = rng.standard_normal((case["N"], case["n"], case["d"]))
    if case["loss"] == "cross_entropy":
        y = rng.integers(0, case["c"], case["N"])
    else:
        y = np.where(X[:, :3, :2].sum(axis=(1, 2)) + 0.5 * rng.standard_normal(case["N"]) >= 0, 1.0, -1.0)
    problem = ct.make_problem(X, y, program=case["program"], loss=case["loss"], beta=1.0,
                              n_classes=case["c"] if case["loss"] == "cross_entropy" else None)
    return problem


def clarabel_settings(variant):
    from cvxtransformer.solvers.cvxpy_solvers import Clarabel

    settings = Clarabel().settings(1e-7, {})
    if variant == "faer":
        settings.update(direct_solve_method="faer", max_threads=2)
    return settings


def solve_built(built, problem, variant="primal", build=0.0):
    """Solve a built CVXPY problem with Clarabel (``variant``'s settings and canonicalization) and
    certify its Z and V on ``problem``: the row's timings (``build`` seconds already spent) and gap."""
    import cvxtransformer as ct

    t0 = time.perf_counter()
    built.problem.solve(solver="CLARABEL", canon_backend={"scipy": "SCIPY", "coo": "COO"}.get(variant),
                        **clarabel_settings(variant))
    total = build + time.perf_counter() - t0
    gap = ct.certify(problem, built.extract_Z(), V=built.extract_V(), refine=False).relative_gap
    stats = built.problem.solver_stats
    return dict(build=build, compile=built.problem.compilation_time, solver_time=stats.solve_time,
                iterations=stats.num_iters, total=total, gap=gap, status=built.problem.status)


def solve_once(problem, variant):
    """Build, compile and solve one problem; returns the timings and the certified gap."""
    from cvxtransformer.core.cvxpy_builders import BUILDERS

    t0 = time.perf_counter()
    built = BUILDERS["dual" if variant == "dual" else "primal"](problem, "direct")
    return solve_built(built, problem, variant, time.perf_counter() - t0)


def solve_path(problem, parametrized):
    """The path ``PATH``: one parametrized problem re-solved, or a fresh build per beta. Returns
    the first solve's and the later solves' timings, and the worst certified gap."""
    import cvxpy as cp

    from cvxtransformer.core.cvxpy_builders import build_primal

    beta_max, rows = problem.beta_max(), []
    if parametrized:
        beta = cp.Parameter(nonneg=True, value=PATH[0] * beta_max)
        template = copy.copy(problem)
        template.regularizer = copy.copy(problem.regularizer)
        template.regularizer.beta = beta  # the builder multiplies by it: a DPP-compliant parameter
        t0 = time.perf_counter()
        built = build_primal(template, "direct")
        build = time.perf_counter() - t0
    for frac in PATH:
        sub = problem.with_beta(frac * beta_max)
        t0 = time.perf_counter()
        if parametrized:
            beta.value = sub.beta
        else:
            built = build_primal(sub, "direct")
            build = 0.0
        rows.append(solve_built(built, sub, build=build + time.perf_counter() - t0))
        build = 0.0
    return dict(first=rows[0], later=rows[1:], gap=max(r["gap"] for r in rows),
                total=sum(r["total"] for r in rows))


def one(case):
    problem = instance(case)
    import cvxpy  # noqa: F401 (before the clock starts: the builders import it lazily)

    if case["variant"] in ("parameter", "fresh"):
        return dict(case, **solve_path(problem, case["variant"] == "parameter"))
    return dict(case, **solve_once(problem.with_beta(case["frac"] * problem.beta_max()), case["variant"]))


VARIANTS = ("primal", "scipy", "coo", "dual", "faer")


def cases(quick):
    logistic = dict(program=8, loss="logistic", n=8, d=16, c=1)
    ce = dict(program=10, loss="cross_entropy", n=8, d=16, c=5)
    sizes = ((logistic, 300), (ce, 200)) if quick else ((logistic, 2000), (ce, 500), (ce, 1000))
    out = [dict(base, N=N, frac=0.2, variant=v) for base, N in sizes for v in VARIANTS]
    out += [dict(base, N=sizes[-1][1], frac=None, variant=v) for base in (ce,) for v in ("fresh", "parameter")]
    return out


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def table(rows):
    head = ("| program | loss | N | variant | build (s) | compile (s) | solver (s) | iterations | total (s) | "
            "certified gap |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        if r["variant"] in ("parameter", "fresh"):
            continue
        if "killed" in r or "error" in r:
            why = f"killed at {r['killed']:.0f} s" if "killed" in r else f"error: {r['error']}"
            lines.append(f"| {r['program']} | {r['loss']} | {r['N']:,} | {r['variant']} | {why} | | | | | |")
            continue
        lines.append(f"| {r['program']} | {r['loss']} | {r['N']:,} | {r['variant']} | {r['build']:.2f} | "
                     f"{r['compile']:.2f} | {r['solver_time']:.2f} | {r['iterations']} | {r['total']:.2f} | "
                     f"{r['gap']:.1e} |")
    return "\n".join(lines)


def path_table(rows):
    lines = ["| program | loss | N | path | first solve: compile / solver / total (s) | "
             "later solves: compile / solver / total (s, mean) | Clarabel iterations | path total (s) | "
             "worst certified gap |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["variant"] not in ("parameter", "fresh"):
            continue
        name = "beta a Parameter (compiled once)" if r["variant"] == "parameter" else "fresh build per beta"
        if "killed" in r or "error" in r:
            lines.append(f"| {r['program']} | {r['loss']} | {r['N']:,} | {name} | "
                         f"{r.get('error') or 'killed'} | | | | |")
            continue
        f, later = r["first"], r["later"]
        mean = {k: sum(x[k] for x in later) / len(later) for k in ("compile", "solver_time", "total")}
        lines.append(f"| {r['program']} | {r['loss']} | {r['N']:,} | {name} | {f['compile']:.2f} / "
                     f"{f['solver_time']:.2f} / {f['total']:.2f} | {mean['compile']:.2f} / "
                     f"{mean['solver_time']:.2f} / {mean['total']:.2f} | "
                     f"{', '.join(str(x['iterations']) for x in [f] + later)} | {r['total']:.2f} | {r['gap']:.1e} |")
    return "\n".join(lines)


def _ok(r):
    return "total" in r


PAYS = 1.1  # speed-up over the default, on every instance, that makes a variant worth keeping


def summary(rows):
    """The findings, computed from the rows: compile's share, and each variant against the default."""
    out = []
    base = {(r["loss"], r["N"]): r for r in rows if r["variant"] == "primal" and _ok(r)}
    for (loss, N), b in base.items():
        out.append(f"- {loss}, N = {N:,}: the default spends {b['compile'] / b['total']:.0%} of its {b['total']:.1f} s "
                   f"compiling and {b['solver_time'] / b['total']:.0%} in Clarabel ({b['iterations']} iterations, "
                   f"{b['solver_time'] / max(b['iterations'], 1):.2f} s each).")
        others = [r for r in rows if (r["loss"], r["N"]) == (loss, N) and r["variant"] in VARIANTS[1:]]
        parts = []
        for r in others:
            if _ok(r):
                parts.append(f"{r['variant']} {b['total'] / r['total']:.2f}x (gap {r['gap']:.0e})")
            else:
                parts.append(f"{r['variant']} {'killed' if 'killed' in r else 'failed'}")
        out.append(f"  Speed against the default (above 1 is faster): {'; '.join(parts)}.")
    path = {r["variant"]: r for r in rows if r["variant"] in ("parameter", "fresh") and _ok(r)}
    if len(path) == 2:
        p, f = path["parameter"], path["fresh"]

        def mean(r, k):
            return sum(x[k] for x in r["later"]) / len(r["later"])

        def iters(r):
            return "/".join(str(x.get("iterations", "?")) for x in r["later"])

        saved = mean(f, 'compile') - mean(p, 'compile')
        out.append(f"- The path: a Parameter saves {saved:.2f} s of CVXPY compilation "
                   f"per later solve. Clarabel's own time on the later solves is {mean(f, 'solver_time'):.2f} s fresh "
                   f"and {mean(p, 'solver_time'):.2f} s re-solved (iterations {iters(f)} and {iters(p)}; a re-solve "
                   "hands new data to the same Clarabel object, which starts its iterations afresh). The path in all: "
                   f"{f['total']:.1f} s fresh, {p['total']:.1f} s parametrized. What differs is Clarabel's iteration "
                   "count, which compilation does not explain (the two problems differ in how beta enters the "
                   "canonicalized data, and so in Clarabel's scaling); one path cannot tell whether that is "
                   "systematic.")
    paying = [v for v in VARIANTS[1:] if all(
        _ok(r) and b["total"] / r["total"] >= PAYS for b in base.values()
        for r in rows if (r["loss"], r["N"]) == (b["loss"], b["N"]) and r["variant"] == v)]
    out.append(f"- Worth keeping (at least {PAYS:g}x faster than the default on every instance above, certified "
               f"alike): {', '.join(paying) or 'none'}"
               + (". The CVXPY backend does not use it yet: adopting it is a change to make, and this page to rerun."
                  if paying else ". So the CVXPY backend keeps the primal form, CVXPY's default "
                  "canonicalization and Clarabel's default factorization. At the same iteration count the same "
                  "problem's solver time differs between canonicalizations (the column `solver (s)`: the KKT "
                  "system's ordering and fill, and the machine's noise), in either direction across instances. "
                  "For these losses at large N the torch backend is the tool (docs/benchmark_fista.md)."))
    return out


def main():
    args = case_parser(__doc__.splitlines()[0], CAP, DOCS / "benchmark_cvxpy_options.md").parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    rows = []
    for case in cases(args.quick):
        rows.append(run_fresh(__file__, case, args.cap))
        r = rows[-1]
        print(f"{case['loss']} N={case['N']} {case['variant']}: "
              + (f"{r['total']:.2f} s, gap {r['gap']:.1e}" if "total" in r else str(r.get("error") or "killed")),
              file=sys.stderr, flush=True)
    cmd = "python benchmarks/bench_cvxpy_options.py" + (" --quick" if args.quick else "")
    lines = [
        "# CVXPY's options on the logistic and cross-entropy programs", "",
        "The squared loss is compressed to a CVXPY problem whose size does not depend on N "
        "(docs/benchmark_exact.md). These losses cannot be: their data term is a sum of N exponential-cone terms, "
        "so CVXPY and Clarabel see N (logistic) or N c (cross-entropy) exponential cones whatever the formulation. "
        "This page measures where their time goes and what CVXPY and Clarabel offer against it.", "",
        "Instances: program (8), logistic, n = 8, d = 16 (labels the sign of a planted score plus noise); program "
        "(10), cross-entropy, n = 8, d = 16, c = 5, random labels (the instances of docs/benchmark_exact.md); "
        "beta = 0.2 beta_max. Clarabel at the project's settings (gap tolerances 1e-9). Every row is certified by "
        "the verifier on the whole problem from the returned Z and V (no refinement). Each row runs in a fresh "
        f"process killed at {args.cap:.0f} s.", "",
        "Variants: **primal** the project's default (`yhat = A(Z)` a constraint, CVXPY's default C++ "
        "canonicalization); **scipy**, **coo** the same problem canonicalized by CVXPY's SciPy and COO backends "
        "(`canon_backend`); **dual** the dual program (21)/(28) (`form=\"dual\"`, variable V of N x c); **faer** "
        "Clarabel's supernodal, multithreaded KKT factorization (`direct_solve_method=\"faer\"`, 2 threads) "
        "instead of QDLDL.", "",
        f"Machine: {machine(packages=('clarabel',))}. {measured()}", "",
        f"Regenerate: `{cmd}`", "",
        "## One solve, each variant", "", table(rows), "",
        f"## A path of three betas ({', '.join(str(f) for f in PATH)} beta_max): beta a CVXPY Parameter against "
        "fresh builds", "",
        "With beta a `cvxpy.Parameter` the problem is DPP: CVXPY canonicalizes it once and later solves only "
        "substitute the new beta.", "", path_table(rows), "",
        "## What pays", "", *summary(rows),
    ]
    write_doc(args.out, lines)


if __name__ == "__main__":
    main()
