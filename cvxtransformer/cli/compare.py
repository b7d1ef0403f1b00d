"""``cvxtransformer compare``: the certified convex optimum against SGD/Adam-trained networks.

Solves the convex program, trains the chosen nonconvex networks on the same data and reports
for each network, separately, the training loss (sum over samples), the regulariser and their
sum, its own objective; the test loss; its certified lower bound D(V) and certified optimality
gap ``objective - D(V)`` where a convex program bounds it (docs/conventions.md, Proposition 1
and Sahiner et al.):

* alternative attention (6)/(9): program (8) when ``--program 8``, else program (10);
* gated-ReLU network (11): program (12), with the same gates U1, U2;
* linear multi-head self-attention (5): program (6) (``mhsa``);
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
  choice is made (:mod:`.compare_tune`). ``--json`` names the grid, every validation loss and
  the values chosen.

Every program that some model needs is solved (``--program`` always; in ``--tune`` mode at every
beta of the grid, which also gives each network the bound at its own beta) with the verifier's
refined dual point (``refine=True``), so a gap is not inflated by a loose bound. ``--heads`` takes
one head count or several (``1,2,4``; one with ``--tune``); for ``linear_mhsa`` the default is
below, at and above rank(Z*). Everything is validated before any solve or training, so a user
error writes nothing.

Outputs in ``--out-dir``: ``<run>.npz`` (trained weights, with ``objective_history`` and
``seconds_history``; ``<run>`` is the model, or ``<model>_m<heads>`` with several head counts),
``convex_p<program>.npz`` (the convex solutions, as ``solve --out``), ``compare.json`` (what
``--json`` prints), ``objective.png``, ``attention.png`` (group-lasso programs; with the teacher's
map when DATA holds ``teacher_attention``, as ``cvxtransformer bert-data`` writes),
``singular_values.png`` (``mhsa``), ``tuning.png`` (``--tune``) and, when DATA holds ``X_test``
and ``y_test``, ``test_loss.png``.
"""
import argparse
import os
import time

from .options import LOSS_HELP, positive_float, positive_int, program, tolerance

MODELS = ("alternative", "gated", "softmax", "linear_mhsa", "convex")
EQUATION = {"alternative": "(9)", "gated": "(11)", "softmax": "(3)", "linear_mhsa": "(5)"}
DEFAULT_MODELS = {8: "alternative,softmax", 10: "alternative,softmax", 12: "gated,softmax", "mhsa": "linear_mhsa"}
LR_GRID, BETA_GRID = "1e-3,1e-2,1e-1", "1e-3,1e-2,1e-1"


def positive_floats(text):
    """argparse type: a comma-separated list of numbers > 0."""
    values = [positive_float(v) for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers > 0, got {text!r}")
    return list(dict.fromkeys(values))


def configure(p):
    p.add_argument("data", metavar="DATA.npz",
                   help="X (N, n, d) and y as for solve; optionally X_val, y_val (--tune), X_test, y_test, "
                        "U1 (h, n), U2 (h, d), teacher_attention (n, n)")
    p.add_argument("--program", type=program, required=True, metavar="{8,10,12,mhsa}",
                   help="the convex program solved and reported at the top level")
    p.add_argument("--loss", choices=("squared", "logistic", "cross_entropy"), required=True, help=LOSS_HELP)
    beta = p.add_mutually_exclusive_group()
    beta.add_argument("--beta", type=positive_float, help="regularization weight beta > 0 (shared by every model)")
    beta.add_argument("--beta-frac", type=positive_float, metavar="F", help="beta = F * beta_max of --program on DATA")
    p.add_argument("--models", default=None, metavar="M1,M2",
                   help="comma-separated from alternative, gated, softmax, linear_mhsa, convex (default: "
                        "alternative,softmax; gated,softmax for --program 12; linear_mhsa for --program mhsa; "
                        "with --tune, convex is added for 8/10/12)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="the networks' optimiser")
    p.add_argument("--lr", type=positive_float, default=None,
                   help="learning rate (default 0.01; objectives are sums over samples, so SGD needs about 1/(N L))")
    p.add_argument("--steps", type=positive_int, default=2000, help="training steps")
    p.add_argument("--batch-size", type=positive_int, default=None, help="mini-batch size (default: full batch)")
    p.add_argument("--heads", default=None, metavar="M[,M2,...]",
                   help="heads of the networks, one count or several (default: the number of groups of the "
                        "bounding program for (9)/(11), enough for any convex solution; for (5), rank(Z*) - 1, "
                        "rank(Z*) and 2 rank(Z*))")
    p.add_argument("--gates", type=positive_int, default=8, metavar="H",
                   help="gates h of program (12) and network (11) when DATA has no U1, U2")
    p.add_argument("--gate-seed", type=int, default=0, help="seed of the sampled gates")
    p.add_argument("--classes", type=positive_int, default=None, help="number of classes (cross-entropy only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialisations and mini-batches")
    p.add_argument("--eval-every", type=positive_int, default=None, help="steps between metric evaluations")
    p.add_argument("--solver", choices=("auto", "clarabel", "scs", "fista"), default="auto", help="convex solver")
    p.add_argument("--tol", type=tolerance, default=1e-6, help="relative duality gap to certify, in (0, 1)")
    tune = p.add_argument_group("tuning on the validation split (Section 4 of the paper)")
    tune.add_argument("--tune", action="store_true",
                      help="tune the learning rate and beta of every model on X_val, y_val of DATA, report on the "
                           "test split (instead of --beta/--beta-frac and --lr)")
    tune.add_argument("--lr-grid", type=positive_floats, default=None, metavar="LR1,LR2",
                      help=f"learning rates tried with --tune (default {LR_GRID})")
    tune.add_argument("--beta-grid", type=positive_floats, default=None, metavar="F1,F2",
                      help=f"betas tried with --tune, as fractions of beta_max of --program on the training split "
                           f"(default {BETA_GRID})")
    p.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the weights, JSON and PNG plots")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def bounding_program(model, program):
    """The convex program whose certificate bounds ``model`` (None for the softmax network)."""
    if model == "convex":
        return program
    return {"alternative": 8 if program == 8 else 10, "gated": 12, "linear_mhsa": "mhsa"}.get(model)


def equation(model, program):
    """The equation number of a model, e.g. ``(9)``; ``convex`` is program ``program`` trained by Adam/SGD."""
    return f"({program})" if model == "convex" else EQUATION[model]


def parse_models(text, program, tune=False):
    from ..core.errors import invalid

    if text is None:
        text = DEFAULT_MODELS[program] + (",convex" if tune and program != "mhsa" else "")
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad or not names:
        raise invalid("--models", f"a comma-separated list from {', '.join(MODELS)}", repr(text))
    if program == "mhsa" and {"alternative", "gated", "convex"} & set(names):
        raise invalid("--models", "linear_mhsa or softmax with --program mhsa", repr(text),
                      "networks (9)/(11) and the convex model are those of programs (8)/(10)/(12)")
    if program != "mhsa" and "linear_mhsa" in names:
        raise invalid("--models", "alternative, gated, softmax or convex with --program 8/10/12", repr(text),
                      "network (5) is bounded by --program mhsa")
    return list(dict.fromkeys(names))


def parse_heads(text):
    """None (the defaults) or a list of head counts >= 1."""
    from ..core.errors import invalid

    if text is None:
        return None
    try:
        heads = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        heads = []
    if not heads or min(heads) < 1:
        raise invalid("--heads", "an integer >= 1 or a comma-separated list of them", repr(text))
    return list(dict.fromkeys(heads))


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
    return {"lr": args.lr_grid or positive_floats(LR_GRID), "beta_frac": args.beta_grid or positive_floats(BETA_GRID)}


def prepare(args):
    """Validate everything and build the problems; no solve, no training, no file written.

    Returns a dict: models, heads, problems (program -> problem at the shared beta; with --tune at
    beta = 1, a placeholder: every solve sets its own beta), beta, options, test and val (None or
    (X, T encoded)), data, grid (None, or the --tune grids), teacher (None or (n, n)).
    """
    from ..core.errors import InvalidInputError, invalid
    from ..core.io import load_npz, prepare_out_dir
    from ..nn.trainer import check_training_options
    from .options import make_problem_from

    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise InvalidInputError(f"--out-dir: expected a folder (created if missing), got {args.out_dir!r}, "
                                "an existing file")
    data = load_npz(args.data, "DATA", ("X", "y"))
    grid = _check_mode(args, data)
    models = parse_models(args.models, args.program, tune=grid is not None)
    heads = parse_heads(args.heads)
    if grid is not None and heads is not None and len(heads) > 1:
        raise invalid("--heads", "one head count with --tune", repr(args.heads))
    n_samples = data["X"].shape[0] if data["X"].ndim else None
    options = dict(zip(("optimizer", "lr", "steps", "batch_size", "eval_every"), check_training_options(
        args.optimizer, 1e-2 if args.lr is None else args.lr, args.steps, args.batch_size, args.eval_every,
        None, n_samples)[:5]))
    for split in ("test", "val"):
        if (f"X_{split}" in data) != (f"y_{split}" in data):
            raise InvalidInputError(f"DATA: {args.data!r} has only one of X_{split}, y_{split}; save both or neither")
    U1, U2 = data.get("U1"), data.get("U2")
    main = make_problem_from(args, data["X"], data["y"], U1, U2)
    needed = [args.program] + [bounding_program(m, args.program) for m in models]
    problems = {}
    for p in dict.fromkeys(q for q in needed if q is not None):
        problem = main if p == args.program else make_problem_from(args, data["X"], data["y"], U1, U2, program=p)
        problems[p] = problem.with_beta(main.beta)
    test = None if "X_test" not in data else split_targets(data, main, "X_test", "y_test")
    val = None if "X_val" not in data else split_targets(data, main, "X_val", "y_val")
    teacher = None if "teacher_attention" not in data else _teacher(data["teacher_attention"], main)
    prepare_out_dir(args.out_dir)
    return dict(models=models, heads=heads, problems=problems, beta=main.beta, options=options, test=test,
                val=val, data=data, grid=grid, teacher=teacher)


def split_targets(data, problem, x_key, y_key):
    """``(X, T)`` of another split of DATA (``X_test``/``y_test``, ``X_val``/``y_val``), checked
    against the training split and encoded by the problem's loss."""
    import numpy as np

    from ..core.errors import invalid
    from ..core.validation import check_array

    shape = problem.program.X.shape
    X = check_array(x_key, data[x_key], 3, f"shape (N_{x_key[2:]}, {shape[1]}, {shape[2]}) like X")
    if X.shape[1:] != shape[1:]:
        raise invalid(x_key, "the token shape of X", f"shape {X.shape}")
    y = np.asarray(data[y_key])
    if y.shape[1:] != np.asarray(data["y"]).shape[1:] or y.shape[0] != X.shape[0]:
        raise invalid(y_key, f"{X.shape[0]} targets shaped like y", f"shape {y.shape}")
    if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
        raise invalid(y_key, "finite values", "NaN/Inf entries")
    n_classes = problem.T.shape[1] if problem.loss.name == "cross_entropy" else None
    return X, problem.loss.encode(y, n_classes)


def _teacher(A, problem):
    from ..core.errors import invalid
    from ..core.validation import check_array

    n = problem.program.X.shape[1]
    A = check_array("teacher_attention", A, 2, f"shape ({n}, {n})")
    if A.shape != (n, n):
        raise invalid("teacher_attention", f"shape ({n}, {n}) (output token, input token)", f"shape {A.shape}")
    return A


def convex_summary(result, problem, test, val=None):
    """The certificate of an exact solve, with training loss and regulariser apart, and the
    validation and test losses per sample."""
    cert = result.certificate
    out = {"beta": problem.beta, "primal_objective": cert.primal_objective, "dual_objective": cert.dual_objective,
           "duality_gap": cert.duality_gap, "relative_gap": cert.relative_gap, "certified": cert.certified,
           "residual_relative_gap": cert.residual_relative_gap, "dual_source": cert.dual_source,
           "support_size": cert.support_size, "heads_recovered": cert.heads_recovered,
           "solve_seconds": result.solve_seconds, "refine_seconds": cert.refine_seconds, "status": result.status}
    Yhat = problem.program.forward(result.Z)
    out["loss_sum"] = float(problem.loss.value(Yhat, problem.T))
    out["regularizer"] = float(problem.regularizer.value(result.Z))
    out["train_loss"], out["train_accuracy"] = problem.loss.metrics(Yhat, problem.T)
    for name, split in (("validation", val), ("test", test)):
        out[f"{name}_loss"] = out[f"{name}_accuracy"] = None
        if split is not None:
            out[f"{name}_loss"], out[f"{name}_accuracy"] = problem.loss.metrics(
                problem.program.on(split[0]).forward(result.Z), split[1])
    if val is None:
        del out["validation_loss"], out["validation_accuracy"]
    return out


def default_heads(model, problem, result):
    """Head counts of a model when ``--heads`` is not given."""
    if model == "linear_mhsa":
        r = result.certificate.support_size
        return sorted({max(1, r - 1), max(1, r), max(1, 2 * r)})
    return [problem.program.n_blocks]


def train_model(args, model, problem, beta, lr, heads, options, evaluation, sequence):
    """Build ``model`` (a network, or ``convex``: Z of ``problem``'s program) and train it on the
    training split at ``beta`` and ``lr``; ``evaluation`` is the split whose loss is recorded
    during training ((X, T) or None)."""
    from ..nn.convex import ConvexAttention
    from ..nn.networks import build_network
    from ..nn.trainer import train

    program = problem.program
    N, n, d = program.X.shape
    if model == "convex":
        net = ConvexAttention(program)
    else:
        net = build_network(model, n, d, problem.T.shape[1], heads=heads, U1=getattr(program, "U1", None),
                            U2=getattr(program, "U2", None), sequence=sequence, seed=args.seed)
    return train(net, program.X, problem.T, problem.loss, beta, seed=args.seed, progress=not args.quiet,
                 X_test=None if evaluation is None else evaluation[0],
                 T_test=None if evaluation is None else evaluation[1], **dict(options, lr=lr))


def objective_parts(net, problem, beta):
    """``(sum of losses, regulariser)`` of a trained network on the training split, at ``beta``."""
    import torch

    inputs = net.encode_inputs(problem.program.X)
    with torch.no_grad():
        T = torch.as_tensor(problem.T, dtype=net.dtype, device=net.device)
        return float(problem.loss.value(net(*inputs), T)), float(net.penalty(beta))


def run_compare(args):
    """Solve, train, write the outputs; returns (summary dict, exit code)."""
    import numpy as np

    from ..solving import solve

    ctx = prepare(args)
    if ctx["grid"] is not None:
        from .compare_tune import run_tuned

        return run_tuned(args, ctx)
    problems, test, beta, options = ctx["problems"], ctx["test"], ctx["beta"], ctx["options"]
    main = problems[args.program]
    sequence = np.asarray(ctx["data"]["y"]).ndim == 3
    results, convex = {}, {}
    for program, problem in problems.items():
        results[program] = solve(problem, solver=args.solver, tol=args.tol, refine=True)
        convex[program] = convex_summary(results[program], problem, test)

    report, runs = {}, {}
    for model in ctx["models"]:
        ref = bounding_program(model, args.program)
        problem = problems[ref if ref is not None else args.program]
        counts = [1] if model == "convex" else (ctx["heads"] or default_heads(model, problem, results[problem.program.name]))
        for m in counts:
            name = model if len(counts) == 1 else f"{model}_m{m}"
            run = train_model(args, model, problem, beta, options["lr"], m, options, test, sequence)
            runs[name] = (model, run)
            report[name] = model_report(model, ref, run, problem, beta, convex[ref if ref is not None else args.program],
                                        args.program)
    files, distances = write_outputs(args, problems, results, convex, runs, report, test, sequence, ctx["teacher"])
    summary = summarise(args, main, convex, report, files, ctx, distances, lr=options["lr"])
    return summary, (0 if all(c["certified"] for c in convex.values()) else 1)


def summarise(args, main, convex, report, files, ctx, distances, **extra):
    import math

    from ..core.io import write_json

    top = convex[args.program]
    N, n, d = main.program.X.shape
    options = ctx["options"]
    beta_max = float(main.beta_max())
    summary = {"program": args.program, "loss": args.loss, "beta": top["beta"],
               "beta_max": beta_max if math.isfinite(beta_max) else None,
               "primal_objective": top["primal_objective"], "dual_objective": top["dual_objective"],
               "duality_gap": top["duality_gap"], "relative_gap": top["relative_gap"],
               "certified": top["certified"], "solve_seconds": top["solve_seconds"],
               "convex": {str(p): v for p, v in convex.items()}, "models": report,
               "optimizer": options["optimizer"], "lr": None, "steps": options["steps"],
               "batch_size": options["batch_size"], "seed": args.seed, "N": N, "n": n, "d": d,
               "splits": {"train": N, "validation": None if ctx["val"] is None else len(ctx["val"][0]),
                          "test": None if ctx["test"] is None else len(ctx["test"][0])},
               "sequence_targets": bool(ctx["data"]["y"].ndim == 3), "out_dir": os.path.abspath(args.out_dir),
               "files": files}
    summary.update(extra)
    if distances is not None:
        summary["attention_distance_to_teacher"] = distances
    write_json(os.path.join(args.out_dir, "compare.json"), summary)
    return summary


def model_report(model, ref, run, problem, beta, reference, program):
    """One model's entry of the report. ``reference``: the convex summary of the bounding program
    (or, for (3), of ``--program``) at this model's beta."""
    h = run.history
    loss_sum, regularizer = objective_parts(run.network, problem, beta)
    entry = {"network": equation(model, program), "beta": beta, "lr": run.lr, "objective": run.objective,
             "loss_sum": loss_sum, "regularizer": regularizer, "seconds": run.seconds, "steps": run.steps,
             "status": run.status, "heads": getattr(run.network, "heads", 1)}
    if ref is not None:
        lower = reference["dual_objective"]
        gap = run.objective - lower
        entry.update(bounding_program=ref, certified_lower_bound=lower, certified_gap=gap,
                     relative_certified_gap=gap / max(1.0, abs(run.objective)), bound_applies=True)
    else:
        optimum = reference["primal_objective"]
        entry.update(bounding_program=None, certified_lower_bound=reference["dual_objective"],
                     certified_gap=None, bound_applies=False, compared_with_program=program, convex_optimum=optimum,
                     objective_minus_convex_optimum=run.objective - optimum,
                     note="network (3) is not covered by the bound (docs/conventions.md): the convex optimum is a comparison "
                          "point, and certified_lower_bound is D(V) of that program, not a bound on this network; its "
                          "regulariser (weight decay) is not the group lasso, so compare losses, not objectives")
    entry.update(train_loss=h.train_loss[-1], test_loss=h.test_loss[-1], train_accuracy=h.train_accuracy[-1],
                 test_accuracy=h.test_accuracy[-1])
    return entry


def write_outputs(args, problems, results, convex, runs, report, test, sequence, teacher=None, labels=None):
    """Weights, convex solutions and plots; returns the file names and, with a teacher map, the
    distance of every attention map to it (:func:`.plots.attention_distance`). ``labels``: run name
    -> legend text."""
    import numpy as np

    from ..core.io import save_npz
    from .plots import (attention_distance, convex_attention_map, plot_attention, plot_objective,
                        plot_singular_values, plot_test_loss)

    out = args.out_dir
    labels = labels or {}
    files, distances = [], None
    for program, result in results.items():
        result.save(os.path.join(out, f"convex_p{program}.npz"))
        files.append(f"convex_p{program}.npz")
    for name, (model, run) in runs.items():
        arrays = run.network.arrays()
        if model == "gated":
            arrays.update(U1=run.network.U1, U2=run.network.U2)
        save_npz(os.path.join(out, f"{name}.npz"), objective_history=run.history.objective,
                 seconds_history=run.history.seconds, **arrays)
        files.append(f"{name}.npz")

    main = problems[args.program]
    N = main.program.X.shape[0]
    plot_objective({labels.get(name, name): {
        "seconds": r.history.seconds, "objective": r.history.objective, "model": model,
        "lower_bound": report[name]["certified_lower_bound"] if report[name]["bound_applies"] else None,
        "eval_seconds": r.history.eval_seconds, "loss_sum": N * r.history.train_loss}
        for name, (model, r) in runs.items()},
        {p: dict(c, label=labels.get(f"convex_p{p}", f"convex ({p}) optimum P(Z*), certified")) for p, c in convex.items()},
        os.path.join(out, "objective.png"),
        title=f"Objective against time ({args.loss} loss" + (f", beta = {main.beta:.4g})" if not args.tune else ")"))
    files.append("objective.png")

    if "mhsa" in results:
        Z = results["mhsa"].Z
        nets = {name: r.network.effective_coefficients() for name, (model, r) in runs.items() if model == "linear_mhsa"}
        plot_singular_values(np.linalg.svd(Z, compute_uv=False),
                             {k: np.linalg.svd(v, compute_uv=False) for k, v in nets.items()},
                             main.beta, os.path.join(out, "singular_values.png"))
        files.append("singular_values.png")
    else:
        rows = main.program.n if sequence else 1
        maps = {}
        if teacher is not None:
            maps["teacher: the layer's softmax attention (mean over heads)"] = teacher[:rows]
        for program, result in results.items():
            Z4 = result.Z.reshape(problems[program].program.canonical_shape)
            maps[f"convex ({program}), exact: token group norms"] = convex_attention_map(Z4, rows)
        X = main.program.X
        for name, (model, run) in runs.items():
            eq = equation(model, args.program)
            if model == "softmax":
                maps[f"{name} (3): mean softmax attention"] = run.network.attention_map(X)
            else:
                kind = "Adam" if run.optimizer == "adam" else "SGD"
                title = f"{name} {eq}, {kind}" if model == "convex" else f"{name} {eq}"
                maps[f"{title}: group norms"] = convex_attention_map(run.network.effective_coefficients(), rows)
        plot_attention(maps, os.path.join(out, "attention.png"))
        files.append("attention.png")
        if teacher is not None:
            distances = {k: attention_distance(v, teacher[:rows]) for k, v in maps.items() if not k.startswith("teacher")}
            distances["uniform map (reference)"] = attention_distance(np.ones_like(teacher[:rows]), teacher[:rows])

    if test is not None:
        plot_test_loss({labels.get(name, name): {"eval_seconds": r.history.eval_seconds,
                                                 "test_loss": r.history.test_loss, "model": model}
                        for name, (model, r) in runs.items()},
                       {p: {"test_loss": c["test_loss"], "label": f"convex ({p}), exact"
                            + (f", beta {c['beta_fraction']:g} beta_max" if "beta_fraction" in c else "")}
                        for p, c in convex.items()},
                       os.path.join(out, "test_loss.png"))
        files.append("test_loss.png")
    return files + ["compare.json"], distances


def format_report(s):
    """Human-readable comparison, one network run a line."""
    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)

    beta = "beta tuned per model on the validation split" if s.get("tuning") else f"beta = {s['beta']:.6g}"
    lines = [f"convex program ({s['program']}), {s['loss']} loss, {beta} (beta_max = {fmt(s['beta_max'], '.6g')})"]
    for p, c in s["convex"].items():
        verdict = "CERTIFIED" if c["certified"] else "NOT CERTIFIED"
        lines.append(f"  program ({p}) at beta {c['beta']:.4g}: optimum P(Z*) = {c['primal_objective']:.10g} "
                     f"(loss {c['loss_sum']:.6g} + regulariser {c['regularizer']:.6g}), certified lower bound "
                     f"D(V) = {c['dual_objective']:.10g} (relative gap {c['relative_gap']:.1e}, {verdict}), "
                     f"test loss {fmt(c['test_loss'], '.4g')}, {c['solve_seconds']:.3f} s")
    lines.append(f"networks trained by {s['optimizer']} ({s['steps']} steps):")
    for name, m in s["models"].items():
        obj = "diverged" if m["objective"] is None else f"{m['objective']:.10g}"
        head = (f"  {name:<12s}{m['network']:<5s}m={m['heads']:<5d} lr {m['lr']:<7.2g}beta {m['beta']:<9.4g}"
                f"objective {obj:<16s}(loss {fmt(m['loss_sum'], '.6g')} + reg {fmt(m['regularizer'], '.4g')}), "
                f"test loss {fmt(m['test_loss'], '.4g')}, ")
        if m["bound_applies"]:
            gap = "n/a" if m["certified_gap"] is None else (
                f"{m['certified_gap']:.4g} (relative {m['relative_certified_gap']:.2e})")
            lines.append(f"{head}certified gap {gap} over D(V) of program ({m['bounding_program']}), "
                         f"{m['seconds']:.2f} s")
        else:
            lines.append(f"{head}not covered by the bound; objective - convex optimum "
                         f"({m['compared_with_program']}) = {fmt(m['objective_minus_convex_optimum'], '+.4g')}, "
                         f"{m['seconds']:.2f} s")
    lines.append(f"wrote {', '.join(s['files'])} in {s['out_dir']}")
    return "\n".join(lines)


def run(args):
    from ..core.io import dumps, json_ready

    start = time.perf_counter()
    summary, code = run_compare(args)
    summary["total_seconds"] = time.perf_counter() - start
    summary = json_ready(summary)
    print(dumps(summary) if args.json else format_report(summary))
    return code
