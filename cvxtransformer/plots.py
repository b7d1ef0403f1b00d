"""PNG plots of ``cvxtransformer compare`` (matplotlib, Agg backend), written atomically.

* :func:`plot_objective`: objective against training time for every network, the certified
  optimum of each convex program as a horizontal line (and the convex solve as a point),
  and the certified gap ``objective - D(V)`` of the networks that the bound covers;
* :func:`plot_test_loss`: test loss against training time, the convex solution's as a line;
* :func:`plot_attention`: attention maps side by side, one row per output token.

Attention maps are arrays of shape (rows, n): row t is the weight of every input token k in
output token t (one row for targets of shape (N,) or (N, c)). :func:`convex_attention_map`
makes one from a convex solution: the group norms ``||Z[j, (t, l), k]||``, summed over the
gates j and the outputs l of token t.
"""
import os
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLORS = {"alternative": "tab:orange", "gated": "tab:red", "softmax": "tab:purple"}
LABELS = {"alternative": "Nonconvex-Alternative (9)", "gated": "Nonconvex-Gated (11)",
          "softmax": "Nonconvex-Standard (3)"}
CONVEX_COLORS = {8: "tab:green", 10: "tab:green", 12: "tab:olive"}


def save_figure_atomic(fig, path):
    """``fig.savefig`` to a temporary PNG in the target folder, renamed into place when complete."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".png.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=120, bbox_inches="tight")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        plt.close(fig)


def convex_attention_map(Z4, n_out_tokens=1):
    """Token group norms of canonical coefficients ``Z4`` (h, c, n, d), shape (n_out_tokens, n).

    With sequence targets the c outputs are ``(t, l)`` flattened row-major (SPEC.md), so
    ``n_out_tokens = n`` folds them into one row per output token t.
    """
    norms = np.linalg.norm(Z4, axis=-1).sum(axis=0)  # (c, n)
    c, n = norms.shape
    return norms.reshape(n_out_tokens, c // n_out_tokens, n).sum(axis=1)


def _positive_floor(values):
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values) & (values > 0)]
    return max(finite.min() * 0.5, 1e-16) if finite.size else 1e-16


def plot_objective(runs, convex, path, title=""):
    """Objective and certified gap against time.

    runs : dict model -> dict(seconds=(S+1,), objective=(S+1,), lower_bound=float or None)
        (``lower_bound`` is D(V) of the convex program that bounds this network, None for (3))
    convex : dict program -> dict(primal_objective, dual_objective, solve_seconds)
    """
    fig, (ax, ax_gap) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, run in runs.items():
        t, objective = np.asarray(run["seconds"]), np.asarray(run["objective"])
        t, objective = t[t > 0], objective[t > 0]  # log time axis: from the end of the first step
        ax.plot(t, objective, color=COLORS.get(name), label=LABELS.get(name, name))
        if run.get("lower_bound") is not None:
            gap = objective - run["lower_bound"]
            ax_gap.plot(t, np.maximum(gap, _positive_floor(gap)), color=COLORS.get(name),
                        label=LABELS.get(name, name))
    for program, cv in convex.items():
        color = CONVEX_COLORS.get(program, "tab:green")
        ax.axhline(cv["primal_objective"], color=color, ls="--",
                   label=f"Convex ({program}) optimum, certified")
        ax.plot([max(cv["solve_seconds"], 1e-4)], [cv["primal_objective"]], "o", color=color)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("objective (sum of losses + weight decay)")
    ax.set_title(title or "Objective against time")
    ax.legend(fontsize=8)
    ax_gap.set_xscale("log")
    ax_gap.set_yscale("log")
    ax_gap.set_xlabel("training time (s)")
    ax_gap.set_ylabel("certified gap: objective - D(V)")
    ax_gap.set_title("Certified optimality gap (networks (9), (11))")
    if ax_gap.lines:
        ax_gap.legend(fontsize=8)
    else:
        ax_gap.text(0.5, 0.5, "no network covered by the bound", ha="center", transform=ax_gap.transAxes)
    fig.tight_layout()
    save_figure_atomic(fig, path)


def plot_test_loss(runs, convex, path):
    """Test loss per sample against time; ``runs``: model -> dict(eval_seconds, test_loss);
    ``convex``: program -> dict(test_loss)."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for name, run in runs.items():
        t, loss = np.asarray(run["eval_seconds"]), np.asarray(run["test_loss"])
        ax.plot(t[t > 0], loss[t > 0], color=COLORS.get(name), label=LABELS.get(name, name))
    for program, cv in convex.items():
        ax.axhline(cv["test_loss"], color=CONVEX_COLORS.get(program, "tab:green"), ls="--",
                   label=f"Convex ({program})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("test loss per sample")
    ax.set_title("Test loss against time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure_atomic(fig, path)


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
        ax.set_ylabel("output token" if M.shape[0] > 1 else "")
        ax.set_yticks(range(M.shape[0]) if M.shape[0] > 1 else [])
        ax.set_xticks(range(M.shape[1]))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle("Attention maps (each row normalised to sum 1)", fontsize=10)
    fig.tight_layout()
    save_figure_atomic(fig, path)
