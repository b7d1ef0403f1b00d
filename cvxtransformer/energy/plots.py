"""Figures of the energy measurements (PNG, written atomically by :func:`~cvxtransformer.core.io.save_figure`)."""
import numpy as np

from ..core.io import save_figure


def _figure(ncols, width=5.2):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width * ncols, 3.8))


def plot_unfolded(result, path):
    """The paper's Figure 2 kind: ``E(Y^t) - E_min`` against the iteration t (log scale), one thin
    line per sentence and the median; steps that did not descend are marked with a red x."""
    fig, ax = _figure(1, 6.4)
    E = np.array(result["energies"], dtype=float)
    if all(m is not None for m in result["E_min"]):
        gap = E - np.array(result["E_min"], dtype=float)[:, None]
        gap = np.maximum(gap, 1e-16 * np.maximum(1.0, np.abs(E)))
        label, log = r"$E(Y^t) - E_{\min}$", True
    else:
        gap, label, log = E, r"$E(Y^t)$", False
    t = np.arange(E.shape[1])
    for row in gap:
        ax.plot(t, row, color="0.6", lw=0.7)
    ax.plot(t, np.median(gap, axis=0), color="C0", lw=2.2, label="median over sentences")
    bad = ~np.array(result["descended"], dtype=bool)
    s, k = np.nonzero(bad)
    if s.size:
        ax.plot(k + 1, gap[s, k + 1], "x", color="C3", ms=5, label=f"step that increased E ({s.size})")
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("iteration t (layer)")
    ax.set_ylabel(label)
    ax.set_title(f"unfolded transformer, d={result['dim']}, alpha2={result['alpha2']}, lam={result['lam']}, "
                 f"anchor={result['anchor']}", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_layers(result, path):
    """A real stack: left, per layer the relative change ``(E_l(out) - E_l(in)) / max(1, |E_l(in)|)``
    of the energy its own weights imply, one dot per sentence (below 0: descended); right, the
    control: the fraction of sentences on which layer l's step descended the energy of layer k's
    weights (the diagonal is the measurement itself)."""
    fig, (ax, bx) = _figure(2)
    rel = np.array(result["relative_change"], dtype=float)
    L = rel.shape[1]
    rng = np.random.default_rng(0)
    keys = {"C2": "descends on every sentence", "C1": "on some sentences", "C3": "on none"}
    for layer in range(L):
        y = rel[:, layer]
        x = layer + 1 + 0.12 * rng.uniform(-1, 1, y.size)
        color = "C2" if (y <= 0).all() else ("C3" if (y > 0).all() else "C1")
        ax.plot(x, y, ".", color=color, ms=4, label=keys.pop(color, None))
        ax.plot([layer + 0.7, layer + 1.3], [np.median(y)] * 2, color="k", lw=1.5,
                label="median" if layer == 0 else None)
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-2)
    ax.set_xticks(range(1, L + 1))
    ax.set_xlabel("layer l")
    ax.set_ylabel("relative change of E_l over layer l")
    ax.set_title(f"{result['model']}: the energy its own weights imply", fontsize=9)
    ax.legend(fontsize=7, title="the layer's step", title_fontsize=7)
    C = np.array(result["control_fraction_descended"], dtype=float)
    im = bx.imshow(C, vmin=0, vmax=1, cmap="RdYlGn", origin="upper")
    for k in range(L):
        for layer in range(L):
            bx.text(layer, k, f"{C[k, layer]:.2f}", ha="center", va="center", fontsize=7)
    bx.set_xticks(range(L), [str(i + 1) for i in range(L)])
    bx.set_yticks(range(L), [str(i + 1) for i in range(L)])
    bx.set_xlabel("step of layer l")
    bx.set_ylabel("energy of layer k's weights")
    bx.set_title("fraction of sentences descended", fontsize=9)
    fig.colorbar(im, ax=bx, fraction=0.046)
    save_figure(fig, path)
