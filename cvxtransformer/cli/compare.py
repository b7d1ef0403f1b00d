"""``cvxtransformer compare``: the certified convex optimum against SGD/Adam-trained networks.

A thin layer over :func:`cvxtransformer.compare` (:mod:`cvxtransformer.comparison`): this module
parses the options, reads DATA, writes the files and prints; the comparison itself is the API's.

Solves the convex program, trains the chosen nonconvex networks on the same data and reports
for each network, separately, the training loss (sum over samples), the regulariser and their
sum, its own objective; the test loss; its certified lower bound D(V) and certified optimality
gap ``objective - D(V)`` where a convex program bounds it (docs/conventions.md, Proposition 1
and Sahiner et al.):

* alternative attention (6)/(9): program (8) when ``--program 8``, else program (10);
* gated-ReLU network (11): program (12), with the same gates U1, U2;
* the same networks with ordinary weight decay, (9w) and (11w) (the default with several outputs): the
  attention programs with a nuclear norm per token (docs/conventions.md);
* the networks of the other registered families (``--program`` NAME; each family's reduction declares
  them in ``models``, :data:`cvxtransformer.comparison.models.MODELS`; docs/ has a page per family):
  each against its family's program, with the same gate arrays. A model declared not ``bounded`` (the
  same heads or units with a real ReLU, whose masks move with the weights) is compared with the gated
  program's optimum, which it may beat;
* ``convex``: the coefficients Z of ``--program`` (8/10/12) trained by Adam/SGD on P(Z) itself
  (the paper trains its convex model this way too), certified by the same D(V);
* softmax attention (3): not covered; it is compared with the optimum of ``--program``, and
  its ``certified_gap`` is null. Its regulariser (weight decay on four matrices) is not the
  group lasso, so its objective and the convex one are different functions: compare training
  and test losses across these two, objectives only within a family.

Two modes:

* fixed (``--beta`` or ``--beta-frac``, ``--lr``): every model shares beta and the learning rate;
* ``--tune``: DATA must hold ``X_val``, ``y_val``. For each model, every (learning rate, beta) of
  ``--lr-grid`` x ``--beta-grid`` (fractions of beta_max of ``--program`` on the training split)
  is trained on the training split and scored by its mean validation loss per sample; the best
  is retrained with the same seed and reported on the test split. The exact solution of every
  convex program is tuned over the same beta grid. The test split is never read before every
  choice is made (:mod:`cvxtransformer.comparison.tuning`). ``--json`` names the grid, every validation loss and
  the values chosen.

Every program that some model needs is solved (``--program`` always; in ``--tune`` mode at every
beta of the grid, which also gives each network the bound at its own beta) with the verifier's
refined dual point (``refine=True``), so a gap is not inflated by a loose bound. ``--heads`` takes
one head count or several (``1,2,4``; one with ``--tune``); for a nuclear-norm family's networks
the default is below, at and above rank(Z*). Everything is validated before any solve or training, so a user
error writes nothing.

Outputs in ``--out-dir``: ``<run>.npz`` (trained weights, with ``objective_history`` and
``seconds_history``; ``<run>`` is the model, or ``<model>_m<heads>`` with several head counts),
``convex_p<program>.npz`` or ``convex_<name>.npz`` (the convex solutions, as ``solve --out``: ``convex_p10.npz``
for program (10), ``convex_<name>.npz`` for a family named by a string), ``compare.json`` (what
``--json`` prints), ``objective.png``, ``attention.png`` (group-lasso programs; with the teacher's
map when DATA holds ``teacher_attention``, as ``cvxtransformer bert-data`` writes),
``singular_values.png`` (nuclear-norm programs; one panel per gate), ``tuning.png`` (``--tune``) and, when DATA holds ``X_test``
and ``y_test``, ``test_loss.png``.
"""
import argparse
import os

from .options import LOSS_HELP, add_program_argument, positive_float, positive_int, seed, tolerance

GRID = "1e-3,1e-2,1e-1"  # the default grids of cvxtransformer.comparison.run, for the help text


def positive_floats(text):
    """argparse type: a comma-separated list of numbers > 0."""
    values = [positive_float(v) for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers > 0, got {text!r}")
    return list(dict.fromkeys(values))


def configure(p):
    p.add_argument("data", metavar="DATA.npz",
                   help="X (N, n, d) and y as for solve; optionally X_val, y_val (--tune), X_test, y_test, "
                        "U1 (h, n), U2 (h, d), H (P, d, d), teacher_attention (n, n)")
    add_program_argument(p, "the convex program solved and reported at the top level")
    p.add_argument("--loss", choices=("squared", "logistic", "cross_entropy"), required=True, help=LOSS_HELP)
    beta = p.add_mutually_exclusive_group()
    beta.add_argument("--beta", type=positive_float, help="regularization weight beta > 0 (shared by every model)")
    beta.add_argument("--beta-frac", type=positive_float, metavar="F", help="beta = F * beta_max of --program on DATA")
    p.add_argument("--models", default=None, metavar="M1,M2",
                   help="comma-separated names of models that join --program: alternative, gated (penalty with "
                        "an l1 norm squared on each output vector), alternative_wd, gated_wd (ordinary weight decay), "
                        "softmax, convex for the attention programs, the networks each other family declares "
                        "(cvxtransformer.comparison.MODELS); default: alternative_wd,softmax (gated_wd,softmax on a "
                        "gated program) with several outputs, alternative,softmax (gated,softmax) with one; the "
                        "family's own for the others; with --tune, convex is added for the attention programs")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="the networks' optimiser")
    p.add_argument("--lr", type=positive_float, default=None,
                   help="learning rate (default 0.01; objectives are sums over samples, so SGD needs about 1/(N L))")
    p.add_argument("--steps", type=positive_int, default=2000, help="training steps")
    p.add_argument("--batch-size", type=positive_int, default=None, help="mini-batch size (default: full batch)")
    p.add_argument("--heads", default=None, metavar="M[,M2,...]",
                   help="heads of the networks, one count or several (default: the number of groups of the "
                        "bounding program for (9)/(11), enough for any convex solution; the support of Z* (its "
                        "per-token ranks summed) for (9w)/(11w), as many as the optimum needs; for the networks of a "
                        "nuclear-norm family, rank(Z*) - 1, rank(Z*) and 2 rank(Z*) (rank summed over the gates))")
    p.add_argument("--gates", type=positive_int, default=8,
                   help="gates sampled when DATA has none of the program's gate arrays: h of program (12) and "
                        "network (11), P of a family with P gates")
    p.add_argument("--gate-seed", type=seed, default=0, help="seed of the sampled gates")
    p.add_argument("--classes", type=positive_int, default=None, help="number of classes (cross-entropy only)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the initialisations and mini-batches")
    p.add_argument("--eval-every", type=positive_int, default=None, help="steps between metric evaluations")
    p.add_argument("--solver", choices=("auto", "clarabel", "scs", "fista"), default="auto", help="convex solver")
    p.add_argument("--tol", type=tolerance, default=1e-6, help="relative duality gap to certify, in [1e-15, 1)")
    tune = p.add_argument_group("tuning on the validation split (Section 4 of the paper)")
    tune.add_argument("--tune", action="store_true",
                      help="tune the learning rate and beta of every model on X_val, y_val of DATA, report on the "
                           "test split (instead of --beta/--beta-frac and --lr)")
    tune.add_argument("--lr-grid", type=positive_floats, default=None, metavar="LR1,LR2",
                      help=f"learning rates tried with --tune (default {GRID})")
    tune.add_argument("--beta-grid", type=positive_floats, default=None, metavar="F1,F2",
                      help=f"betas tried with --tune, as fractions of beta_max of --program on the training split "
                           f"(default {GRID})")
    p.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the weights, JSON and PNG plots")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quiet", action="store_true",
                   help="no progress (a bar per network on a terminal; in a log, a plain line every 30 s and at its end)")


def _check_mode(args, data):
    """The options of the chosen mode; returns the tuning grids (None without --tune)."""
    from ..core.errors import InvalidInputError

    if not args.tune:
        for name, value in (("--lr-grid", args.lr_grid), ("--beta-grid", args.beta_grid)):
            if value is not None:
                raise InvalidInputError(f"{name}: only with --tune; add --tune or leave it out")
        if args.beta is None and args.beta_frac is None:
            raise InvalidInputError("--beta: one of --beta, --beta-frac or --tune is required")
        return None
    for name, value, fix in (("--beta", args.beta, "--beta-grid"), ("--beta-frac", args.beta_frac, "--beta-grid"),
                             ("--lr", args.lr, "--lr-grid")):
        if value is not None:
            raise InvalidInputError(f"{name}: not with --tune, which chooses it on the validation split; "
                                    f"give the values to try with {fix}")
    if "X_val" not in data or "y_val" not in data:
        raise InvalidInputError(f"DATA: --tune needs X_val and y_val in {args.data!r} (it holds {sorted(data)}); "
                                "save a validation split, e.g. with cvxtransformer bert-data")
    return {k: v for k, v in (("lr", args.lr_grid), ("beta_frac", args.beta_grid)) if v is not None}


def prepare(args):
    """Read DATA and validate every option: a :class:`cvxtransformer.comparison.Plan` (no solve, no
    training, no file written), and the classes of string labels (None for numeric targets)."""
    from ..comparison import plan
    from ..comparison.models import check_heads, check_models
    from ..core.errors import InvalidInputError
    from ..core.io import load_npz
    from ..core.registry import gate_arrays
    from .options import encode_labels, make_problem_from

    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise InvalidInputError(f"--out-dir: expected a folder (created if missing), got {args.out_dir!r}, "
                                "an existing file")
    data = load_npz(args.data, "DATA", ("X", "y"))
    grid = _check_mode(args, data)
    # the defaults depend on the targets' outputs: plan() chooses them once the problem is built
    models = None if args.models is None else check_models(args.models, args.program, tuned=grid is not None,
                                                            argument="--models")
    heads = check_heads(args.heads, argument="--heads")
    if grid is not None and heads is not None and len(heads) > 1:
        raise InvalidInputError(f"--heads: expected one head count with --tune, got {args.heads!r}")
    for split in ("test", "val"):
        if (f"X_{split}" in data) != (f"y_{split}" in data):
            raise InvalidInputError(f"DATA: {args.data!r} has only one of X_{split}, y_{split}; save both or neither")
    arrays = {k: data[k] for k in gate_arrays() if k in data}  # DATA's gate arrays, by name
    y, classes = encode_labels(data["y"], args.loss)
    for split in ("test", "val"):
        if f"y_{split}" in data and classes is not None:
            data[f"y_{split}"] = encode_labels(data[f"y_{split}"], args.loss, classes, f"y_{split}")[0]
    problem = make_problem_from(args, data["X"], y, tuned=grid is not None, **arrays)
    return classes, plan(problem, models=models, optimizer=args.optimizer, lr=args.lr, steps=args.steps, heads=heads,
                seed=args.seed, batch_size=args.batch_size, eval_every=args.eval_every, solver=args.solver,
                tol=args.tol, gates=dict(arrays, gates=args.gates) if arrays else args.gates, gate_seed=args.gate_seed,
                test=_split(data, "test"), validation=_split(data, "val"), tune=grid,
                teacher_attention=data.get("teacher_attention"), sequence=data["y"].ndim == 3,
                progress=not args.quiet)


def _split(data, name):
    return (data[f"X_{name}"], data[f"y_{name}"]) if f"X_{name}" in data else None


def run(args):
    from ..comparison.result import format_report
    from ..core.io import dumps, prepare_out_dir
    from .options import class_mapping

    classes, plan = prepare(args)
    prepare_out_dir(args.out_dir)
    comparison = plan.run()
    labels = {} if classes is None else {"classes": classes.tolist(), "class_mapping": class_mapping(classes, args.loss)}
    summary = comparison.summary(args.out_dir, comparison.save(args.out_dir, **labels), **labels)
    text = format_report(summary) + (f"\nclasses: {labels['class_mapping']}" if labels else "")
    print(dumps(summary) if args.json else text)
    return 0 if comparison.certified else 1
