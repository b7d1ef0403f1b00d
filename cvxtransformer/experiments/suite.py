"""``cvxtransformer grok-suite``: the grokking experiment of Ergen et al., Figures 4-7.

    cvxtransformer grok-suite --steps 3000 --out-dir runs/grok

Runs modular division with p = 97 (L = 1, 2) and p = 15 (L = 1, 4), convex and standard,
with the same settings and budget (``--settings``, ``--models`` select a subset), for each seed of
``--seeds`` (default: ``--seed``), each run into ``DIR/p<P>_L<L>_<model>/seed<s>/`` as ``cvxtransformer
grok`` writes it, then draws

* ``fig4_mod97_L1.png``: train accuracy, test accuracy and test loss, convex vs standard, p = 97, L = 1;
* ``fig5_mod97_L1_L2.png``: the same with L = 1 and L = 2;
* ``fig6_mod15_L1_L4.png``: p = 15, L = 1 and L = 4;
* ``fig7_grokking.png``: iterations to 99% test accuracy and amount of grokking, per setting;

and writes ``DIR/summary.json``: one row per run (iterations to 99% train and test, grokking,
final accuracies, time), per setting the aggregate over the seeds (:func:`.stats.aggregate_runs`)
and the paper's claims evaluated on these aggregates (``claims``: true, false, or null when the
runs needed are missing or not every seed reached 99%; a setting's iterations to 99% test are
the mean over its seeds).
"""
import os

from .config import RunConfig, add_model_arguments, config_from_args, parse_list

DEFAULT_SETTINGS = "97:1,97:2,15:1,15:4"


def parse_settings(text):
    """``"97:1,15:4"`` -> [(97, 1), (15, 4)]; a user error names the option."""
    from ..core.errors import InvalidInputError

    out = []
    for item in text.split(","):
        try:
            p, L = (int(v) for v in item.split(":"))
        except ValueError:
            raise InvalidInputError(f"--settings: expected items P:L separated by commas (e.g. {DEFAULT_SETTINGS}), "
                                    f"got {item!r}") from None
        out.append((p, L))
    return out


def configure(parser):
    parser.add_argument("--settings", default=DEFAULT_SETTINGS,
                        help=f"modulus:layers pairs to run (default {DEFAULT_SETTINGS})")
    parser.add_argument("--models", default="convex,standard", help="models to run (default convex,standard)")
    parser.add_argument("--seeds", default=None, help="seeds, comma-separated (default: --seed)")
    add_model_arguments(parser, steps_default=3000)


def _cmp(a, b):
    """a < b for steps-to-99 where None means 'not reached' (worse than any number)."""
    if a is None and b is None:
        return None
    return b is None if a is None or b is None else a < b


def setting_rows(rows):
    """One row per (modulus, layers, model) from the rows of its seeds: ``steps_to_99_test`` and
    ``grokking_steps`` are the means over the seeds when every seed reached 99%, else None."""
    out = {}
    for r in rows:
        out.setdefault((r["modulus"], r["layers"], r["model"]), []).append(r)
    mean = lambda rs, k: None if any(r[k] is None for r in rs) else sum(r[k] for r in rs) / len(rs)
    return [dict(modulus=p, layers=L, model=m, steps_to_99_test=mean(rs, "steps_to_99_test"),
                 grokking_steps=mean(rs, "grokking_steps")) for (p, L, m), rs in out.items()]


def claims(rows):
    """The paper's grokking claims, evaluated on the runs of this suite (several seeds of a setting:
    on :func:`setting_rows`)."""
    rows = setting_rows(rows) if any("seed" in r for r in rows) else rows
    get = lambda p, L, m: next((r for r in rows if r["modulus"] == p and r["layers"] == L and r["model"] == m), None)
    s99 = lambda r: None if r is None else r["steps_to_99_test"]
    out = {}
    c, s = get(97, 1, "convex"), get(97, 1, "standard")
    out["mod97_convex_fewer_iterations_than_standard_L1"] = None if c is None or s is None else _cmp(s99(c), s99(s))
    c2, s2 = get(97, 2, "convex"), get(97, 2, "standard")
    out["mod97_convex_fewer_iterations_than_standard_L2"] = None if c2 is None or s2 is None else _cmp(s99(c2), s99(s2))
    out["mod97_second_layer_helps_convex"] = None if c is None or c2 is None else _cmp(s99(c2), s99(c))
    for model in ("convex", "standard"):
        one, four = get(15, 1, model), get(15, 4, model)
        out[f"mod15_{model}_L1_fails"] = None if one is None else s99(one) is None
        out[f"mod15_{model}_L4_succeeds"] = None if four is None else s99(four) is not None
    for key in ("mod97_L1", "mod97_L2", "mod15_L4"):
        p, L = int(key[3:5]), int(key[-1])
        c, s = get(p, L, "convex"), get(p, L, "standard")
        if c and s and c["grokking_steps"] is not None and s["grokking_steps"] is not None:
            out[f"{key}_convex_less_grokking"] = c["grokking_steps"] < s["grokking_steps"]
        else:
            out[f"{key}_convex_less_grokking"] = None
    return out


def run(args):
    """Entry point of the command line: ``run(args) -> exit code``."""
    from ..core.io import dumps, prepare_out_dir, write_json
    from . import plots
    from .runner import row, run_and_write
    from .stats import aggregate_runs

    settings = parse_settings(args.settings)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    seeds = parse_list("seeds", args.seeds or str(args.seed), int)
    configs = []
    for p, L in settings:
        for model in models:
            for seed in seeds:
                configs.append(config_from_args(args, task="division", modulus=p, layers=L, model=model,
                                                seed=seed).validate())
    prepare_out_dir(args.out_dir)
    results = {}
    for cfg in configs:
        sub = os.path.join(args.out_dir, f"p{cfg.modulus}_L{cfg.layers}_{cfg.model}", f"seed{cfg.seed}")
        results.setdefault((cfg.modulus, cfg.layers, cfg.model), []).append(
            run_and_write(cfg, sub, progress=args.progress, reuse=args.reuse))
    rows = [row(m, setting=f"p={p}, L={L}") for (p, L, _), ms in results.items() for m in ms]

    def runs(*keys):
        return [(f"{m} L={L}", run) for p, L, m in keys if (p, L, m) in results for run in results[(p, L, m)]]

    figures = {}
    for name, keys, title in (
            ("fig4_mod97_L1.png", [(97, 1, m) for m in models], "Figure 4: L = 1"),
            ("fig5_mod97_L1_L2.png", [(97, L, m) for L in (1, 2) for m in models], "Figure 5: L = 1 vs 2"),
            ("fig6_mod15_L1_L4.png", [(15, L, m) for L in (1, 4) for m in models], "Figure 6: L = 1 vs 4")):
        selected = runs(*keys)
        if selected:
            figures[name] = os.path.join(args.out_dir, name)
            plots.plot_accuracy(selected, figures[name], title)
    figures["fig7_grokking.png"] = os.path.join(args.out_dir, "fig7_grokking.png")
    plots.plot_grokking_bars(rows, figures["fig7_grokking.png"],
                             budget_note=f" (budget {configs[0].steps} iterations)")
    aggregates = {f"p{p}_L{L}_{m}": aggregate_runs(ms) for (p, L, m), ms in results.items()}
    summary = {"rows": rows, "aggregates": aggregates, "claims": claims(rows), "figures": figures,
               "total_train_seconds": sum(r["train_seconds"] for r in rows),
               "total_wall_seconds": sum(r["wall_seconds"] for r in rows)}
    write_json(os.path.join(args.out_dir, "summary.json"), summary)
    print(dumps(summary["claims"], indent=1))
    print(f"wrote {os.path.join(args.out_dir, 'summary.json')} and {len(figures)} figures "
          f"({summary['total_wall_seconds']:.0f} s in all)")
    return 0


__all__ = ["configure", "run", "claims", "RunConfig"]
