"""Program (6), linear multi-head self-attention: a worked example and a benchmark. Writes docs/mhsa.md.

1. Worked example: a two-head linear MHSA teacher; program (6) solved and certified; rank(Z*) heads
   recovered; network (5) at them equals P(Z*); Adam on network (5) with 1, rank and 2 rank heads
   against the certified bound (``cvxtransformer compare --program mhsa``), its plots copied to
   docs/figures/mhsa/.
2. Time to a certified relative gap of 1e-6 for Clarabel, SCS and the torch backend as N and d grow,
   each solve capped in time; the largest d each certifies within the cap at a fixed N.
3. A beta path: warm-started points against cold solves.
4. The exact path at N = 2,000, n = 8, d = 12, c = 2: the time to a certified 1e-7 of each CVXPY
   candidate (solver, form, PSD cones of the nuclear norm), each in a fresh process killed at a cap.

    python benchmarks/bench_mhsa.py            # about 30 minutes on 2 cores
    python benchmarks/bench_mhsa.py --quick    # small sizes, a minute
    python benchmarks/bench_mhsa.py --exact    # part 4 only, rewriting its section of docs/mhsa.md (8 min)
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np
from common import DOCS, load, machine, measured, time_to_gap, write_doc

import cvxtransformer as ct
from cvxtransformer.cli import main as cli

TOL = 1e-6


def teacher_data(N, n, d, c, heads=2, noise=0.1, seed=0):
    """X (N, n, d) with tokens of norm about 1, and sequence targets of a linear MHSA teacher with
    ``heads`` heads (Gaussian W1, W2), plus noise."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n, d)) / np.sqrt(d)
    Y = np.zeros((N, n, c))
    for _ in range(heads):
        W1, W2 = rng.standard_normal((d, d)), rng.standard_normal((d, c))
        Y += X @ W1 @ X.transpose(0, 2, 1) @ X @ W2
    return X, Y + noise * rng.standard_normal(Y.shape)


def problem_of(N, d, n=8, c=2, frac=0.1, seed=0):
    X, Y = teacher_data(N, n, d, c, seed=seed)
    problem = ct.make_problem(X, Y, program="mhsa", loss="squared", beta=1.0)
    return problem.with_beta(frac * problem.beta_max())


def timed_solve(N, d, solver, cap):
    """Build, solve and certify ``problem_of(N, d)`` in a fresh process killed at ``cap`` seconds
    (:func:`common.time_to_gap`)."""
    return time_to_gap(problem_of, (N, d), solver, cap, TOL)


EXACT_N, EXACT_D, EXACT_TOL, EXACT_TARGET = 2000, 12, 1e-7, 60.0
# (solver, options of ct.solve, what it is): the defaults first
EXACT_CANDIDATES = (
    ("clarabel", {}, "Clarabel, one PSD cone of side d^2 + dc = 168 (default)"),
    ("clarabel", {"nuclear_form": "rows"}, "Clarabel, 144 PSD cones of side dc + 1 = 25"),
    ("clarabel", {"form": "dual"}, "Clarabel, the dual: the spectral-norm LMI, side 168"),
    ("scs", {"nuclear_form": "joint"}, "SCS, one PSD cone of side 168"),
    ("scs", {}, "SCS, 144 PSD cones of side 25 (default)"),
)
EXACT_HEADER = "## The exact path at N = 2,000, d = 12"


def exact_section(cap):
    """Part 4: the lines of its section of docs/mhsa.md (each candidate run once, in a fresh process)."""
    start = (time.time(), load())
    rows = []
    for solver, options, what in EXACT_CANDIDATES:
        r = time_to_gap(problem_of, (EXACT_N, EXACT_D), solver, cap, EXACT_TOL, options)
        rows.append((what, solver, options, r))
        print(f"exact: {what}: {r}", flush=True)
    lines = [EXACT_HEADER, "",
             f"Squared loss, N = {EXACT_N:,} sequences, n = 8, d = {EXACT_D}, c = 2 (Z of shape (144, 24)), two-head "
             f"teacher, beta = 0.1 beta_max, compressed formulation; seconds to a relative gap of {EXACT_TOL:g} "
             "certified by the verifier (the solver's own dual point, no refinement; build, CVXPY's compilation, "
             f"the solve and the certificate), each run once in a fresh process killed at {cap:g} s. "
             "Clarabel runs its default 2 threads, SCS one.", "",
             f"{machine()}. {measured(start)}", "",
             "| candidate | `ct.solve` | seconds | certified gap | rank(Z*) | note |", "|---|---|---:|---:|---:|---|"]
    for what, solver, options, r in rows:
        call = f'"{solver}"' + "".join(f", {k}={v!r}" for k, v in options.items())
        sec = f"{r['seconds']:.1f}" if r.get("certified") else ""
        gap = "-" if r["gap"] is None else f"{r['gap']:.1e}"
        rank = "-" if r["rank"] is None else r["rank"]
        lines.append(f"| {what} | `{call}` | {sec} | {gap} | {rank} | {r['note']} |")
    best = min((r["seconds"], what) for what, _, _, r in rows if r.get("certified")) if \
        any(r.get("certified") for *_, r in rows) else None
    lines += ["", ("Target (certified 1e-7 within 60 s): " + ("**MET**" if best and best[0] <= EXACT_TARGET else
                                                              "**MISSED**")
                   + (f", best {best[1]}: {best[0]:.1f} s." if best else ", no candidate certified within the cap.")),
              "", *EXACT_READING]
    return lines


EXACT_READING = [
    "Why. Clarabel, an interior-point method, factors at every iteration a KKT system that holds, for a PSD cone",
    "of side t, a dense block of (t (t + 1) / 2)^2 numbers: 2.0e8 for the cone of side 168, whatever N (compressed,",
    "the CVXPY problem does not grow with N). In the primal, CVXPY's normNuc makes the cone's matrix itself",
    "variables (16,068 variables in all); in the dual, the LMI is affine in the 1,872 entries of U, the compressed",
    "dual point, and Clarabel certifies in under a minute: for Clarabel, ask for `form=\"dual\"`. The rows form",
    "cuts the blocks to 144 of 325^2 (1.5e7 in all), but W, shared by the 144 cones, couples them and Clarabel's",
    "factor fills: slower still. Clarabel's settings were not timed: none removes a dense block (chordal",
    "decomposition finds nothing to split in it; the factorisation is already faer's supernodal one). SCS factors",
    "its linear system once and projects onto the cones at every iteration (one eigendecomposition each); in the",
    "rows form, its default here (`nuclear_form=\"auto\"`), it needs far fewer iterations (measured once by hand:",
    "475 against about 2,450 joint). The torch backend (`fista`, docs/benchmark_exact.md) certifies the same",
    "problem in about a second.",
]


def replace_section(path, lines):
    """Rewrite the section that starts with ``lines[0]`` (up to the next ``## `` heading) in the page at
    ``path``, or append it."""
    with open(path) as f:
        page = f.read().rstrip("\n").split("\n")
    start = page.index(lines[0]) if lines[0] in page else len(page)
    end = next((i for i in range(start + 1, len(page)) if page[i].startswith("## ")), len(page))
    tail = [""] + page[end:] if end < len(page) else []
    return page[:start] + ([""] if start == len(page) else []) + lines + tail


def example(out_figures, steps):
    X, Y = teacher_data(300, 6, 4, 2, seed=1)
    problem = ct.make_problem(X, Y, program="mhsa", loss="squared", beta=1.0)
    problem = problem.with_beta(0.05 * problem.beta_max())
    result = ct.solve(problem, "clarabel", tol=1e-9, refine=True)
    heads = ct.recover_weights(problem, result.Z)
    s = np.linalg.svd(result.Z, compute_uv=False)
    info = dict(N=300, n=6, d=4, c=2, beta=problem.beta, beta_max=problem.beta_max(),
                P=result.certificate.primal_objective, D=result.certificate.dual_objective,
                gap=result.certificate.relative_gap, rank=result.certificate.support_size,
                singular_values=s[:6].tolist(), heads=heads.heads,
                network_objective=ct.nonconvex_objective(problem, heads),
                penalties=[float(0.5 * problem.beta * (np.sum(a ** 2) + np.sum(b ** 2))) for a, b in zip(heads.W1, heads.W2)])
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.npz")
        np.savez(data, X=X, y=Y)
        run = os.path.join(tmp, "run")
        argv = ["compare", data, "--program", "mhsa", "--loss", "squared", "--beta", repr(problem.beta),
                "--steps", str(steps), "--lr", "0.01", "--seed", "0", "--out-dir", run, "--quiet", "--json"]
        info["compare_command"] = "cvxtransformer " + " ".join(a if a != data else "DATA.npz" for a in argv[:-4]) + \
            " --out-dir RUN"
        code = cli(argv)
        with open(os.path.join(run, "compare.json")) as f:
            info["compare"] = json.load(f)
        os.makedirs(out_figures, exist_ok=True)
        for name in ("objective.png", "singular_values.png"):
            shutil.copy(os.path.join(run, name), os.path.join(out_figures, name))
        info["compare_exit"] = code
    return info


def benchmark(sizes, dims, N_fixed, cap, solvers):
    grid = []
    for N in sizes:
        for d in dims:
            for solver in solvers:
                r = timed_solve(N, d, solver, cap)
                grid.append(dict(N=N, d=d, solver=solver, **r))
                print(f"N={N:6d} d={d:3d} {solver:9s} {r['seconds']:8.2f}s gap {r['gap']} rank {r['rank']} {r['note']}",
                      flush=True)
    largest = {}
    for solver in solvers:
        largest[solver] = None
        for d in sorted(set(dims) | {2 * max(dims), 3 * max(dims)}):
            r = timed_solve(N_fixed, d, solver, cap)
            print(f"largest-d probe N={N_fixed} d={d} {solver}: {r['seconds']:.1f}s gap {r['gap']} {r['note']}",
                  flush=True)
            if r["gap"] is None or not r.get("certified"):
                break
            largest[solver] = (d, r["seconds"])
    return grid, largest


def path(N, d, n_betas):
    problem = problem_of(N, d, frac=1.0)
    t = time.perf_counter()
    points = ct.solve_path(problem, n_betas=n_betas, ratio=0.02, tol=TOL)
    warm = time.perf_counter() - t
    cold_time, cold_iters = 0.0, 0
    for p in points[1:]:
        t = time.perf_counter()
        r = ct.solve(problem.with_beta(p.beta), "fista", tol=TOL, refine=False)
        cold_time += time.perf_counter() - t
        cold_iters += r.iterations
    rows = [(p.beta / problem.beta_max(), p.result.iterations, p.seconds, p.result.certificate.support_size,
             problem.program.n_blocks - p.screened, p.certified) for p in points]
    return rows, warm, cold_time, cold_iters


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(DOCS / "mhsa.md"))
    parser.add_argument("--exact", action="store_true", help="part 4 only: rewrite its section of --out")
    parser.add_argument("--cap", type=float, default=150.0, help="seconds before a candidate of part 4 is killed")
    args = parser.parse_args()
    if args.exact:
        write_doc(args.out, replace_section(args.out, exact_section(args.cap)))
        return
    start = time.perf_counter()
    if args.quick:
        sizes, dims, N_fixed, cap, steps, n_betas = (200,), (3, 4), 200, 20.0, 300, 4
    else:
        sizes, dims, N_fixed, cap, steps, n_betas = (200, 1000, 5000), (4, 8, 12), 1000, 60.0, 3000, 10
    ex = example(DOCS / "figures" / "mhsa", steps)
    grid, largest = benchmark(sizes, dims, N_fixed, cap, ("clarabel", "scs", "fista"))
    path_rows, warm, cold_time, cold_iters = path(2000 if not args.quick else 200, 8 if not args.quick else 4, n_betas)
    minutes = (time.perf_counter() - start) / 60
    cmd = "python benchmarks/bench_mhsa.py" + (" --quick" if args.quick else "")
    c = ex["compare"]
    lines = [
        "# Linear multi-head self-attention: the nuclear-norm program (6)", "",
        "Sahiner et al. (*Unraveling Attention via Convex Duality*, arXiv 2205.08078; ICML 2022) show that training",
        "a linear multi-head self-attention layer with weight decay,", "",
        "    min_{W1j, W2j}  sum_i L( sum_j X_i W1j X_i^T X_i W2j , Y_i ) + beta/2 sum_j (||W1j||_F^2 + ||W2j||_F^2)   (5)",
        "", "is the convex program", "",
        "    min_Z  sum_i L( sum_{k,l} G_i[k,l] X_i Z^(k,l) , Y_i ) + beta ||Z||_*,     G_i = X_i^T X_i          (6)",
        "",
        "with Z of shape (d^2, dc) made of d x c blocks Z^(k,l) (row (k, a) = k d + a, column (l, b) = l c + b).",
        "One head is the rank-one Z = u v^T with u[k d + a] = W1[a, k] and v[l c + b] = W2[l, b]; the nuclear norm",
        "is what weight decay becomes; the rank of Z* is the number of heads the optimum needs. In the package it",
        "is `make_problem(X, y, program=\"mhsa\", ...)`: a `LinearMHSAProgram` (map, adjoint, torch operator) with",
        "the `NuclearNorm` regulariser (value, singular-value-thresholding prox, spectral dual norm, rank",
        "screening, CVXPY forms); every solver, the verifier and the command line treat it like the group-lasso",
        "programs. Targets (N, n, c) are per token; any other target is per sequence, through the mean-pooled",
        "output (1/n sum_t Yhat_i[t]), with any of the three losses.", "",
        "**Dual.** D(V) = sum_i -L*(-V_i) subject to ||A^T V||_2 <= beta (the spectral norm, dual of the nuclear",
        "norm); CVXPY builds it as the linear matrix inequality [[beta I, S], [S^T, beta I]] >= 0, and the primal",
        "is read back from its multiplier Lambda as Z = -2 Lambda_12. beta_max = ||A^T(-grad L(0))||_2.", "",
        "**CVXPY forms.** CVXPY writes ||Z||_* <= t as one PSD cone of side p + q (p x q = d^2 x dc: 168 for d = 12,",
        "c = 2). With b_i the rows of Z and Z^T Z = sum_i b_i b_i^T, also ||Z||_* = min 1/2 (tr W + sum_i s_i) over",
        "[[W, b_i], [b_i^T, s_i]] >= 0, i = 1..d^2: d^2 cones of side dc + 1 sharing W (dc x dc), the \"rows\" form",
        "(`ct.solve(..., nuclear_form=\"rows\")`). SCS takes it by default where its cones cost fewer flops",
        "(`nuclear_form=\"auto\"`, as here): it needs far fewer iterations there (the last section). Clarabel keeps",
        "the joint cone, because the shared W fills the factor of its KKT system (at d = 8, N = 2,000, measured",
        "once: 148 s in the rows form against 24 s joint, load 3-5); at d = 12 it is fastest on the dual.",
        "",
        "**Recovery.** From the SVD Z = sum_j s_j u_j v_j^T, head j is W1j[a, k] = sqrt(s_j) u_j[k d + a] and",
        "W2j[l, b] = sqrt(s_j) v_j[l c + b]: then beta/2 (||W1j||^2 + ||W2j||^2) = beta s_j, and network (5)",
        "with rank(Z) heads has objective P(Z). P(Z*) bounds objective (5) from below for every number of heads.",
        "",
        f"Machine: {machine()}. {measured()} Regenerate: `{cmd}` ({minutes:.1f} min). The last section alone: "
        "`python benchmarks/bench_mhsa.py --exact`.", "",
        "## Worked example", "",
        f"N = {ex['N']} sequences of n = {ex['n']} tokens, d = {ex['d']}, c = {ex['c']} outputs per token, targets of "
        "a two-head linear MHSA teacher plus noise 0.1, squared loss, beta = 0.05 beta_max "
        f"(beta = {ex['beta']:.4g}, beta_max = {ex['beta_max']:.4g}). Clarabel, certified with the refined dual point:", "",
        f"- P(Z*) = {ex['P']:.10g}, D(V) = {ex['D']:.10g}, relative gap {ex['gap']:.1e};",
        "- singular values of Z*: " + ", ".join(f"{v:.4g}" for v in ex["singular_values"]) + f"; rank(Z*) = {ex['rank']};",
        f"- recovered heads: {ex['heads']}, with penalties beta/2 (||W1j||^2 + ||W2j||^2) = "
        + ", ".join(f"{v:.6g}" for v in ex["penalties"]) + " (= beta s_j);",
        f"- network (5) at the recovered heads: objective {ex['network_objective']:.10g} (= P(Z*)).", "",
        f"Adam on network (5), `{ex['compare_command']}`:", "",
        "| run | heads m | objective | certified gap over D(V) | relative |", "|---|---:|---:|---:|---:|"]
    for name, m in c["models"].items():
        lines.append(f"| {name} | {m['heads']} | {m['objective']:.8g} | {m['certified_gap']:.4g} | "
                     f"{m['relative_certified_gap']:.2e} |")
    lines += ["", "![objective against time](figures/mhsa/objective.png)",
              "![singular values of Z* and of the networks](figures/mhsa/singular_values.png)", "",
              "## Time to a certified 1e-6 gap", "",
              f"Squared loss, two-head teacher, n = 8, c = 2, beta = 0.1 beta_max; each solve capped at {cap:g} s "
              "(`time_limit`); the gap is the verifier's, with the solver's own dual point (no refinement). "
              "`fista` is the torch backend on the CPU (float64). A blank time means not certified within the cap "
              "(the note says why).", "",
              "| N | d | Z shape | solver | seconds | certified gap | rank(Z*) | note |", "|---:|---:|---|---|---:|---:|---:|---|"]
    for r in grid:
        gap = "-" if r["gap"] is None else f"{r['gap']:.1e}"
        sec = f"{r['seconds']:.2f}" if r.get("certified") else ""
        lines.append(f"| {r['N']} | {r['d']} | ({r['d'] ** 2}, {2 * r['d']}) | {r['solver']} | {sec} | {gap} | "
                     f"{r['rank'] if r['rank'] is not None else '-'} | {r['note']} |")
    lines += ["", f"Largest d certified within {cap:g} s at N = {N_fixed} (probing d = "
              + ", ".join(str(d) for d in sorted(set(dims) | {2 * max(dims), 3 * max(dims)})) + "):", ""]
    for solver, v in largest.items():
        lines.append(f"- {solver}: " + ("none" if v is None else f"d = {v[0]} ({v[1]:.1f} s)"))
    lines += ["", "## A beta path", "",
              f"`ct.solve_path` over {len(path_rows)} values of beta from beta_max down to 0.02 beta_max, warm-started, "
              f"tol 1e-6: {warm:.2f} s in all; the same points solved cold: {cold_time:.2f} s and {cold_iters} "
              "iterations.", "",
              "| beta / beta_max | iterations | seconds | rank(Z*) | proved rank bound | certified |",
              "|---:|---:|---:|---:|---:|---|"]
    for frac, iters, sec, rank, bound, ok in path_rows:
        lines.append(f"| {frac:.3g} | {iters} | {sec:.2f} | {rank} | {bound} | {ok} |")
    lines += ["", "What is proved and what is not:", "",
              "- *Proved*: the rank bound. At a feasible dual point V with gap g, the dual optimum lies within",
              "  r = sqrt(2 g / mu) of V, so sigma_i(A^T V*) <= sigma_i(A^T V) + r ||A|| (Weyl); only singular values",
              "  of A^T V* equal to beta carry the solution, hence rank(Z) <= #{i : sigma_i(A^T V) + r ||A|| >= beta}",
              "  for every optimum Z. ||A|| is computed exactly when d^3 <= 1000 and bounded above otherwise.",
              "- *A speed-up, not a proof*: warm starts. Every point is certified on the whole problem.",
              "- No working set: a working set of row and column subspaces was tried and did not pay on these sizes,",
              "  because the map costs O(N d^3 c) whatever the subspace and the SVD of the prox is cheap beside it."]
    if not args.quick:
        lines += [""] + exact_section(args.cap)
    write_doc(args.out, lines)


if __name__ == "__main__":
    main()
