"""``cvxtransformer grok``: one grokking run (Ergen et al., Figures 4-6; the UCSD report).

    cvxtransformer grok --modulus 97 --layers 1 --model convex --steps 3000 --out-dir runs/p97_L1_convex

Trains the convex network (L stacked program-(12) layers) or the standard transformer on
modular division (or, ``--task periodicity``, the UCSD report's periodicity task; with
``--kernel-features D`` the convex layers see Fastfood features, eq. (9)) and writes into
``DIR``: ``metrics.json`` (settings, ``steps_to_99_train``, ``steps_to_99_test`` (null when not
reached), ``grokking_steps``, ``final_train_accuracy``, ``final_test_accuracy``, curves,
spectral summaries), ``spectra.npz`` (every singular value recorded) and ``accuracy.png``,
``loss.png``, ``spectrum.png``. Exit code 0 when the run finished (whatever its accuracy).
"""
import os

from .config import QUICK, add_model_arguments, add_task_arguments, config_from_args


def configure(parser):
    add_task_arguments(parser, "division", 1,
                       "convex model only: Fastfood kernel preconditioning with D features per token")
    parser.add_argument("--model", choices=("convex", "standard"), default="convex")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_model_arguments(parser, steps_default=3000)


def summary(metrics):
    keys = ("label", "status", "steps_done", "steps_to_99_train", "steps_to_99_test", "grokking_steps",
            "final_train_accuracy", "final_test_accuracy", "final_test_loss", "train_seconds", "steps_per_second")
    return {k: metrics[k] for k in keys}


def run(args):
    """Entry point of the command line: ``run(args) -> exit code``."""
    from ..core.io import dumps, prepare_out_dir
    from .runner import load_finished, write_run
    from .runner import run as run_experiment

    config = config_from_args(args, **(QUICK if args.quick else {}))
    config.validate()
    prepare_out_dir(args.out_dir)
    metrics = load_finished(args.out_dir, config) if args.reuse else None
    if metrics is None:
        metrics, tracker = run_experiment(config, progress=args.progress)
        files = write_run(args.out_dir, metrics, tracker)
    else:
        files = [os.path.join(args.out_dir, name) for name in ("metrics.json", "spectra.npz", "accuracy.png",
                                                                 "loss.png", "spectrum.png")]
    s = summary(metrics)
    if args.json:
        print(dumps(dict(s, files=files)))
    else:
        fmt = lambda v: "not reached" if v is None else v
        print(f"{s['label']} on {config.task} mod {config.modulus}: {s['status']} after {s['steps_done']} steps "
              f"({s['train_seconds']:.1f} s training)")
        print(f"  99% train at {fmt(s['steps_to_99_train'])}, 99% test at {fmt(s['steps_to_99_test'])}, "
              f"grokking {fmt(s['grokking_steps'])}")
        print(f"  final accuracy train {s['final_train_accuracy']:.4f}, test {s['final_test_accuracy']:.4f}")
        print(f"  wrote {', '.join(files)}")
    return 0

