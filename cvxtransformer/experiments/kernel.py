"""``cvxtransformer kernel``: convex kernel preconditioning on the periodicity task (UCSD report,
eq. (9), Section 6, Figure 2).

    cvxtransformer kernel --steps 3000 --out-dir runs/kernel

Trains, with the same settings and budget, on ``[(x^{-1} + y^2) (2x mod floor(log2 p))] mod p``:
the convex network, the convex network with a Fastfood map (:mod:`cvxtransformer.fastfood`,
``--kernel-features D``, default D = dim) before every layer, and the standard transformer.
Each run goes to ``DIR/<name>/`` as ``cvxtransformer grok`` writes it; then ``kernel_accuracy.png``
(train/test accuracy and test loss of the three) and ``summary.json`` (rows and the claim
``kernel_helps``: the preconditioned model reaches 99% test accuracy first, or ends with a test
accuracy higher by more than one percentage point than the plain convex one; null when the two
are within that margin; ``decided``: false for a ``--quick`` run, which only checks that the
experiment runs: its few steps decide nothing, and it says so in its output and ``note``).
"""
import os

from .config import add_model_arguments, add_task_arguments


def configure(parser):
    add_task_arguments(parser, "periodicity", 2, "Fastfood features per token (default: the embedding size)")
    parser.add_argument("--no-standard", action="store_true", help="skip the standard transformer")
    add_model_arguments(parser, steps_default=3000)


MARGIN = 0.01  # final test accuracies closer than this are a tie


def kernel_helps(plain, kernel):
    """The report's claim on two runs: True when the preconditioned run reaches 99% test accuracy
    first, or ends with a test accuracy higher by more than ``MARGIN``; False in the opposite
    cases; None (inconclusive) when neither reaches 99% and the final accuracies are within ``MARGIN``."""
    a, b = plain["steps_to_99_test"], kernel["steps_to_99_test"]
    if a is not None or b is not None:
        if a == b:
            return None
        return a is None or (b is not None and b < a)
    diff = kernel["final_test_accuracy"] - plain["final_test_accuracy"]
    return None if abs(diff) <= MARGIN else diff > 0


def run(args):
    """Entry point of the command line: ``run(args) -> exit code``."""
    from ..core.io import dumps, write_json
    from . import plots
    from .runner import row, run_convex_pair

    base = dict(task=args.task, modulus=args.modulus, layers=args.layers)
    results = run_convex_pair(args, base, standard=not args.no_standard)
    D = results["convex_kernel"]["config"]["kernel_features"]
    figure = os.path.join(args.out_dir, "kernel_accuracy.png")
    plots.plot_accuracy([(m["label"], m) for m in results.values()], figure,
                        f"Kernel preconditioning (L = {args.layers})")
    rows = [row(m, name=name) for name, m in results.items()]
    claims = {"kernel_helps": kernel_helps(results["convex"], results["convex_kernel"]), "decided": not args.quick}
    summary = {"rows": rows, "claims": claims, "kernel_features": D, "figures": {"kernel_accuracy.png": figure},
               "total_wall_seconds": sum(r["wall_seconds"] for r in rows)}
    if args.quick:
        steps = results["convex"]["config"]["steps"]
        summary["note"] = (f"a --quick run ({steps} steps) only checks that the experiment runs; it decides nothing "
                           "about the claim (docs/reproduction.md: with 10000 steps, kernel_helps is false)")
    write_json(os.path.join(args.out_dir, "summary.json"), summary)
    print(dumps(summary["claims"]))
    if args.quick:
        print(f"note: {summary['note']}")
    print(f"wrote {os.path.join(args.out_dir, 'summary.json')} ({summary['total_wall_seconds']:.0f} s in all)")
    return 0
