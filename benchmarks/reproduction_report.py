"""Collect the full runs of docs/reproduction.md into the docs: figures and a table of numbers.

    python benchmarks/reproduction_report.py --runs runs

reads the output folders of the committed commands (``RUNS/grok``, ``RUNS/grok_variants``,
``RUNS/grok_mod15_frac0.8``, ``RUNS/kernel``, ``RUNS/spectral``, ``RUNS/spectral_periodicity``),
copies their figures to ``DOCS/figures/reproduction/`` and writes ``DOCS/reproduction_numbers.md``
(``--docs``, default ``docs/``): one row per run (steps to 99% train and test accuracy, grokking,
final and best accuracies, steps per second, training and wall time), the claims as the commands
evaluated them, and the effective-rank summaries of the spectral runs and of every run that
generalised. Nothing is retrained; a folder that is missing is reported as missing.
"""
import argparse
import json
import os
import platform
import shutil
import sys

import torch

from cvxtransformer.experiments.spectra import rank_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
EXPERIMENTS = ("grok", "grok_variants", "grok_mod15_frac0.8", "kernel", "spectral", "spectral_periodicity")


def _fmt(v, digits=4):
    if v is None:
        return "not reached"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _load(path):
    with open(path) as f:
        return json.load(f)


def run_rows(folder):
    """(name, metrics) of every run folder below ``folder`` (one level), sorted by name."""
    out = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, "metrics.json")
        if os.path.exists(path):
            out.append((name, _load(path)))
    return out


def table(runs):
    head = ("| run | task | p | L | model | status | steps | 99% train | 99% test | grokking | final train acc | "
            "final test acc | best test acc | final test loss | steps/s | train time | wall time |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, m in runs:
        c = m["config"]
        model = m["label"].split(" ")[0]
        lines.append(
            f"| `{name}` | {c['task']} | {c['modulus']} | {c['layers']} | {model} | {m['status']} | "
            f"{m['steps_done']} | {_fmt(m['steps_to_99_train'])} | {_fmt(m['steps_to_99_test'])} | "
            f"{_fmt(m['grokking_steps'])} | {_fmt(m['final_train_accuracy'], 3)} | "
            f"{_fmt(m['final_test_accuracy'], 3)} | {_fmt(m['best_test_accuracy'], 3)} | "
            f"{_fmt(m['final_test_loss'], 3)} | {m['steps_per_second'] or 0:.1f} | {m['train_seconds'] / 60:.1f} min | "
            f"{m['wall_seconds'] / 60:.1f} min |")
    return lines


def settings_line(runs):
    """The settings the runs share (taken from the first run; differences are listed per key)."""
    keys = ("dim", "gates", "heads", "lr", "beta", "weight_decay", "batch_size", "train_fraction", "seed", "threads")
    parts = []
    for k in keys:
        values = sorted({"default" if m["config"][k] is None else json.dumps(m["config"][k]) for _, m in runs})
        parts.append(f"{k} = {' / '.join(values)}")
    betas = sorted({m["beta"] for _, m in runs if m.get("beta") is not None})
    if betas:
        parts.append("beta used (summed objective) = " + " / ".join(f"{b:g}" for b in betas))
    return "Settings: " + ", ".join(parts) + "."


def rank_table(ranks):
    """Markdown table of effective-rank summaries {run: {matrix: summary}} (empty when none)."""
    if not ranks:
        return []
    lines = ["Effective rank per weight matrix (start, at 99% train, at 99% test, end, maximum before "
             "generalisation, collapse ratio = rank at generalisation / that maximum):", "",
             "| run | matrix | start | 99% train | 99% test | end | max | ratio | collapse |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, per in ranks.items():
        for matrix, r in per.items():
            lines.append(f"| {label} | {matrix} | {_fmt(r['start'], 1)} | {_fmt(r['at_99_train'], 1)} | "
                         f"{_fmt(r['at_99_test'], 1)} | {_fmt(r['end'], 1)} | "
                         f"{_fmt(r['max_before_generalisation'], 1)} | "
                         f"{_fmt(r['collapse_ratio'], 3)} | {_fmt(r['rank_collapse'])} |")
    return lines + [""]


def copy_figures(folder, prefix, figures, docs):
    """Copy the experiment's own figures and each run's ``spectrum.png`` (the per-run accuracy and
    loss plots repeat what the experiment's figures show)."""
    copied = []
    for root, _, files in sorted(os.walk(folder)):
        for file in sorted(files):
            if file.endswith(".png") and (root == folder or file == "spectrum.png"):
                rel = os.path.relpath(os.path.join(root, file), folder).replace(os.sep, "_")
                target = os.path.join(figures, f"{prefix}_{rel}")
                shutil.copyfile(os.path.join(root, file), target)
                copied.append(os.path.relpath(target, docs))
    return copied


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=os.path.join(ROOT, "runs"), help="folder holding the experiment folders")
    parser.add_argument("--docs", default=DOCS, help="documentation folder to write into (default docs/)")
    args = parser.parse_args(argv)
    report = os.path.join(args.docs, "reproduction_numbers.md")
    figures = os.path.join(args.docs, "figures", "reproduction")
    shutil.rmtree(figures, ignore_errors=True)  # only this script writes there
    os.makedirs(figures)
    lines = ["# Reproduction: measured numbers", "",
             "Written by `python benchmarks/reproduction_report.py --runs runs` from the output folders of the",
             "commands in [reproduction.md](reproduction.md); the narrative and the verdicts are there.",
             f"Machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch "
             f"{torch.__version__}; every run used one torch thread, up to two runs at a time.", ""]
    found = 0
    for experiment in EXPERIMENTS:
        folder = os.path.join(args.runs, experiment)
        if not os.path.isdir(folder):
            lines += [f"## {experiment}", "", f"Missing: no folder `{folder}`.", ""]
            continue
        found += 1
        runs = run_rows(folder)
        lines += [f"## {experiment}", "", settings_line(runs) if runs else "No finished run.", ""]
        lines += table(runs) + [""]
        ranks = {}
        summary = os.path.join(folder, "summary.json")
        if os.path.exists(summary):
            s = _load(summary)
            if s.get("claims"):
                lines += ["Claims as the command evaluated them (null: the runs needed are missing or none "
                          "reached 99%):", ""]
                lines += [f"- `{k}`: {'null' if v is None else _fmt(v)}" for k, v in s["claims"].items()] + [""]
            ranks = s.get("effective_rank") or {}
        if not ranks:  # the other experiments: the runs that generalised (where collapse is defined)
            ranks = {name: rank_summary(m) for name, m in runs if m["steps_to_99_test"] is not None}
        lines += rank_table(ranks)
        copied = copy_figures(folder, experiment, figures, args.docs)
        lines += ["Figures: " + ", ".join(f"[{os.path.basename(f)}]({f})" for f in copied), ""]
    with open(report + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(report + ".tmp", report)
    print(f"wrote {report} ({found} experiment folders) and figures in {figures}")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
