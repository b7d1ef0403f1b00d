"""The gated-ReLU multi-head self-attention program: a worked example, time to a certified 1e-6 gap,
and the ReLU network against the gated optimum as the number of gates grows. Rewrites the generated
blocks of docs/gated_mhsa.md (one per part; the rest of the page is prose).

1. ``example``: data of a two-head ReLU-attention teacher; the gated program with P = 4 gates solved
   and certified; the ranks of each Z*_g, the heads recovered on their gates, the network at them
   (numpy and torch) against P(Z*); ``cvxtransformer compare --program gated_mhsa`` (the gated network
   with below, at and above sum_g rank(Z*_g) heads, and the ReLU network with as many), its plots
   copied to docs/figures/gated_mhsa/.
2. ``timing``: seconds to a certified relative gap of 1e-6 for Clarabel, SCS and the torch backend as
   N, d and P grow from a base instance, each solve capped in wall time in a fresh process.
3. ``relu``: the optimum P(Z*) of the gated program for P = 1 ... 64 random gates (and of program (6)),
   against the objective of the ReLU network trained by Adam from several seeds, at the same beta.

    python benchmarks/bench_gated_mhsa.py                  # every part, about 10 minutes on 2 cores
    python benchmarks/bench_gated_mhsa.py --part timing    # one part: example, timing or relu
    python benchmarks/bench_gated_mhsa.py --quick          # small sizes, a smoke run (a minute)
"""
import argparse
import contextlib
import io
import json
import os
import shutil
import tempfile
import time

import numpy as np
from common import DOCS, load, machine, measured, replace_block, time_to_gap, write_doc

import cvxtransformer as ct
from cvxtransformer.cli import main as cli

TOL = 1e-6
DOC = DOCS / "gated_mhsa.md"
FIGURES = DOCS / "figures" / "gated_mhsa"


def relu_teacher(N, n, d, c, heads=2, noise=0.1, seed=0):
    """X (N, n, d) with tokens of norm about 1, and sequence targets of a ReLU-attention teacher,
    ``sum_j relu(X W1j X^T) X W2j`` with Gaussian W1j, W2j, plus noise."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n, d)) / np.sqrt(d)
    Y = np.zeros((N, n, c))
    for _ in range(heads):
        W1, W2 = rng.standard_normal((d, d)), rng.standard_normal((d, c))
        Y += np.maximum(X @ W1 @ X.transpose(0, 2, 1), 0) @ X @ W2
    return X, Y + noise * rng.standard_normal(Y.shape)


def problem_of(N, d, P, n=6, c=2, frac=0.1, seed=0):
    """The gated program with P gates on the teacher's data, at beta = frac * beta_max."""
    X, Y = relu_teacher(N, n, d, c, seed=seed)
    problem = ct.make_problem(X, Y, program="gated_mhsa", loss="squared", beta=1.0, gates=P, gate_seed=seed)
    return problem.with_beta(frac * problem.beta_max())


# ----------------------------------------------------------------------------- 1. example
def example(steps, quick):
    N, n, d, c, P = (120, 5, 3, 2, 3) if quick else (200, 6, 4, 2, 4)
    X, Y = relu_teacher(N, n, d, c, seed=1)
    problem = ct.make_problem(X, Y, program="gated_mhsa", loss="squared", beta=1.0, gates=P, gate_seed=0)
    problem = problem.with_beta(0.1 * problem.beta_max())
    result = ct.solve(problem, "clarabel", tol=1e-9, refine=True)
    c_ = result.certificate
    heads = ct.recover_weights(problem, result.Z)
    from cvxtransformer.nn.mhsa import GatedMHSA

    net = GatedMHSA.from_weights(heads, problem.program.H, n)
    torch_value = net.objective(net.encode_inputs(X), problem.T, problem.loss, problem.beta).item()
    s = np.linalg.svd(result.Z, compute_uv=False)
    lines = [f"N = {N} sequences of n = {n} tokens, d = {d}, c = {c} outputs per token, targets of a two-head "
             f"ReLU-attention teacher plus noise 0.1, P = {P} gates (`gates={P}, gate_seed=0`), squared loss, "
             f"beta = 0.1 beta_max (beta = {problem.beta:.4g}, beta_max = {problem.beta_max():.4g}); Z has shape "
             f"{problem.program.shape}. Clarabel, certified with the refined dual point:", "",
             f"- P(Z*) = {c_.primal_objective:.10g}, D(V) = {c_.dual_objective:.10g}, relative gap "
             f"{c_.relative_gap:.1e}, KKT stationarity {c_.kkt_stationarity:.1e};", "",
             "| gate g | rank(Z*_g) | singular values of Z*_g (above 1e-9 of the largest) | heads on gate g |",
             "|---:|---:|---|---:|"]
    ranks = problem.regularizer.ranks(result.Z)
    for g in range(P):
        shown = ", ".join(f"{v:.4g}" for v in s[g] if v > 1e-9 * s.max())
        lines.append(f"| {g} | {ranks[g]} | {shown or '-'} | {int(np.sum(heads.gate == g))} |")
    lines += ["", f"- heads recovered: {heads.heads} = sum_g rank(Z*_g), head j on gate `gate[j]`, with "
              "beta/2 (||W1j||^2 + ||W2j||^2) = beta sigma_j;",
              f"- the network at the recovered heads: objective {ct.nonconvex_objective(problem, heads):.10g} (numpy, "
              f"`GatedMHSAReduction.objective`) and {torch_value:.10g} (torch, `GatedMHSA`), = P(Z*).", ""]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.npz")
        np.savez(data, X=X, y=Y, H=problem.program.H)
        run = os.path.join(tmp, "run")
        argv = ["compare", data, "--program", "gated_mhsa", "--loss", "squared", "--beta", repr(problem.beta),
                "--steps", str(steps), "--lr", "0.01", "--seed", "0", "--tol", "1e-9", "--out-dir", run, "--quiet",
                "--json"]
        command = "cvxtransformer " + " ".join(a if a != data else "DATA.npz" for a in argv[:-4]) + " --out-dir RUN"
        with contextlib.redirect_stdout(io.StringIO()):  # the --json summary, read back from the file below
            cli(argv)
        with open(os.path.join(run, "compare.json")) as f:
            out = json.load(f)
        os.makedirs(FIGURES, exist_ok=True)
        for name in ("objective.png", "singular_values.png"):
            shutil.copy(os.path.join(run, name), FIGURES / name)
    lines += [f"Adam on the gated network and on the ReLU network, `{command}` (DATA.npz holds X, y and the gates "
              "H, so every model sees the same gates):", "",
              "| run | heads m | objective | certified gap over D(V) | relative | objective - P(Z*) |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, m in out["models"].items():
        if m["bound_applies"]:
            gap = f"{m['certified_gap']:.4g} | {m['relative_certified_gap']:.2e}"
        else:
            gap = "not bounded | -"
        lines.append(f"| {name} | {m['heads']} | {m['objective']:.8g} | {gap} | "
                     f"{m['objective'] - c_.primal_objective:+.4g} |")
    lines += ["", "![objective against time](figures/gated_mhsa/objective.png)",
              "![singular values of each Z*_g and of the networks](figures/gated_mhsa/singular_values.png)"]
    return lines


# ----------------------------------------------------------------------------- 2. timing
def timing(quick):
    base = (200, 3, 2)
    grid = [base] if quick else [base, (1000, 3, 2), (5000, 3, 2), (200, 4, 2), (200, 6, 2), (200, 3, 8),
                                 (200, 3, 32)]
    cap = 10.0 if quick else 30.0
    rows = []
    for N, d, P in grid:
        for solver in ("clarabel", "scs", "fista"):
            r = time_to_gap(problem_of, (N, d, P), solver, cap, TOL)
            rows.append(dict(N=N, d=d, P=P, solver=solver, **r))
            print(f"N={N:5d} d={d} P={P:2d} {solver:9s} {r['seconds']:7.2f}s gap {r['gap']} {r['note']}", flush=True)
    lines = [f"Squared loss, ReLU-attention teacher, n = 6, c = 2, beta = 0.1 beta_max, from the base instance N = "
             f"{base[0]}, d = {base[1]}, P = {base[2]}, one size grown at a time; each solve capped at {cap:g} s of "
             "wall time (CVXPY's compilation included) in a fresh process. The gap is the verifier's at the solver's "
             "own dual point (no refinement). `fista` is the torch backend on the CPU (float64) with its working "
             "set of gates. A blank time means not certified within the cap (the note says why).", "",
             "| N | d | P | Z shape | solver | seconds | certified gap | sum_g rank(Z*_g) | note |",
             "|---:|---:|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        gap = "-" if r["gap"] is None else f"{r['gap']:.1e}"
        sec = f"{r['seconds']:.2f}" if r.get("certified") else ""
        rank = "-" if r["rank"] is None else r["rank"]
        lines.append(f"| {r['N']} | {r['d']} | {r['P']} | ({r['P']}, {r['d'] ** 2}, {2 * r['d']}) | {r['solver']} | "
                     f"{sec} | {gap} | {rank} | {r['note']} |")
    return lines


# ----------------------------------------------------------------------------- 3. relu
def relu(steps, quick):
    from cvxtransformer.nn.mhsa import ReluMHSA
    from cvxtransformer.nn.trainer import train

    N, n, d, c = (100, 5, 3, 2) if quick else (200, 6, 4, 2)
    gates = (1, 2, 4) if quick else (1, 2, 4, 8, 16, 32, 64)
    seeds, heads = (0, 1) if quick else (0, 1, 2), 8
    X, Y = relu_teacher(N, n, d, c, seed=2)
    linear = ct.make_problem(X, Y, program="mhsa", loss="squared", beta=1.0)
    beta = 0.1 * linear.beta_max()
    optimum = {"program (6), no gate": ct.solve(linear.with_beta(beta), "fista", tol=1e-8).certificate}
    ranks = {"program (6), no gate": optimum["program (6), no gate"].support_size}
    H = ct.sample_gate_matrices(max(gates), d, seed=0)  # P gates: the first P of these, so the sets are nested
    sets = {f"P = {P} random gates": H[:P] for P in gates}
    sets[f"the open gate (H = 0) and the {max(gates)} random gates"] = np.concatenate([np.zeros((1, d, d)), H])
    for name, gates_H in sets.items():
        problem = ct.make_problem(X, Y, program="gated_mhsa", loss="squared", beta=beta, H=gates_H)
        result = ct.solve(problem, "fista", tol=1e-8)
        optimum[name], ranks[name] = result.certificate, result.certificate.support_size
        print(f"{name}: P(Z*) {result.certificate.primal_objective:.6g} gap {result.certificate.relative_gap:.1e} "
              f"rank {result.certificate.support_size}", flush=True)
    runs = []
    for seed in seeds:
        net = ReluMHSA(n, d, n * c, heads, seed=seed)
        run = train(net, X, linear.T, "squared", beta, lr=0.01, steps=steps, seed=seed)
        runs.append(run.objective)
        print(f"relu_mhsa seed {seed}: objective {run.objective:.6g} ({run.seconds:.1f} s)", flush=True)
    best = min(runs)
    lines = [f"N = {N}, n = {n}, d = {d}, c = {c} per token, a two-head ReLU-attention teacher plus noise 0.1, "
             f"squared loss, one beta for every model: beta = 0.1 beta_max of program (6) (= {beta:.4g}). The ReLU "
             f"network (`relu_mhsa`, {heads} heads, weight decay beta/2 sum_j (||W1j||^2 + ||W2j||^2), the penalty "
             f"of the gated network) is trained by Adam (lr 0.01, {steps} steps, full batch) from {len(seeds)} seeds: "
             "objectives " + ", ".join(f"{v:.6g}" for v in runs) + f"; the best, {best:.6g}, is compared below with "
             "the certified optimum of each convex program (solved by the torch backend to a certified 1e-8).", "",
             "| convex program | P(Z*) | certified relative gap | sum_g rank(Z*_g) | best ReLU objective - P(Z*) | "
             "relative |", "|---|---:|---:|---:|---:|---:|"]
    for name, cert in optimum.items():
        diff = best - cert.primal_objective
        lines.append(f"| {name} | {cert.primal_objective:.8g} | {cert.relative_gap:.1e} | {ranks[name]} | "
                     f"{diff:+.4g} | {diff / cert.primal_objective:+.2e} |")
    return lines


# ----------------------------------------------------------------------------- the page
def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("example", "timing", "relu"), action="append",
                        help="the part(s) to run (default: every part)")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--out", default=str(DOC))
    args = parser.parse_args()
    parts = args.part or ["example", "timing", "relu"]
    steps = 300 if args.quick else 2000
    text = open(args.out).read()
    for part in parts:
        at_start = (time.time(), load())
        lines = {"example": lambda: example(steps, args.quick), "timing": lambda: timing(args.quick),
                 "relu": lambda: relu(steps, args.quick)}[part]()
        command = f"python benchmarks/bench_gated_mhsa.py --part {part}" + (" --quick" if args.quick else "")
        lines += ["", f"Machine: {machine()}. {measured(at_start)}"]
        text = replace_block(text, part, lines, command, DOC)
    write_doc(args.out, text.rstrip("\n").split("\n"))


if __name__ == "__main__":
    main()
