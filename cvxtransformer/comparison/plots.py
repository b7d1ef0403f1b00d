"""PNG plots of :func:`cvxtransformer.compare` (matplotlib), written atomically.

* :func:`plot_objective`: objective (and training loss) against training time, and the objective against
  the step, for every network run, the certified optimum of each convex program as a horizontal line,
  and the certified gap ``objective - D(V)`` of the runs that the bound covers;
* :func:`plot_test_loss`: test loss against time, the convex solution's as a line;
* :func:`plot_attention`: attention maps in a grid (at most 4 a row), one row per output token;
* :func:`plot_singular_values`: singular values of the convex solution of program (6) (or of each
  gate's Z_g) against those of the networks' effective coefficients;
* :func:`plot_tuning`: validation loss over the tuning grid of ``compare --tune``;
* :func:`attention_distance`: how far an attention map is from the teacher's.

Colours follow the model (each row of :data:`.models.MODELS` names its colour).
Attention maps are arrays of shape (rows, n): row r is the weight of every input token k in output
r. :func:`convex_attention_map` makes one from a convex solution: the group norms
``||Z[j, l, k]||`` summed over the gates j, one row per output l, or per output token t (the
outputs ``(t, l)`` of token t summed), or one row for all outputs.

matplotlib is imported when a plot is drawn, not with this module. Each plot function returns its
figure (saved and closed), whose axes and lines can be read.
"""
import numpy as np

from ..core.io import save_figure
from .models import MODELS, equation

ATTENTION_COLUMNS = 4  # panels per row of attention.png
# the networks of singular_values.png, one colour each (green is the convex solution's)
NETWORK_CYCLE = ("tab:blue", "tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
                 "tab:olive", "tab:cyan")
CONVEX_COLORS = {12: "tab:olive"}  # others: tab:green


def _colour(model):
    """A model's colour (its row of :data:`.models.MODELS`; None: matplotlib's cycle)."""
    row = MODELS.get(model)
    return row.colour if row is not None else None


def convex_attention_map(Z4, n_out_tokens=None):
    """Token group norms of canonical coefficients ``Z4`` (h, c, n, d), summed over the gates: shape
    (c, n), one row per output, or (n_out_tokens, n).

    With sequence targets the c outputs are ``(t, l)`` flattened row-major (docs/conventions.md), so
    ``n_out_tokens = n`` folds them into one row per output token t; ``n_out_tokens = 1`` sums all outputs.

    >>> Z4 = np.ones((1, 2, 3, 4))  # one gate, 2 outputs, 3 tokens: every group norm is 2
    >>> convex_attention_map(Z4).tolist(), convex_attention_map(Z4, 1).tolist()
    ([[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]], [[4.0, 4.0, 4.0]])
    """
    norms = np.linalg.norm(Z4, axis=-1).sum(axis=0)  # (c, n)
    if n_out_tokens is None:
        return norms
    c, n = norms.shape
    return norms.reshape(n_out_tokens, c // n_out_tokens, n).sum(axis=1)


def _positive_floor(values):
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values) & (values > 0)]
    return max(finite.min() * 0.5, 1e-16) if finite.size else 1e-16


def _shown(x, y):
    """The points of a curve that log axes can show: x > 0 (time or step) and y finite and > 0 (a run
    that diverged ends where it did: its NaN left a log axis with nothing to scale)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = (x > 0) & np.isfinite(y) & (y > 0)
    return x[keep], y[keep]


def _style(i):
    return ["-", "--", "-.", ":"][i % 4]


def _subplots(nrows, ncols, figsize, layout=None, **kwargs):
    """A figure on an Agg canvas and its axes, without pyplot (no backend is switched, in a notebook too)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=layout)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def _log_time_axis(ax):
    from matplotlib.ticker import LogLocator, NullFormatter

    if _log_scale(ax, "x"):
        ax.xaxis.set_major_locator(LogLocator(numticks=6))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("training time (s)")


def _log_scale(ax, axis):
    """A log scale on ``axis`` ("x" or "y") of ``ax`` where its data has a value > 0 to scale (every run
    diverged at its first step leaves none, and a log axis without data cannot be drawn); True if set."""
    lim = ax.dataLim
    top = lim.x1 if axis == "x" else lim.y1
    if not (np.isfinite(top) and top > 0):
        return False
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    return True


def plot_objective(runs, convex, path, title=""):
    """Objective against time and against step, training loss and certified gap against time (a 2 x 2 grid).

    With ``loss_sum`` a middle panel shows the training loss alone: unlike the objectives, whose
    regularisers differ between (3) and the convex family (and with the beta of each model when
    tuned), it is the same function for every model.

    Parameters
    ----------
    runs : dict name -> dict(model, seconds=(S+1,), objective=(S+1,), lower_bound=float or None,
        and optionally bounding_program (the program whose D(V) it is), eval_seconds=(E,), loss_sum=(E,),
        the training loss summed over samples, and collapsed=True for a network that learned nothing: a
        cross on its last point) (``lower_bound`` is D(V) of the convex program that bounds this
        network, None for the networks no program bounds, (3) and the ReLU networks; the legend says
        which is which)
    convex : dict program -> dict(primal_objective, dual_objective, optionally loss_sum, label, and
        solve_seconds, refine_seconds: the convex solve's end, a star on its line against time)
    path : the PNG file
    title : the left panel's title
    """
    with_loss = any("loss_sum" in run for run in runs.values())
    fig, grid = _subplots(2, 2, figsize=(14, 9.5))
    ax, ax_steps, ax_gap = grid[0, 0], grid[0, 1], grid[1, 1]
    axes = [ax, grid[1, 0], ax_gap]
    if not with_loss:
        grid[1, 0].axis("off")
    seen, covered = {}, {}  # covered: each run's legend entry, saying whether the bound covers it
    for name, run in runs.items():
        t, objective = _shown(run["seconds"], run["objective"])  # log time axis: from the end of the first step
        steps, by_step = _shown(np.arange(len(run["objective"])), run["objective"])
        i = seen[run["model"]] = seen.get(run["model"], -1) + 1
        style = dict(color=_colour(run["model"]), ls=_style(i), label=name)
        covered[name] = _bound_label(name, run)
        ax.plot(t, objective, **style)
        ax_steps.plot(steps, by_step, **style)
        if run.get("collapsed"):  # a cross on the last point of a network that learned nothing
            for a, x, y in ((ax, t, objective), (ax_steps, steps, by_step)):
                if len(x):
                    a.plot(x[-1], y[-1], "x", color=style["color"], ms=10, mew=2)
        if with_loss and "loss_sum" in run:
            axes[1].plot(*_shown(run["eval_seconds"], run["loss_sum"]), **style)
        if run.get("lower_bound") is not None and len(t):
            gap = objective - run["lower_bound"]
            ax_gap.plot(t, np.maximum(gap, _positive_floor(gap)), **style)
    for program, cv in convex.items():
        style = dict(color=CONVEX_COLORS.get(program, "tab:green"), ls=(0, (4, 2)), lw=1.2)
        ax.axhline(cv["primal_objective"], label=cv.get("label", f"convex ({program}) optimum P(Z*), certified"),
                   **style)
        ax_steps.axhline(cv["primal_objective"], **style)
        end = (cv.get("solve_seconds") or 0.0) + (cv.get("refine_seconds") or 0.0)
        if end > 0:  # the exact solve's end (solver and certificate), on the same time axis as the training
            ax.plot(end, cv["primal_objective"], "*", color=style["color"], ms=14, mec="black", mew=0.6,
                    label=f"convex ({program}) solved and certified: {end:.3g} s")
        if with_loss and cv.get("loss_sum") is not None:
            axes[1].axhline(cv["loss_sum"], label=f"convex ({program}), exact", **style)
    _log_time_axis(ax)
    _log_scale(ax, "y")
    ax.set_ylabel("objective (sum of losses + regulariser)")
    ax.set_title(title or "Objective against time")
    _legend(ax, covered)
    _log_scale(ax_steps, "x")
    _log_scale(ax_steps, "y")
    ax_steps.set_xlabel("step (iterations; not distorted by the machine's load)")
    ax_steps.set_ylabel("objective (sum of losses + regulariser)")
    collapsed = any(run.get("collapsed") for run in runs.values())
    ax_steps.set_title("Objective against step" + (" (x: collapsed network)" if collapsed else ""))
    if collapsed:
        from matplotlib.lines import Line2D

        cross = Line2D([], [], marker="x", color="black", ms=10, mew=2, ls="none")
        _legend(ax_steps, covered, [(cross, "x: collapsed (learned nothing)")])
    if with_loss:
        _log_time_axis(axes[1])
        _log_scale(axes[1], "y")
        axes[1].set_ylabel("training loss (sum over samples)")
        axes[1].set_title("Training loss alone (comparable across models)")
        _legend(axes[1], covered)
    ax_gap.set_ylabel("certified gap: objective - D(V)")
    ax_gap.set_title("Certified optimality gap of the models the bound covers", fontsize=10)
    if ax_gap.lines:
        _log_time_axis(ax_gap)
        _log_scale(ax_gap, "y")
        _legend(ax_gap, covered)
    else:
        ax_gap.text(0.5, 0.5, "no network covered by the bound", ha="center", transform=ax_gap.transAxes)
    fig.tight_layout()
    save_figure(fig, path)
    return fig


def _legend(ax, covered, extra=()):
    """The axes' legend, each run named by ``covered`` (whether the bound covers it), then ``extra``
    (handle, text) pairs; the lines keep their labels, the runs' names."""
    handles, labels = ax.get_legend_handles_labels()
    for handle, text in extra:
        handles.append(handle)
        labels.append(text)
    ax.legend(handles, [covered.get(label, label) for label in labels], fontsize=8)


def _bound_label(name, run):
    """A run's legend entry, saying whether the certified bound covers it."""
    if run.get("lower_bound") is None:
        return f"{name}: no bound covers it"
    program = run.get("bounding_program")
    return f"{name}: bounded" + (f" by program ({program})" if program is not None else "")


def plot_tuning(grids, convex, path):
    """Validation loss over the tuning grid: one heatmap per model (learning rate x beta, the choice
    boxed) and the exact convex solutions' validation loss against beta.

    Parameters
    ----------
    grids : dict name -> dict(lr=(L,), beta_frac=(B,), loss=(L, B) validation losses (NaN: diverged),
        chosen=(i, j))
    convex : dict program -> dict(beta_frac=(B,), loss=(B,), chosen=j)
    path : the PNG file
    """
    import matplotlib.colors
    import matplotlib.patches

    fig, axes = _subplots(1, len(grids) + 1, figsize=(4.2 * (len(grids) + 1), 3.8), squeeze=False,
                             layout="constrained")
    finite = [v for g in grids.values() for v in np.ravel(g["loss"]) if np.isfinite(v)]
    finite += [v for c in convex.values() for v in c["loss"] if np.isfinite(v)]
    vmin, vmax = (min(finite), max(finite)) if finite else (1.0, 10.0)
    norm = matplotlib.colors.LogNorm(vmin=max(vmin, 1e-300), vmax=max(vmax, vmin * 1.0001, 1e-300))
    ax = axes[0, 0]
    for program, c in convex.items():
        ax.semilogx(c["beta_frac"], c["loss"], "o-", color=CONVEX_COLORS.get(program, "tab:green"),
                    label=f"convex ({program}), exact")
        ax.plot(c["beta_frac"][c["chosen"]], c["loss"][c["chosen"]], "s", ms=11, mfc="none", mec="red", mew=2)
    ax.set_xlabel("beta / beta_max")
    ax.set_ylabel("validation loss per sample")
    ax.set_title("exact convex solutions", fontsize=9)
    ax.legend(fontsize=8)
    for ax, (name, g) in zip(axes[0, 1:], grids.items()):
        loss = np.asarray(g["loss"], dtype=float)
        im = ax.imshow(np.where(np.isfinite(loss), loss, np.nan), cmap="viridis_r", norm=norm, aspect="auto")
        for (i, j), v in np.ndenumerate(loss):
            ax.text(j, i, "div." if not np.isfinite(v) else f"{v:.3g}", ha="center", va="center", fontsize=7,
                    color="white" if np.isfinite(v) and v > np.sqrt(vmin * vmax) else "black")
        i, j = g["chosen"]
        ax.add_patch(matplotlib.patches.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=2))
        ax.set_xticks(range(len(g["beta_frac"])), [f"{f:g}" for f in g["beta_frac"]])
        ax.set_yticks(range(len(g["lr"])), [f"{v:g}" for v in g["lr"]])
        ax.set_xlabel("beta / beta_max")
        ax.set_ylabel("learning rate")
        ax.set_title(name, fontsize=9)
    if grids:
        fig.colorbar(im, ax=axes[0, 1:].tolist(), fraction=0.02, pad=0.01, label="validation loss per sample")
    fig.suptitle("Tuning on the validation split (red: chosen)", fontsize=10)
    save_figure(fig, path)


def attention_distance(M, teacher):
    """Mean over output tokens of the total-variation distance between the rows of two maps,
    each row divided by its sum: 0 for the same shares, 1 for disjoint supports.

    >>> attention_distance(np.eye(2), np.eye(2)), attention_distance(np.eye(2), np.ones((2, 2)))
    (0.0, 0.5)
    """
    def shares(A):
        A = np.abs(np.asarray(A, dtype=float))
        sums = A.sum(axis=1, keepdims=True)
        return np.divide(A, sums, out=np.full_like(A, 1.0 / A.shape[1]), where=sums > 0)

    return float(np.mean(0.5 * np.abs(shares(M) - shares(teacher)).sum(axis=1)))


def plot_test_loss(runs, convex, path):
    """Test loss per sample against time; ``runs``: name -> dict(model, eval_seconds, test_loss);
    ``convex``: program -> dict(test_loss)."""
    fig, ax = _subplots(1, 1, figsize=(6, 4.2))
    seen = {}
    for name, run in runs.items():
        i = seen[run["model"]] = seen.get(run["model"], -1) + 1
        ax.plot(*_shown(run["eval_seconds"], run["test_loss"]), color=_colour(run["model"]), ls=_style(i), label=name)
    for program, cv in convex.items():
        ax.axhline(cv["test_loss"], color=CONVEX_COLORS.get(program, "tab:green"), ls=(0, (4, 2)),
                   label=cv.get("label", f"convex ({program})"))
    _log_time_axis(ax)
    _log_scale(ax, "y")
    ax.set_ylabel("test loss per sample")
    ax.set_title("Test loss against time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    return fig


def plot_attention(maps, path):
    """Heatmaps of attention maps side by side; ``maps``: title -> ``(array (rows, n), row label)``.

    Each row is divided by its sum, so every panel shows the share of each input token in
    each output (group norms for the convex solution and networks (9)/(11), softmax
    probabilities for (3)), on one colour scale for all panels.
    """
    shares, labels = {}, {}
    for title, (M, labels[title]) in maps.items():
        M = np.asarray(M, dtype=float)
        sums = M.sum(axis=1, keepdims=True)
        shares[title] = np.divide(M, sums, out=np.zeros_like(M), where=sums > 0)
    import textwrap

    vmax = max(max(float(S.max()) for S in shares.values()), 1e-12)
    rows = max(S.shape[0] for S in shares.values())
    cols = min(len(maps), ATTENTION_COLUMNS)
    lines = -(-len(maps) // cols)
    fig, axes = _subplots(lines, cols, figsize=(4.6 * cols, lines * max(3.6, 2.4 + 0.3 * rows)), squeeze=False,
                          layout="constrained")
    for ax in axes.ravel()[len(maps):]:
        ax.axis("off")
    for ax, (title, M) in zip(axes.ravel(), shares.items()):
        im = ax.imshow(M, cmap="viridis", vmin=0, vmax=vmax, aspect="auto", interpolation="nearest")
        ax.set_title(textwrap.fill(title, 34), fontsize=11)
        ax.set_xlabel("input token k", fontsize=11)
        ax.set_ylabel(labels[title], fontsize=11)
        ax.set_yticks(range(M.shape[0]))
        ax.set_xticks(range(M.shape[1]))
        ax.tick_params(labelsize=10)
    fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02).set_label("share of the row", fontsize=11)
    fig.suptitle("Attention maps (each row normalised to sum 1)", fontsize=13)
    save_figure(fig, path)
    return fig


def plot_singular_values(convex, networks, beta, path, program="program (6)"):
    """Singular values of Z* (``convex``, descending) and of each network's effective coefficients
    (``networks``: name -> singular values), on a log scale. Arrays (P, k) are a stack of matrices
    (the gated MHSA program): one panel per gate, with its rank."""
    convex = np.atleast_2d(convex)
    P = convex.shape[0]
    cols = min(P, 4)
    rows = -(-P // cols)
    fig, axes = _subplots(rows, cols, figsize=(9 if P == 1 else 3.6 * cols + 3, 4.2 if P == 1 else 3.2 * rows),
                          squeeze=False, layout="constrained")
    floor = 1e-12 * max(float(np.max(convex)) if convex.size else 1.0, 1e-300)
    for g, ax in enumerate(axes.ravel()):
        if g >= P:
            ax.axis("off")
            continue
        k = np.arange(1, convex.shape[1] + 1)
        ax.semilogy(k, np.maximum(convex[g], floor), "o-", color="tab:green",
                    label=f"convex Z* ({program})" if P == 1 else "convex Z*_g")
        for i, (name, s) in enumerate(networks.items()):
            s = np.atleast_2d(s)[g]
            ax.semilogy(np.arange(1, len(s) + 1), np.maximum(s, floor), ls=_style(i), marker=".",
                        color=NETWORK_CYCLE[i % len(NETWORK_CYCLE)], label=name)
        rank = int(np.sum(convex[g] > floor * 1e3))
        ax.axvline(rank + 0.5, color="gray", lw=0.8, ls=":")
        ax.text(rank + 0.6, ax.get_ylim()[1], f"rank = {rank}", va="top", fontsize=8, color="gray")
        ax.set_xlabel("index i")
        ax.set_ylabel("singular value sigma_i")
        ax.set_title(f"Singular values (beta = {beta:.4g})" if P == 1 else f"gate {g}", fontsize=10 if P > 1 else None)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside right upper", fontsize=9)
    if P > 1:
        fig.suptitle(f"Singular values of each Z_g, {program} (beta = {beta:.4g})")
    save_figure(fig, path)
    return fig


def plot_grid(comparison, path):
    """``tuning.png``: the validation loss over the grid of every model and exact program."""
    t = comparison.tuning
    lrs, fracs = t["lr_grid"], t["beta_grid"]
    grids = {}
    for model, m in t["models"].items():
        i = [(r["lr"], r["beta_fraction"]) for r in m["grid"]].index((m["chosen"]["lr"], m["chosen"]["beta_fraction"]))
        grids[f"{model} {equation(model, comparison.problem.program.name)}"] = {
            "lr": lrs, "beta_frac": fracs, "chosen": divmod(i, len(fracs)),
            "loss": np.array([r["validation_loss"] for r in m["grid"]], dtype=float).reshape(len(lrs), len(fracs))}
    convex = {}
    for p, c in t["convex_exact"].items():
        convex[p] = {"beta_frac": np.array(fracs), "chosen": fracs.index(c["chosen"]["beta_fraction"]),
                           "loss": np.array([r["validation_loss"] for r in c["grid"]], dtype=float)}
    plot_tuning(grids, convex, path)
