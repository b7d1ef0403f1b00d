"""``cvxtransformer grok-ladder``: the ablation ladder of docs/reproduction.md, several seeds, on one
split and budget; also a grid over readings of division and train fractions.

    cvxtransformer grok-ladder --seeds 0,1,2 --steps 20000 --budgets relu=30000 --out-dir runs/ladder

Trains every ``--models`` rung (default: ``convex``, ``convex-learned-gates``, ``relu``, ``ucsd``,
``standard``; see :mod:`cvxtransformer.nn.deep`) for every seed (the seed fixes the split, the
initialisation, the gates and the batches), each to 99% train and test accuracy or to its budget
(``--steps``, or the rung's entry of ``--budgets model=steps,...``), each run into
``DIR/<name>/seed<s>/`` as ``cvxtransformer grok`` writes it (relu runs also write ``weights.npz``,
the teacher of ``grok-gates``). ``<name>`` is the model, followed by ``_<reading>`` and
``_frac<f>`` when ``--readings`` or ``--train-fractions`` list more than one value. Then
``DIR/summary.json``: the rows of every run, and per setting the mean, standard deviation, min and
max over the seeds of the final accuracies (all test rows, ``x != 0``, ``x = 0``), of the mean rank
of the true label and of the first step with 99% test accuracy (``stats.aggregate_runs``); and the
figures ``ladder.png`` (final accuracy on the ``x != 0`` test rows per rung, or against the train
fraction) and, for one train fraction, ``ladder_curves.png`` (every run's curves).
"""
import os

from .config import MODELS, READINGS, Given, add_model_arguments, add_task_arguments, parse_list


def parse_budgets(text, models):
    """``"relu=30000,ucsd=6000"`` -> {"relu": 30000, "ucsd": 6000}; errors name the option."""
    from ..core.errors import InvalidInputError

    out = {}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        model, _, steps = item.partition("=")
        if model not in MODELS or not steps.isdigit() or int(steps) < 1:
            raise InvalidInputError(f"--budgets: expected items MODEL=STEPS (MODEL in {', '.join(MODELS)}), "
                                    f"got {item!r}")
        out[model] = int(steps)
    return out


def configure(parser):
    add_task_arguments(parser, "division", 1, "convex models only: Fastfood features per token")
    parser.add_argument("--models", default=",".join(MODELS), help=f"rungs to run (default {','.join(MODELS)})")
    parser.add_argument("--seeds", default="0,1,2", action=Given, help="seeds, comma-separated (default 0,1,2)")
    parser.add_argument("--budgets", default="", help="step budgets per rung, e.g. relu=30000,ucsd=6000 "
                                                      "(default: --steps for every rung)")
    parser.add_argument("--readings", default=None, help="division readings to run (default: --reading)")
    parser.add_argument("--train-fractions", default=None, help="train fractions to run (default: --train-fraction)")
    add_model_arguments(parser, steps_default=3000)


def configs(args):
    """``[(name, config)]`` of every run of the grid, validated before any training."""
    from .config import config_from_args

    models = parse_list("models", args.models, str, MODELS)
    seeds = parse_list("seeds", "0" if args.quick and "seeds" not in getattr(args, "given", ()) else args.seeds, int)
    readings = parse_list("readings", args.readings or args.reading, str, READINGS)
    fractions = parse_list("train-fractions", args.train_fractions or str(args.train_fraction), float)
    budgets = parse_budgets(args.budgets, models)
    out = []
    for model in models:
        for reading in readings:
            for fraction in fractions:
                name = model + (f"_{reading}" if len(readings) > 1 else "") + \
                    (f"_frac{fraction:g}" if len(fractions) > 1 else "")
                for seed in seeds:
                    extra = {} if model not in budgets else {"steps": budgets[model]}
                    cfg = config_from_args(args, model=model, reading=reading, train_fraction=fraction, seed=seed,
                                           **extra)
                    out.append((name, cfg.validate()))
    return out


def run(args):
    """Entry point of the command line: ``run(args) -> exit code``."""
    from ..core.io import dumps, prepare_out_dir, write_json
    from . import plots
    from .runner import row, run_and_write
    from .stats import aggregate_runs, fmt_mean

    grid = configs(args)
    prepare_out_dir(args.out_dir)
    results = {}
    for name, cfg in grid:
        sub = os.path.join(args.out_dir, name, f"seed{cfg.seed}")
        m = run_and_write(cfg, sub, progress=args.progress, reuse=args.reuse, save_weights=cfg.model == "relu")
        results.setdefault(name, []).append(m)
    rows = [row(m, name=name) for name, ms in results.items() for m in ms]
    aggregates = {name: dict(aggregate_runs(ms), model=ms[0]["config"]["model"], reading=ms[0]["config"]["reading"],
                             train_fraction=ms[0]["config"]["train_fraction"], steps=ms[0]["config"]["steps"])
                  for name, ms in results.items()}
    figures = [os.path.join(args.out_dir, "ladder.png")]
    plots.plot_ladder(results, figures[0])
    if len({cfg.train_fraction for _, cfg in grid}) == 1:
        figures.append(os.path.join(args.out_dir, "ladder_curves.png"))
        plots.plot_accuracy([(ms[0]["label"], m) for ms in results.values() for m in ms], figures[1],
                            f"{len(results[next(iter(results))])} seed(s) per rung")
    summary = {"rows": rows, "aggregates": aggregates, "figures": figures,
               "total_wall_seconds": sum(r["wall_seconds"] for r in rows)}
    write_json(os.path.join(args.out_dir, "summary.json"), summary)
    for name, a in aggregates.items():
        first = "" if a["steps_to_99_test"]["n"] == 0 else \
            f", first step with 99%: {fmt_mean(a['steps_to_99_test'], 0)}"
        print(f"{name}: final test accuracy {fmt_mean(a['final_test_accuracy'])}, x != 0 "
              f"{fmt_mean(a['final_test_accuracy_nonzero'])}; 99% test reached by {a['reached_99_test']} seeds{first}")
    print(dumps({"figures": figures}))
    print(f"wrote {os.path.join(args.out_dir, 'summary.json')} ({summary['total_wall_seconds']:.0f} s in all)")
    return 0
