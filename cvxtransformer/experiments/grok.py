"""``cvxtransformer grok``: one grokking run (Ergen et al., Figures 4-6; the UCSD report).

    cvxtransformer grok --modulus 97 --layers 1 --model convex --steps 3000 --out-dir runs/p97_L1_convex

Trains one rung of the ablation ladder of docs/reproduction.md (``--model``): ``convex`` (L
stacked program-(12) layers with fixed random gates), ``convex-learned-gates`` (the same, gates
trained), ``relu`` (network (11) with ReLU gates), ``ucsd`` (the UCSD report's convex blocks and
MLPs) or ``standard`` (the transformer), on modular division (``--reading``: which table of
``x / y``) or, ``--task periodicity``, the UCSD report's periodicity task (with
``--kernel-features D`` the convex layers see Fastfood features, eq. (9)). Writes into ``DIR``:
``metrics.json`` (settings, ``steps_to_99_train``, ``steps_to_99_test`` (null when not reached),
``grokking_steps``, the final accuracies with ``final_test_accuracy_ci95`` (Wilson, 95%),
``final_test_accuracy_nonzero`` / ``_zero`` (test rows with x != 0 / x = 0),
``true_label_mean_rank``, curves, spectral summaries), ``spectra.npz`` (every singular value
recorded), ``accuracy.png``, ``loss.png``, ``spectrum.png`` and, ``--save-weights``, the trained
parameters (``weights.npz``). Exit code 0 when the run finished (whatever its accuracy).
"""
import os

from .config import MODELS, add_model_arguments, add_task_arguments, config_from_args, task_title


def configure(parser):
    add_task_arguments(parser, "division", 1,
                       "convex model only: Fastfood kernel preconditioning with D features per token")
    parser.add_argument("--model", choices=MODELS, default="convex",
                        help="the rung of the ablation ladder (default convex: fixed random gates)")
    parser.add_argument("--save-weights", action="store_true", help="also write the parameters (weights.npz)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_model_arguments(parser, steps_default=3000)


SUMMARY = ("label", "status", "steps_done", "steps_to_99_train", "steps_to_99_test", "grokking_steps",
           "final_train_accuracy", "final_test_accuracy", "final_test_accuracy_ci95", "final_test_accuracy_nonzero",
           "final_test_accuracy_zero", "true_label_mean_rank", "final_test_loss", "train_seconds",
           "steps_per_second")


def summary(metrics):
    return {k: metrics.get(k) for k in SUMMARY}


def run(args):
    """Entry point of the command line: ``run(args) -> exit code``."""
    from ..core.io import dumps, prepare_out_dir
    from .runner import load_finished, reached, write_run
    from .runner import run as run_experiment

    config = config_from_args(args)
    config.validate()
    prepare_out_dir(args.out_dir)
    metrics = load_finished(args.out_dir, config) if args.reuse else None
    if metrics is not None and args.save_weights and not os.path.exists(os.path.join(args.out_dir, "weights.npz")):
        metrics = None
    if metrics is None:
        metrics, tracker, net = run_experiment(config, progress=args.progress, return_net=True)
        files = write_run(args.out_dir, metrics, tracker, net=net if args.save_weights else None)
    else:
        names = ["metrics.json", "spectra.npz", "accuracy.png", "loss.png", "spectrum.png"]
        names += ["weights.npz"] if os.path.exists(os.path.join(args.out_dir, "weights.npz")) else []
        files = [os.path.join(args.out_dir, name) for name in names]
    s = summary(metrics)
    if args.json:
        print(dumps(dict(s, files=files)))
    else:
        num = lambda v: "n/a" if v is None else f"{v:.4f}"
        low, high = s["final_test_accuracy_ci95"]
        print(f"{s['label']} on {task_title(config)}: {s['status']} after {s['steps_done']} steps "
              f"({s['train_seconds']:.1f} s training)")
        grokking = "" if s["grokking_steps"] is None else f"; grokking: {s['grokking_steps']} steps"
        print(f"  99% train: {reached(s['steps_to_99_train'])}; 99% test: {reached(s['steps_to_99_test'])}{grokking}")
        print(f"  final accuracy train {s['final_train_accuracy']:.4f}, test {s['final_test_accuracy']:.4f} "
              f"(95% CI {low:.4f}-{high:.4f}); test x != 0: {num(s['final_test_accuracy_nonzero'])}, "
              f"x = 0: {num(s['final_test_accuracy_zero'])}; mean rank of the true label "
              f"{s['true_label_mean_rank']:.1f}")
        print(f"  wrote {', '.join(files)}")
    return 0
