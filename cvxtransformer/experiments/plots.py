"""PNG plots of the experiments (matplotlib, Agg backend).

Each function takes the ``metrics`` dicts written by :func:`.runner.run` (as ``(label, metrics)``
pairs for comparisons; several seeds of one setting share a label and are drawn as thin lines of
one style) and a path, draws one figure, saves it and returns it. Every figure carries the task
in its title (task, modulus, train fraction: :func:`.config.task_title`). Colours tell the
models apart; line styles tell depths apart (accuracy panels) or train from test (spectra), and
the legend names both. Iterations are on a symlog axis, as the papers' figures put them on a log
axis.
"""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..core.io import save_figure  # noqa: E402
from .config import MODELS, task_title  # noqa: E402

COLORS = dict(zip(MODELS, ("tab:green", "tab:olive", "tab:blue", "tab:red", "tab:purple")))
KERNEL_COLOR = "tab:orange"
DEPTH_STYLES = {1: "-", 2: "--", 4: ":"}
PART_STYLES = {"train": ":", "test": "-"}


def model_color(cfg):
    """The colour of a run's model (a convex model with a Fastfood kernel has its own)."""
    if cfg["model"] in ("convex", "convex-learned-gates") and cfg.get("kernel_features"):
        return KERNEL_COLOR
    return COLORS.get(cfg["model"], "tab:gray")


def depth_style(cfg):
    return DEPTH_STYLES.get(cfg["layers"], "-.")


def titles(runs):
    """The tasks of ``runs`` in words, one per distinct task."""
    return "; ".join(dict.fromkeys(task_title(m["config"]) for _, m in runs))


def _values(curve):
    return np.array([np.nan if v is None else v for v in curve], dtype=float)


def _axis(ax, ylabel, logy=False):
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)


def _curves(ax, runs, key):
    """One line per run, coloured by model, styled by depth; the first run of a label carries it."""
    seen = set()
    for label, m in runs:
        c, cfg = m["curves"], m["config"]
        if key not in c:
            continue
        first = label not in seen
        seen.add(label)
        ax.plot(c["step"], _values(c[key]), depth_style(cfg), color=model_color(cfg), lw=1.5 if first else 0.8,
                alpha=1.0 if first else 0.6, label=label if first else None)


def _save(fig, path, title):
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return fig


def plot_accuracy(runs, path, title=None):
    """Train accuracy, test accuracy, test accuracy on the ``x != 0`` rows and test loss of each
    run (the panels of Figures 4-6). Title: ``title`` (if any) and the task."""
    panels = [("train_accuracy", "train accuracy"), ("test_accuracy", "test accuracy"),
              ("test_accuracy_nonzero", "test accuracy, rows with x != 0"), ("test_loss", "test loss (mean CE)")]
    panels = [p for p in panels if any(p[0] in m["curves"] for _, m in runs)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4))
    for ax, (key, ylabel) in zip(axes, panels):
        _curves(ax, runs, key)
        _axis(ax, ylabel, logy=key == "test_loss")
        if key != "test_loss":
            ax.axhline(0.99, color="gray", lw=0.8, ls=(0, (1, 3)))
            ax.set_ylim(-0.02, 1.02)
    axes[1].legend(fontsize=8, title="model, depth (line style)", title_fontsize=8)
    return _save(fig, path, (f"{title}: " if title else "") + titles(runs))


def plot_loss(runs, path, title=None):
    """Train and test loss curves (mean cross-entropy, log scale)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key in zip(axes, ("train_loss", "test_loss")):
        _curves(ax, runs, key)
        _axis(ax, key.replace("_", " "), logy=True)
    axes[1].legend(fontsize=8, title="model, depth (line style)", title_fontsize=8)
    return _save(fig, path, (f"{title}: " if title else "") + titles(runs))


def plot_spectrum(metrics, path, title=None, max_matrices=4):
    """Spectral analysis of one run: train and test accuracy beside the effective rank of every
    tracked matrix and, for up to ``max_matrices`` of them, the top singular values over iterations."""
    spectral, c, cfg = metrics["spectral"], metrics["curves"], metrics["config"]
    names = list(spectral)
    shown = [n for n in names if n.endswith((".Wv", ".W1"))][:max_matrices] if cfg["model"] == "standard" else []
    shown = shown or names[:max_matrices]
    ncols = 2 + len(shown)
    fig, axes = plt.subplots(1, ncols, figsize=(4 * ncols, 3.8))
    color = model_color(cfg)
    for part in ("train", "test"):
        axes[0].plot(c["step"], _values(c[f"{part}_accuracy"]), PART_STYLES[part], color=color, label=part)
    _axis(axes[0], "accuracy")
    axes[0].set_ylim(-0.02, 1.02)
    for name in names:
        s = spectral[name]
        axes[1].plot(s["steps"], s["effective_rank"], label=name)
    _axis(axes[1], "effective rank")
    axes[1].legend(fontsize=6)
    for ax, name in zip(axes[2:], shown):
        s = spectral[name]
        top = np.array(s["top_singular_values"], dtype=float)
        for k in range(top.shape[1]):
            ax.plot(s["steps"], top[:, k], color=plt.cm.viridis(k / max(1, top.shape[1] - 1)), lw=1)
        _axis(ax, "singular value", logy=True)
        ax.set_title(f"{name}: top {top.shape[1]} singular values", fontsize=9)
    for key, ls, label in (("steps_to_99_train", (0, (1, 2)), "99% train"), ("steps_to_99_test", "--", "99% test")):
        if metrics.get(key) is not None:
            for i, a in enumerate(axes):
                a.axvline(metrics[key], color="gray", ls=ls, lw=0.8, label=label if i == 0 else None)
    axes[0].legend(fontsize=8, title="line style", title_fontsize=8)
    return _save(fig, path, f"{title or metrics['label'] + ': spectra'}; {task_title(cfg)}")


def plot_grokking_bars(rows, path, budget_note=""):
    """Figure 7: iterations to 99% test accuracy (a) and amount of grokking (b), per setting.

    ``rows``: dicts with ``setting`` (e.g. "p=97, L=1"), ``model``, ``task``, ``train_fraction``,
    ``steps_to_99_test``, ``grokking_steps`` and ``steps_done`` (one per seed: the bar is their
    mean when every seed reached 99%, the dots the seeds). Not-reached settings are drawn hatched
    at their budget, with the count of seeds that reached it.
    """
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    width = 0.8 / max(1, len(models))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, key, ylabel in ((axes[0], "steps_to_99_test", "iterations to 99% test accuracy"),
                            (axes[1], "grokking_steps", "amount of grokking (iterations)")):
        for m_i, model in enumerate(models):
            for s_i, setting in enumerate(settings):
                sel = [r for r in rows if r["setting"] == setting and r["model"] == model]
                if not sel:
                    continue
                x = s_i + (m_i - (len(models) - 1) / 2) * width
                values = [r[key] for r in sel if r[key] is not None]
                reached = len(values) == len(sel)
                height = np.mean(values) if reached else max(r["steps_done"] for r in sel)
                ax.bar(x, max(height, 1), width, color=COLORS.get(model, "gray"), alpha=1.0 if reached else 0.3,
                       hatch=None if reached else "//", label=model if s_i == 0 else None, edgecolor="black")
                ax.plot([x] * len(values), np.maximum(values, 1), "k.", ms=4)
                if not reached:
                    ax.text(x, max(height, 1), f"not reached\n({len(values)}/{len(sel)} seeds)", ha="center",
                            va="bottom", fontsize=7)
        ax.set_xticks(range(len(settings)))
        ax.set_xticklabels(settings)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8, title="model (dots: seeds)", title_fontsize=8)
    tasks = "; ".join(dict.fromkeys(f"{r['task']} (train fraction {r['train_fraction']:g})" for r in rows))
    return _save(fig, path, f"Grokking on {tasks}: iterations to 99% test accuracy and amount of grokking"
                 + budget_note)


READING_STYLES = {"invertible": "-", "power": "--", "fermat": ":"}


def plot_ladder(results, path):
    """The ladder (or grid) of :mod:`.ladder`: final test accuracy on the ``x != 0`` rows (left) and
    the first step with 99% test accuracy (right), per setting; ``results`` {name: [metrics per seed]}.

    With one train fraction: a bar per setting (the mean over seeds; dots: the seeds; hatched: not
    every seed reached 99%, drawn at the budget). With several: lines against the train fraction,
    coloured by model and styled by reading (legend), bars min-max over the seeds.
    """
    first = [ms[0]["config"] for ms in results.values()]
    fractions = sorted({c["train_fraction"] for c in first})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    keys = (("final_test_accuracy_nonzero", "final test accuracy, rows with x != 0"),
            ("steps_to_99_test", "first step with 99% test accuracy"))
    if len(fractions) > 1:
        keys = (keys[0], ("final_test_accuracy", "final test accuracy, all rows"))
    if len(fractions) == 1:
        for i, (name, ms) in enumerate(results.items()):
            color = model_color(ms[0]["config"])
            for ax, (key, _) in zip(axes, keys):
                values = [m.get(key) for m in ms]
                defined = [v for v in values if v is not None]
                reached = len(defined) == len(values)
                if key == "steps_to_99_test":
                    height = np.mean(defined) if reached else max(m["steps_done"] for m in ms)
                else:
                    height = np.mean(defined) if defined else 0.0
                ax.bar(i, height, 0.7, color=color, alpha=1.0 if reached else 0.3, hatch=None if reached else "//",
                       edgecolor="black", label=f"{name} ({len(ms)} seeds)" if key != "steps_to_99_test" else None)
                ax.plot([i] * len(defined), defined, "k.", ms=5)
                if key == "steps_to_99_test" and not reached:
                    ax.text(i, height, f"not reached\n({len(defined)}/{len(values)} seeds)", ha="center",
                            va="bottom", fontsize=7)
        for ax, (key, ylabel) in zip(axes, keys):
            ax.set_xticks(range(len(results)))
            ax.set_xticklabels(list(results), rotation=20, fontsize=8)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, axis="y")
        axes[0].set_ylim(0, 1.02)
        axes[1].set_yscale("log")
        axes[0].legend(fontsize=7, title="setting (dots: seeds)", title_fontsize=7)
    else:
        groups = {}
        for name, ms in results.items():
            c = ms[0]["config"]
            groups.setdefault((c["model"], c.get("reading", "invertible")), []).append(ms)
        for (model, reading), settings in groups.items():
            settings.sort(key=lambda ms: ms[0]["config"]["train_fraction"])
            color, style = model_color(settings[0][0]["config"]), READING_STYLES.get(reading, "-.")
            f = [ms[0]["config"]["train_fraction"] for ms in settings]
            for ax, (key, _) in zip(axes, keys):
                vals = [[m.get(key) for m in ms if m.get(key) is not None] for ms in settings]
                mean = np.array([np.mean(v) if v else np.nan for v in vals])
                err = np.array([[m - min(v) if v else 0 for m, v in zip(mean, vals)],
                                [max(v) - m if v else 0 for m, v in zip(mean, vals)]])
                ax.errorbar(f, mean, yerr=err, ls=style, marker="o", color=color, capsize=3,
                            label=f"{model}, {reading} reading")
        for ax, (key, ylabel) in zip(axes, keys):
            ax.set_xlabel("train fraction")
            ax.set_ylabel(ylabel)
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7, title="model (colour), reading (line style); bars: min-max over seeds",
                       title_fontsize=7)
    if len(fractions) == 1:
        title = "; ".join(dict.fromkeys(task_title(c) for c in first))
    else:
        readings = ", ".join(dict.fromkeys(c.get("reading", "invertible") for c in first))
        title = "; ".join(dict.fromkeys(f"{c['task']} mod {c['modulus']}" for c in first)) + \
            f" (readings: {readings}; train fractions {', '.join(f'{f:g}' for f in fractions)})"
    return _save(fig, path, title)
