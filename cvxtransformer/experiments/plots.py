"""PNG plots of the experiments (matplotlib, Agg backend).

Each function takes the ``metrics`` dicts written by :func:`.runner.run` (as ``(label, metrics)``
pairs for comparisons) and a path, draws one figure and saves it. Iterations are on a symlog
axis, as the papers' figures put them on a log axis.
"""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..core.io import save_figure  # noqa: E402

COLORS = {"convex": "tab:green", "standard": "tab:purple"}


def _color(metrics, i):
    cfg = metrics["config"]
    if cfg["model"] == "convex" and cfg.get("kernel_features"):
        return "tab:orange"
    return COLORS.get(cfg["model"], plt.cm.tab10(i % 10))


def _style(metrics):
    return "-" if metrics["config"]["layers"] > 1 else "--"


def _curve(ax, runs, key, ylabel, logy=False):
    for i, (label, m) in enumerate(runs):
        c = m["curves"]
        y = np.array([np.nan if v is None else v for v in c[key]], dtype=float)
        ax.plot(c["step"], y, _style(m), color=_color(m, i), label=label)
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)


def _save(fig, path, title):
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def plot_accuracy(runs, path, title=None):
    """Train accuracy, test accuracy and test loss of each run (the panels of Figures 4-6)."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    _curve(axes[0], runs, "train_accuracy", "train accuracy")
    _curve(axes[1], runs, "test_accuracy", "test accuracy")
    _curve(axes[2], runs, "test_loss", "test loss (mean cross-entropy)", logy=True)
    for ax in axes[:2]:
        ax.axhline(0.99, color="gray", lw=0.8, ls=":")
        ax.set_ylim(-0.02, 1.02)
    axes[1].legend(fontsize=8)
    _save(fig, path, title)


def plot_loss(runs, path, title=None):
    """Train and test loss curves (mean cross-entropy, log scale)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    _curve(axes[0], runs, "train_loss", "train loss", logy=True)
    _curve(axes[1], runs, "test_loss", "test loss", logy=True)
    axes[1].legend(fontsize=8)
    _save(fig, path, title)


def plot_spectrum(metrics, path, title=None, max_matrices=4):
    """Spectral analysis of one run: accuracy curves beside the effective rank of every tracked
    matrix and, for up to ``max_matrices`` of them, the top singular values over iterations."""
    spectral = metrics["spectral"]
    names = list(spectral)
    shown = names[:max_matrices] if metrics["config"]["model"] == "convex" else \
        [n for n in names if n.endswith((".Wv", ".W1"))][:max_matrices] or names[:max_matrices]
    ncols = 2 + len(shown)
    fig, axes = plt.subplots(1, ncols, figsize=(4 * ncols, 3.8))
    _curve(axes[0], [("train", metrics)], "train_accuracy", "accuracy")
    c = metrics["curves"]
    axes[0].plot(c["step"], c["test_accuracy"], color="tab:red", label="test")
    axes[0].lines[0].set_label("train")
    axes[0].legend(fontsize=8)
    for name in names:
        s = spectral[name]
        axes[1].plot(s["steps"], s["effective_rank"], label=name)
    axes[1].set_xscale("symlog", linthresh=10)
    axes[1].set_xlabel("iteration")
    axes[1].set_ylabel("effective rank")
    axes[1].legend(fontsize=6)
    axes[1].grid(alpha=0.3)
    for ax, name in zip(axes[2:], shown):
        s = spectral[name]
        top = np.array(s["top_singular_values"], dtype=float)
        for k in range(top.shape[1]):
            ax.plot(s["steps"], top[:, k], color=plt.cm.viridis(k / max(1, top.shape[1] - 1)), lw=1)
        ax.set_xscale("symlog", linthresh=10)
        ax.set_yscale("log")
        ax.set_xlabel("iteration")
        ax.set_title(f"{name}: top {top.shape[1]} singular values", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[:1]:
        for key, ls in (("steps_to_99_train", ":"), ("steps_to_99_test", "--")):
            if metrics.get(key) is not None:
                for a in axes:
                    a.axvline(metrics[key], color="gray", ls=ls, lw=0.8)
    _save(fig, path, title or f"{metrics['label']}: spectra (dotted: 99% train, dashed: 99% test)")


def plot_grokking_bars(rows, path, budget_note=""):
    """Figure 7: iterations to 99% test accuracy (a) and amount of grokking (b), per setting.

    ``rows``: dicts with ``setting`` (e.g. "p=97, L=1"), ``model``, ``steps_to_99_test``,
    ``grokking_steps`` and ``steps_done``. Not-reached runs are drawn hatched at their budget.
    """
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    width = 0.8 / max(1, len(models))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, key, ylabel in ((axes[0], "steps_to_99_test", "iterations to 99% test accuracy"),
                            (axes[1], "grokking_steps", "amount of grokking (iterations)")):
        for m_i, model in enumerate(models):
            for s_i, setting in enumerate(settings):
                r = next((r for r in rows if r["setting"] == setting and r["model"] == model), None)
                if r is None:
                    continue
                x = s_i + (m_i - (len(models) - 1) / 2) * width
                value = r[key]
                reached = value is not None
                height = value if reached else r["steps_done"]
                ax.bar(x, max(height, 1), width, color=COLORS.get(model, "gray"), alpha=1.0 if reached else 0.3,
                       hatch=None if reached else "//", label=model if s_i == 0 else None, edgecolor="black")
                if not reached:
                    ax.text(x, max(height, 1), "not\nreached", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(settings)))
        ax.set_xticklabels(settings)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    _save(fig, path, "Grokking: iterations to 99% test accuracy and amount of grokking" + budget_note)
