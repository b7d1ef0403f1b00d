"""``cvxtransformer spectral``: spectral analysis during training (UCSD report, Section 7).

    cvxtransformer spectral --steps 3000 --out-dir runs/spectral

Trains the convex network with and without Fastfood preconditioning (and, with
``--include-standard``, the standard transformer) on one task, recording the singular values
of every layer's weight matrix at every evaluation, and writes per run ``DIR/<name>/``
(``metrics.json``, ``spectra.npz``, ``spectrum.png``: accuracy curves beside the effective ranks
and the top singular values over iterations), plus ``effective_rank.png`` (all runs) and
``summary.json``: per run and matrix the effective rank at the start, at 99% train accuracy,
at 99% test accuracy, at the end and its maximum, and ``rank_collapse``.

Rank collapse is measured, not assumed: ``collapse_ratio`` is the effective rank at
generalisation (the step of 99% test accuracy, or the end of the run when not reached) divided
by its maximum over the steps before; ``rank_collapse`` is ``collapse_ratio <= 0.5``.
"""
import os

from .config import add_model_arguments, add_task_arguments, config_from_args, default_eval_every, task_title

COLLAPSE = 0.5


def _at(steps, values, step):
    """Value at the last recorded step <= step (None when step is None)."""
    if step is None:
        return None
    import numpy as np

    i = max(0, np.searchsorted(steps, step, side="right") - 1)
    return float(values[i])


def rank_summary(metrics):
    """Effective-rank summary per tracked matrix of one run (see the module docstring)."""
    import numpy as np  # here: the command line imports this module at start-up (config.validate says why)

    out = {}
    gen = metrics["steps_to_99_test"]
    for name, s in metrics["spectral"].items():
        steps, er = np.asarray(s["steps"]), np.asarray(s["effective_rank"], dtype=float)
        at_gen = _at(steps, er, gen if gen is not None else steps[-1])
        upto = gen if gen is not None else steps[-1]
        peak = float(er[steps <= upto].max())
        ratio = at_gen / peak if peak > 0 else None
        out[name] = {"start": float(er[0]), "at_99_train": _at(steps, er, metrics["steps_to_99_train"]),
                     "at_99_test": _at(steps, er, gen), "end": float(er[-1]), "max_before_generalisation": peak,
                     "collapse_ratio": ratio, "rank_collapse": None if ratio is None else ratio <= COLLAPSE}
    return out


def configure(parser):
    add_task_arguments(parser, "division", 2,
                       "Fastfood features per token of the preconditioned run (default: the embedding size)")
    parser.add_argument("--include-standard", action="store_true", help="also track the standard transformer")
    add_model_arguments(parser, steps_default=3000)


def run(args):
    """Entry point of the command line: ``run(args) -> exit code``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..core.io import save_figure, write_json
    from .runner import row, run_convex_pair

    base = dict(task=args.task, modulus=args.modulus, layers=args.layers)
    if args.spectral_every is None:  # spectra at every evaluation
        probe = config_from_args(args, model="convex", kernel_features=None, **base)
        base["spectral_every"] = probe.eval_every or default_eval_every(probe)
    results = run_convex_pair(args, base, standard=args.include_standard)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, m) in enumerate(results.items()):
        color = plt.cm.tab10(i)
        c = m["curves"]
        axes[0].plot(c["step"], c["train_accuracy"], ":", color=color, label=f"{m['label']} train")
        axes[0].plot(c["step"], c["test_accuracy"], "-", color=color, label=f"{m['label']} test")
        for j, (mat, s) in enumerate(m["spectral"].items()):
            if m["config"]["model"] == "standard" and not mat.endswith(".Wv"):
                continue
            axes[1].plot(s["steps"], s["effective_rank"], ["-", "--", "-.", ":"][j % 4], color=color,
                         label=f"{m['label']} {mat}")
    for ax, label in zip(axes, ("accuracy", "effective rank")):
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlabel("iteration")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    first = next(iter(results.values()))["config"]
    fig.suptitle(f"Effective rank during training (L = {args.layers}): {task_title(first)}")
    fig.tight_layout()
    figure = os.path.join(args.out_dir, "effective_rank.png")
    save_figure(fig, figure, dpi=110)

    summary = {"rows": [row(m, name=name) for name, m in results.items()],
               "effective_rank": {name: rank_summary(m) for name, m in results.items()},
               "collapse_threshold": COLLAPSE, "figures": {"effective_rank.png": figure},
               "total_wall_seconds": sum(m["wall_seconds"] for m in results.values())}
    write_json(os.path.join(args.out_dir, "summary.json"), summary)
    for name, ranks in summary["effective_rank"].items():
        for mat, r in ranks.items():
            print(f"{name} {mat}: effective rank {r['start']:.1f} -> {r['end']:.1f} "
                  f"(collapse ratio {r['collapse_ratio']:.2f})")
    print(f"wrote {os.path.join(args.out_dir, 'summary.json')} ({summary['total_wall_seconds']:.0f} s in all)")
    return 0
