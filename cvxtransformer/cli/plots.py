"""PNG plots of ``cvxtransformer compare`` (matplotlib, Agg backend), written atomically.

* :func:`plot_objective`: objective against training time for every network run, the certified
  optimum of each convex program as a horizontal line, and the certified gap ``objective - D(V)``
  of the runs that the bound covers;
* :func:`plot_test_loss`: test loss against time, the convex solution's as a line;
* :func:`plot_attention`: attention maps side by side, one row per output token;
* :func:`plot_singular_values`: singular values of the convex solution of program (6) against
  those of the networks' effective coefficients.

Legends use the command line's names (``alternative``, ``gated``, ``softmax``, ``linear_mhsa``).
Attention maps are arrays of shape (rows, n): row t is the weight of every input token k in output
token t. :func:`convex_attention_map` makes one from a convex solution: the group norms
``||Z[j, (t, l), k]||``, summed over the gates j and the outputs l of token t.
"""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import LogLocator  # noqa: E402

from ..core.io import save_figure  # noqa: E402

COLORS = {"alternative": "tab:orange", "gated": "tab:red", "softmax": "tab:purple", "linear_mhsa": "tab:blue"}
CONVEX_COLORS = {8: "tab:green", 10: "tab:green", 12: "tab:olive", "mhsa": "tab:green"}


def convex_attention_map(Z4, n_out_tokens=1):
    """Token group norms of canonical coefficients ``Z4`` (h, c, n, d), shape (n_out_tokens, n).

    With sequence targets the c outputs are ``(t, l)`` flattened row-major (docs/conventions.md), so
    ``n_out_tokens = n`` folds them into one row per output token t.
    """
    norms = np.linalg.norm(Z4, axis=-1).sum(axis=0)  # (c, n)
    c, n = norms.shape
    return norms.reshape(n_out_tokens, c // n_out_tokens, n).sum(axis=1)


def _positive_floor(values):
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values) & (values > 0)]
    return max(finite.min() * 0.5, 1e-16) if finite.size else 1e-16


def _style(i):
    return ["-", "--", "-.", ":"][i % 4]


def _log_time_axis(ax):
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(numticks=6))
    ax.set_xlabel("training time (s)")


def plot_objective(runs, convex, path, title=""):
    """Objective and certified gap against time.

    runs : dict name -> dict(model, seconds=(S+1,), objective=(S+1,), lower_bound=float or None)
        (``lower_bound`` is D(V) of the convex program that bounds this network, None for (3))
    convex : dict program -> dict(primal_objective, dual_objective)
    """
    fig, (ax, ax_gap) = plt.subplots(1, 2, figsize=(11, 4.2))
    seen = {}
    for name, run in runs.items():
        t, objective = np.asarray(run["seconds"]), np.asarray(run["objective"])
        t, objective = t[t > 0], objective[t > 0]  # log time axis: from the end of the first step
        i = seen[run["model"]] = seen.get(run["model"], -1) + 1
        style = dict(color=COLORS.get(run["model"]), ls=_style(i), label=name)
        ax.plot(t, objective, **style)
        if run.get("lower_bound") is not None:
            gap = objective - run["lower_bound"]
            ax_gap.plot(t, np.maximum(gap, _positive_floor(gap)), **style)
    for program, cv in convex.items():
        ax.axhline(cv["primal_objective"], color=CONVEX_COLORS.get(program, "tab:green"), ls=(0, (4, 2)), lw=1.2,
                   label=f"convex ({program}) optimum P(Z*), certified")
    _log_time_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel("objective (sum of losses + weight decay)")
    ax.set_title(title or "Objective against time")
    ax.legend(fontsize=8)
    _log_time_axis(ax_gap)
    ax_gap.set_yscale("log")
    ax_gap.set_ylabel("certified gap: objective - D(V)")
    ax_gap.set_title("Certified optimality gap of the networks the bound covers")
    if ax_gap.lines:
        ax_gap.legend(fontsize=8)
    else:
        ax_gap.text(0.5, 0.5, "no network covered by the bound", ha="center", transform=ax_gap.transAxes)
    fig.tight_layout()
    save_figure(fig, path)


def plot_test_loss(runs, convex, path):
    """Test loss per sample against time; ``runs``: name -> dict(model, eval_seconds, test_loss);
    ``convex``: program -> dict(test_loss)."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    seen = {}
    for name, run in runs.items():
        t, loss = np.asarray(run["eval_seconds"]), np.asarray(run["test_loss"])
        i = seen[run["model"]] = seen.get(run["model"], -1) + 1
        ax.plot(t[t > 0], loss[t > 0], color=COLORS.get(run["model"]), ls=_style(i), label=name)
    for program, cv in convex.items():
        ax.axhline(cv["test_loss"], color=CONVEX_COLORS.get(program, "tab:green"), ls=(0, (4, 2)),
                   label=f"convex ({program})")
    _log_time_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel("test loss per sample")
    ax.set_title("Test loss against time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def plot_attention(maps, path):
    """Heatmaps of attention maps side by side; ``maps``: title -> array (rows, n).

    Each row is divided by its sum, so every panel shows the share of each input token in
    each output token (group norms for the convex solution and networks (9)/(11), softmax
    probabilities for (3)), on one colour scale for all panels.
    """
    shares = {}
    for title, M in maps.items():
        M = np.asarray(M, dtype=float)
        sums = M.sum(axis=1, keepdims=True)
        shares[title] = np.divide(M, sums, out=np.zeros_like(M), where=sums > 0)
    vmax = max(max(float(S.max()) for S in shares.values()), 1e-12)
    rows = max(S.shape[0] for S in shares.values())
    fig, axes = plt.subplots(1, len(maps), figsize=(3.6 * len(maps), max(2.6, 1.6 + 0.3 * rows)), squeeze=False)
    for ax, (title, M) in zip(axes[0], shares.items()):
        im = ax.imshow(M, cmap="viridis", vmin=0, vmax=vmax, aspect="auto", interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("input token k")
        ax.set_ylabel("output token t" if M.shape[0] > 1 else "output (one per sequence)")
        ax.set_yticks(range(M.shape[0]))
        ax.set_xticks(range(M.shape[1]))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the row")
    fig.suptitle("Attention maps (each row normalised to sum 1)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def plot_singular_values(convex, networks, beta, path):
    """Singular values of Z* of program (6) (``convex``, descending) and of each network's effective
    coefficients (``networks``: name -> singular values), on a log scale."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    floor = 1e-12 * max(float(np.max(convex)) if len(convex) else 1.0, 1e-300)
    k = np.arange(1, len(convex) + 1)
    ax.semilogy(k, np.maximum(convex, floor), "o-", color="tab:green", label="convex Z* (program (6))")
    for i, (name, s) in enumerate(networks.items()):
        ax.semilogy(np.arange(1, len(s) + 1), np.maximum(s, floor), ls=_style(i), marker=".",
                    color=COLORS["linear_mhsa"], alpha=0.5 + 0.5 / (i + 1), label=name)
    rank = int(np.sum(convex > floor * 1e3))
    ax.axvline(rank + 0.5, color="gray", lw=0.8, ls=":")
    ax.text(rank + 0.6, ax.get_ylim()[1], f"rank(Z*) = {rank}", va="top", fontsize=8, color="gray")
    ax.set_xlabel("index i")
    ax.set_ylabel("singular value sigma_i")
    ax.set_title(f"Singular values (beta = {beta:.4g})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
