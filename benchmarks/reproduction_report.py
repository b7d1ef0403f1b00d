"""Collect the full runs of docs/reproduction.md into the docs: figures and tables of numbers.

    python benchmarks/reproduction_report.py --runs runs

reads the output folders of the committed commands under ``RUNS`` (see :data:`EXPERIMENTS`),
copies their figures to ``DOCS/figures/reproduction/<experiment>_*.png`` and writes
``DOCS/reproduction_numbers.md`` (``--docs``, default ``docs/``):

* experiments of several seeds (``grok-ladder``, ``grok-suite --seeds``): per setting the mean,
  standard deviation and range over the seeds of the final test accuracy (all rows, ``x != 0``,
  ``x = 0``), the mean rank of the true label and the first step with 99% test accuracy; then one
  row per run with its Wilson 95% interval; the claims as the command evaluated them;
* ``grok-gates`` (``RUNS/gates``, and ``RUNS/gates_rerun`` for the reruns of issue 24, or one
  subfolder of either per command): one row per gate set and beta (certified relative gap,
  accuracies, the operand evidence of the true label), the means over gate seeds and one figure of
  every command's points;
* the single-seed experiments of issue 5: one row per run, the claims and effective ranks.

Nothing is retrained. An experiment whose folder is missing keeps the section it had in the
previous ``reproduction_numbers.md`` (marked as such) and its figures; without one, it is
reported as missing.
"""
import argparse
import json
import os
import platform
import re
import shutil
import sys

import torch

from cvxtransformer.experiments.spectra import rank_summary
from cvxtransformer.experiments.stats import aggregate, fmt_mean, fmt_value

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
EXPERIMENTS = ("ladder", "gates", "gates_rerun", "mod15_readings",  # issue 12: several seeds; issue 24: reruns
               "grok", "grok_variants", "grok_mod15_frac0.8", "kernel", "spectral", "spectral_periodicity")


def _fmt(v, digits=4):
    if v is None:
        return "not reached"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _ci(pair):
    return "" if not pair else f" [{pair[0]:.3f}, {pair[1]:.3f}]"


def _load(path):
    with open(path) as f:
        return json.load(f)


def run_rows(folder):
    """(name, metrics) of every run below ``folder`` (any depth; name: the relative folder), sorted."""
    out = []
    for root, _, files in os.walk(folder):
        if "metrics.json" in files:
            out.append((os.path.relpath(root, folder).replace(os.sep, "/"), _load(os.path.join(root, "metrics.json"))))
    return sorted(out)


def table(runs):
    """One row per run (single seeds: the issue-5 layout, with the x != 0 accuracy when recorded)."""
    head = ("| run | task | p | L | model | seed | status | steps | 99% train | 99% test | final train acc | "
            "final test acc [95% CI] | x != 0 | x = 0 | mean rank | final test loss | steps/s | wall time |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, m in runs:
        c = m["config"]
        model = m["label"].split(" ")[0]
        lines.append(
            f"| `{name}` | {c['task']} | {c['modulus']} | {c['layers']} | {model} | {c['seed']} | {m['status']} | "
            f"{m['steps_done']} | {_fmt(m['steps_to_99_train'])} | {_fmt(m['steps_to_99_test'])} | "
            f"{_fmt(m['final_train_accuracy'], 3)} | {_fmt(m['final_test_accuracy'], 3)}"
            f"{_ci(m.get('final_test_accuracy_ci95'))} | {fmt_value(m.get('final_test_accuracy_nonzero'))} | "
            f"{fmt_value(m.get('final_test_accuracy_zero'))} | {fmt_value(m.get('true_label_mean_rank'), 1)} | "
            f"{_fmt(m['final_test_loss'], 3)} | {m['steps_per_second'] or 0:.1f} | {m['wall_seconds'] / 60:.1f} min |")
    return lines


def aggregate_table(aggregates):
    """Per setting, over its seeds: mean ± standard deviation (min-max)."""
    head = ("| setting | seeds | reached 99% test | first step with 99% test | final test acc | x != 0 | x = 0 | "
            "mean rank of the true label | final train acc | steps done | wall time per run (min) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, a in aggregates.items():
        wall = dict(a["wall_seconds"], values=[])
        lines.append(
            f"| `{name}` | {', '.join(map(str, a['seeds']))} | {a['reached_99_test']} | "
            f"{fmt_mean(a['steps_to_99_test'], 0)} | {fmt_mean(a['final_test_accuracy'])} | "
            f"{fmt_mean(a['final_test_accuracy_nonzero'])} | {fmt_mean(a['final_test_accuracy_zero'])} | "
            f"{fmt_mean(a['true_label_mean_rank'], 1)} | {fmt_mean(a['final_train_accuracy'])} | "
            f"{fmt_mean(a['steps_done'], 0)} | {fmt_mean(wall, 1, 1 / 60)} |")
    return lines


def gates_summaries(folder):
    """The ``grok-gates`` summaries in ``folder`` or in its subfolders (one per command), {name: summary}."""
    out = {}
    for root in [folder] + sorted(os.path.join(folder, d) for d in os.listdir(folder)):
        path = os.path.join(root, "summary.json")
        if os.path.isfile(path) and "teacher" in (summary := _load(path)):
            out[os.path.relpath(root, folder)] = summary
    return out


def gates_means(rows):
    """Mean ± standard deviation (min-max) of the rows of ``grok-gates`` per gate set size and beta."""
    groups = {}
    for r in sorted(rows, key=lambda r: (r["kind"] != "oracle", r["h"], -r["beta_fraction"])):
        groups.setdefault((r["kind"], r["h"], r["beta_fraction"]), []).append(r)
    lines = ["| gates | h | beta / beta_max | seeds | certified | largest relative gap | train acc | "
             "test acc, x != 0 | mean rank |", "|---|---|---|---|---|---|---|---|---|"]
    for (kind, h, f), rs in groups.items():
        lines.append(f"| {kind} | {h} | {f:g} | {len(rs)} | {sum(r['certified'] for r in rs)}/{len(rs)} | "
                     f"{max(r['relative_gap'] for r in rs):.1e} | "
                     f"{fmt_mean(aggregate([r['train_accuracy'] for r in rs]))} | "
                     f"{fmt_mean(aggregate([r['final_test_accuracy_nonzero'] for r in rs]))} | "
                     f"{fmt_mean(aggregate([r['true_label_mean_rank'] for r in rs]), 1)} |")
    return lines


def gates_section(folder, figures, docs, prefix="gates"):
    """All ``grok-gates`` commands of the experiment: the means over gate seeds (oracle: over teachers)
    and one figure over every gate set (``<prefix>_all.png``), then each command's rows."""
    from cvxtransformer.experiments.gate_solves import plot_gates

    summaries = gates_summaries(folder)
    if not summaries:
        return ["No finished `grok-gates` command.", ""]
    rows = {}  # a point solved by two commands (same gates, split and beta) counts once: the smaller gap
    for r in (r for s in summaries.values() for r in s["rows"]):
        key = (r["kind"], r["h"], r["seed"], r["split_seed"], r["beta_fraction"])
        if key not in rows or r["relative_gap"] < rows[key]["relative_gap"]:
            rows[key] = r
    rows = list(rows.values())
    teachers = list({json.dumps(t, sort_keys=True): t for s in summaries.values() for t in s["teachers"]}.values())
    figure = os.path.join(figures, f"{prefix}_all.png")
    plot_gates(rows, teachers, figure)
    lines = ["Every command's points together (a point solved twice counted once, with its smaller gap): "
             "mean ± standard deviation (min-max) over the gate seeds (oracle: over the teachers).", ""] + gates_means(rows)
    lines += ["", f"Figure: [{prefix}_all.png]({os.path.relpath(figure, docs)})", ""]
    for name, summary in summaries.items():
        lines += [f"### `{name}`", ""] + gates_tables(summary)
    return lines


def gates_tables(summary):
    """The rows of one ``grok-gates`` command."""
    lines = []
    for t in summary.get("teachers", [summary["teacher"]]):
        lines.append(f"- Teacher: relu run of {t['task']}, seed {t['config']['seed']}, {t['neurons']} neurons, "
                     f"{t['steps_done']} steps, final test accuracy {t['final_test_accuracy']:.3f} (x != 0: "
                     f"{fmt_value(t['final_test_accuracy_nonzero'])}); its activation pattern equals the bilinear gate "
                     f"mask on {100 * t['mask_agreement']:.2f}% of (sample, neuron) pairs.")
    lines += ["", f"Solver: `fista` along each path of beta (warm starts, gap-safe screening), tol = "
              f"{summary['tol']:g}, budget per point {summary['options']}; the verifier computes every point's gap "
              "from Z, and `certified` says whether it reached tol.", ""]
    head = ("| gates | h | seed | beta / beta_max | relative gap | certified | iterations | seconds | train acc | "
            "test acc [95% CI] | x != 0 [95% CI] | x = 0 | mean rank | operand evidence of the true label "
            "(mean; fraction > 0) | pruned teacher, x != 0 |")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in summary["rows"]:
        lines.append(
            f"| {r['kind']} | {r['h']} | {r['seed']} | {r['beta_fraction']:g} | {r['relative_gap']:.1e} | "
            f"{_fmt(r['certified'])} | {r['iterations']} | {r['seconds']:.0f} | {r['train_accuracy']:.3f} | "
            f"{r['final_test_accuracy']:.3f}{_ci(r['final_test_accuracy_ci95'])} | "
            f"{fmt_value(r['final_test_accuracy_nonzero'])}{_ci(r.get('final_test_accuracy_nonzero_ci95'))} | "
            f"{fmt_value(r['final_test_accuracy_zero'])} | {r['true_label_mean_rank']:.1f} | "
            f"{fmt_value(r['true_label_operand_evidence'])}; {fmt_value(r['operand_evidence_positive_fraction'])} | "
            f"{fmt_value(r.get('teacher_accuracy_nonzero'))} |")
    refs = [r for r in summary["rows"] if r.get("reference_objective") is not None]
    if refs:
        lines += ["", "The teacher's own readout `Z_T = w3 (x) u1 (x) u2` on the same gates, a feasible point of "
                  "(12): its best multiple `min_{a >= 0} P(a Z_T)` against the certified optimum and `P(0)`; "
                  "`beta_T`: the largest beta at which any multiple of `Z_T` beats `Z = 0`:", "",
                  "| teacher seed | h | beta / beta_max | P(Z*) | P(0) | min_a P(a Z_T) | best a | beta_T / beta_max | "
                  "x != 0, Z* | x != 0, Z_T |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['seed']} | {r['h']} | {r['beta_fraction']:g} | {r['objective']:.1f} | "
                  f"{r['zero_objective']:.1f} | {r['reference_objective']:.1f} | {r['reference_scale']:.3g} | "
                  f"{r['reference_beta_fraction']:.4f} | {fmt_value(r['final_test_accuracy_nonzero'])} | "
                  f"{fmt_value(r['reference_test_accuracy_nonzero'])} |" for r in refs]
    return lines + [""]


def settings_line(runs):
    """The settings the runs share (taken from the first run; differences are listed per key)."""
    keys = ("dim", "gates", "heads", "hidden", "lr", "beta", "weight_decay", "batch_size", "train_fraction", "seed",
            "threads")
    parts = []
    for k in keys:
        values = sorted({"default" if m["config"].get(k) is None else json.dumps(m["config"][k]) for _, m in runs})
        parts.append(f"{k} = {' / '.join(values)}")
    betas = sorted({m["beta"] for _, m in runs if m.get("beta") is not None})
    if betas:
        parts.append("beta used = " + " / ".join(f"{b:g}" for b in betas))
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


def owner(filename):
    """The experiment whose figure ``filename`` is (the longest matching prefix), or None."""
    names = [e for e in EXPERIMENTS if filename.startswith(e + "_")]
    return max(names, key=len) if names else None


def copy_figures(folder, prefix, figures, docs, spectra=True):
    """Copy the experiment's own figures and, with ``spectra``, each run's ``spectrum.png`` (the
    per-run accuracy and loss plots repeat what the experiment's figures show)."""
    copied = []
    for root, _, files in sorted(os.walk(folder)):
        for file in sorted(files):
            if file.endswith(".png") and (root == folder or (spectra and file == "spectrum.png")):
                rel = os.path.relpath(os.path.join(root, file), folder).replace(os.sep, "_")
                target = os.path.join(figures, f"{prefix}_{rel}")
                shutil.copyfile(os.path.join(root, file), target)
                copied.append(os.path.relpath(target, docs))
    return copied


def previous_sections(report):
    """The sections ``## name`` of an existing report, {name: lines}."""
    if not os.path.exists(report):
        return {}
    sections, name = {}, None
    with open(report) as f:
        for line in f.read().splitlines():
            m = re.match(r"^## (\S+)$", line)
            if m:
                name = m.group(1)
                sections[name] = []
            elif name is not None:
                sections[name].append(line)
    return sections


def previous_machine(report):
    """The machine named in the header of a report written before sections named theirs, or None."""
    if not os.path.exists(report):
        return None
    with open(report) as f:
        for line in f.read().split("\n## ")[0].splitlines():
            if line.startswith("Machine: "):
                return line[len("Machine: "):].rstrip(".")
    return None


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def section(folder, experiment, figures, docs):
    """The lines of one experiment's section (its figures are copied)."""
    if experiment in ("gates", "gates_rerun"):
        return gates_section(folder, figures, docs, prefix=experiment)
    lines = []
    summary = _load(os.path.join(folder, "summary.json")) if os.path.exists(os.path.join(folder, "summary.json")) \
        else {}
    runs = run_rows(folder)
    lines += [settings_line(runs) if runs else "No finished run.", ""]
    if summary.get("aggregates"):
        lines += ["Per setting, over its seeds: mean ± standard deviation (min-max); the first step with 99% "
                  "test accuracy over the seeds that reached it.", ""]
        lines += aggregate_table(summary["aggregates"]) + ["", "Every run:", ""]
    lines += table(runs) + [""]
    if summary.get("claims"):
        lines += ["Claims as the command evaluated them (null: the runs needed are missing or not every seed "
                  "reached 99%):", ""]
        lines += [f"- `{k}`: {'null' if v is None else _fmt(v)}" for k, v in summary["claims"].items()] + [""]
    ranks = summary.get("effective_rank") or {}
    if not ranks and not summary.get("aggregates"):  # the runs that generalised (where collapse is defined)
        ranks = {name: rank_summary(m) for name, m in runs if m["steps_to_99_test"] is not None}
    lines += rank_table(ranks)
    # experiments over seeds keep their own figures only (a spectrum per run is in the run's folder)
    copied = copy_figures(folder, experiment, figures, docs, spectra=not summary.get("aggregates"))
    return lines + ["Figures: " + ", ".join(f"[{os.path.basename(f)}]({f})" for f in copied), ""]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=os.path.join(ROOT, "runs"), help="folder holding the experiment folders")
    parser.add_argument("--docs", default=DOCS, help="documentation folder to write into (default docs/)")
    args = parser.parse_args(argv)
    report = os.path.join(args.docs, "reproduction_numbers.md")
    figures = os.path.join(args.docs, "figures", "reproduction")
    found = [e for e in EXPERIMENTS if os.path.isdir(os.path.join(args.runs, e))]
    previous = previous_sections(report)
    os.makedirs(figures, exist_ok=True)
    for file in os.listdir(figures):  # only this script writes there: replace the figures of what is rerun
        if owner(file) in found or owner(file) is None:
            os.remove(os.path.join(figures, file))
    here = (f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}; "
            "every run used one torch thread")
    older = previous_machine(report)
    lines = ["# Reproduction: measured numbers", "",
             "Written by `python benchmarks/reproduction_report.py --runs runs` from the output folders of the",
             "commands in [reproduction.md](reproduction.md); the narrative and the verdicts are there.",
             "Each section names the machine its runs were made on.", ""]
    for experiment in EXPERIMENTS:
        folder = os.path.join(args.runs, experiment)
        lines += [f"## {experiment}", ""]
        if experiment in found:
            lines += [f"_Machine: {here}._", ""] + section(folder, experiment, figures, args.docs)
        elif experiment in previous:
            body = [line for line in previous[experiment] if not line.startswith("_Kept from the previous")]
            while body and body[0] == "":
                body.pop(0)
            if older and not (body and body[0].startswith("_Machine: ")):
                body = [f"_Machine: {older}._", ""] + body
            lines += [f"_Kept from the previous report: the folder `{experiment}` is not in "
                      f"`{os.path.basename(os.path.normpath(args.runs))}` here._", ""] + body
        else:
            lines += [f"Missing: no folder `{folder}`.", ""]
    with open(report + ".tmp", "w") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")
    os.replace(report + ".tmp", report)
    print(f"wrote {report} ({len(found)} experiment folders) and figures in {figures}")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
