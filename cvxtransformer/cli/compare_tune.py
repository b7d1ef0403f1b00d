"""``compare --tune``: the learning rate and beta of every model chosen on the validation split.

The protocol of Section 4 of the paper ("tune the learning rate and regularization coefficient by
performing a grid search on a validation dataset"), with every model on the same three splits:

1. ``betas = F * beta_max`` of ``--program`` on the training split, for F in ``--beta-grid``;
2. every convex program that a model needs is solved exactly at every beta (``refine=True``,
   certified), and scored by the validation loss of its solution;
3. every model is trained on the training split at every (learning rate, beta) of the grid, from
   the same seed, and scored by the mean validation loss per sample of its final iterate (a
   diverged run scores +inf);
4. :func:`choose` picks, per model and per exact program, the smallest score (the first in grid
   order on ties) from the validation scores alone;
5. only then is the test split used: each chosen configuration is trained again (same seed and
   options, hence the same run; ``reproduced`` checks it) with the test loss recorded along the
   way, and the chosen exact solutions are evaluated on it.

No function sees the test split before step 5. The bound of a network (9)/(11)/convex at its
chosen beta is D(V) of its program's exact solve at that beta (step 2).
"""
import math
import sys

import numpy as np

from ..solving import solve
from .compare import (bounding_program, convex_summary, default_heads, equation, model_report, summarise, train_model,
                      write_outputs)

CRITERION = "mean validation loss per sample of the final iterate (diverged: +inf); ties: first in grid order"


def choose(scores):
    """Index of the smallest score (NaN and +inf count as +inf; first on ties), from scores alone.

    >>> choose([0.3, 0.1, float("nan"), 0.1])
    1
    """
    scores = np.asarray(scores, dtype=float)
    return int(np.argmin(np.where(np.isfinite(scores), scores, np.inf)))


def _certificate(result, problem):
    """An exact solve's certificate, with its training loss and regulariser apart (training split only)."""
    c = result.certificate
    return {"primal_objective": c.primal_objective, "dual_objective": c.dual_objective,
            "loss_sum": float(problem.loss.value(problem.program.forward(result.Z), problem.T)),
            "regularizer": float(problem.regularizer.value(result.Z)), "relative_gap": c.relative_gap,
            "certified": c.certified, "solve_seconds": result.solve_seconds}


def run_tuned(args, ctx):
    """Tune, choose, then report on the test split; returns (summary dict, exit code)."""
    problems, val, test, grid, options = ctx["problems"], ctx["val"], ctx["test"], ctx["grid"], ctx["options"]
    main = problems[args.program]
    sequence = np.asarray(ctx["data"]["y"]).ndim == 3
    beta_max = float(main.beta_max())
    fracs = grid["beta_frac"]
    betas = [f * beta_max for f in fracs]
    say = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))

    # steps 1-2: exact solutions at every beta, scored on the validation split
    exact, exact_rows, exact_choice = {}, {}, {}
    for p, problem in problems.items():
        exact[p], exact_rows[p] = [], []
        for f, b in zip(fracs, betas):
            result = solve(problem.with_beta(b), solver=args.solver, tol=args.tol, refine=True)
            score = problem.loss.metrics(problem.program.on(val[0]).forward(result.Z), val[1])[0]
            exact[p].append(result)
            exact_rows[p].append(dict(beta=b, beta_fraction=f, validation_loss=score,
                                      **_certificate(result, problem.with_beta(b))))
            say(f"tune convex ({p}) exact, beta {f:g} beta_max: validation loss {score:.6g}, "
                f"relative gap {result.certificate.relative_gap:.1e}")
        exact_choice[p] = choose([r["validation_loss"] for r in exact_rows[p]])

    # steps 3-4: every model at every (lr, beta), scored on the validation split
    rows, choice = {}, {}
    for model in ctx["models"]:
        ref = bounding_program(model, args.program)
        problem = problems[ref if ref is not None else args.program]
        rows[model] = []
        for lr in grid["lr"]:
            for j, (f, b) in enumerate(zip(fracs, betas)):
                heads = ctx["heads"][0] if ctx["heads"] else max(default_heads(model, problem, exact[problem.program.name][j]))
                run = train_model(args, model, problem.with_beta(b), b, lr, heads, options, val, sequence)
                score = math.inf if run.status == "diverged" else float(run.history.test_loss[-1])
                rows[model].append(dict(lr=lr, beta=b, beta_fraction=f, heads=heads, validation_loss=score,
                                        objective=run.objective, status=run.status, seconds=run.seconds))
                say(f"tune {model} {equation(model, args.program)}, lr {lr:g}, beta {f:g} beta_max: "
                    f"validation loss {score:.6g}, objective {run.objective:.6g} ({run.seconds:.1f} s)")
        choice[model] = choose([r["validation_loss"] for r in rows[model]])

    # step 5: the test split, for the chosen configurations only
    runs, report, labels, tuning_models = {}, {}, {}, {}
    for model in ctx["models"]:
        ref = bounding_program(model, args.program)
        key = ref if ref is not None else args.program
        row = rows[model][choice[model]]
        j = fracs.index(row["beta_fraction"])
        problem = problems[key].with_beta(row["beta"])
        run = train_model(args, model, problem, row["beta"], row["lr"], row["heads"], options, test, sequence)
        runs[model] = (model, run)
        report[model] = model_report(model, ref, run, problem, row["beta"], exact_rows[key][j], args.program)
        report[model].update(validation_loss=row["validation_loss"], beta_fraction=row["beta_fraction"])
        labels[model] = f"{model} {equation(model, args.program)}: lr {row['lr']:g}, beta {row['beta_fraction']:g} beta_max"
        tuning_models[model] = {"grid": rows[model], "chosen": {k: row[k] for k in ("lr", "beta", "beta_fraction",
                                                                                      "heads", "validation_loss")},
                                "reproduced": _same(run.objective, row["objective"])}
    results, convex = {}, {}
    for p, problem in problems.items():
        j = exact_choice[p]
        results[p] = exact[p][j]
        convex[p] = convex_summary(results[p], problem.with_beta(betas[j]), test, val)
        convex[p]["beta_fraction"] = fracs[j]
        labels[f"convex_p{p}"] = f"convex ({p}) exact, beta {fracs[j]:g} beta_max: P(Z*), certified"
    chosen = {p: problems[p].with_beta(betas[exact_choice[p]]) for p in problems}
    files, distances = write_outputs(args, chosen, results, convex, runs, report, test, sequence, ctx["teacher"],
                                     labels)
    _plot(args, rows, exact_rows, grid, choice, exact_choice)
    files.insert(-1, "tuning.png")
    tuning = {"split": "validation", "criterion": CRITERION, "lr_grid": grid["lr"], "beta_grid": fracs,
              "betas": betas, "beta_max": beta_max, "steps": options["steps"], "models": tuning_models,
              "convex_exact": {str(p): {"grid": exact_rows[p], "chosen": {
                  k: exact_rows[p][exact_choice[p]][k] for k in ("beta", "beta_fraction", "validation_loss")}}
                  for p in problems}}
    summary = summarise(args, chosen[args.program], convex, report, files, ctx, distances, tuning=tuning,
                        lr_grid=grid["lr"])
    certified = all(r.certified for results_p in exact.values() for r in results_p)
    return summary, (0 if certified else 1)


def _same(a, b):
    return (a == b) or (not math.isfinite(a) and not math.isfinite(b))


def _plot(args, rows, exact_rows, grid, choice, exact_choice):
    import os

    from .plots import plot_tuning

    L, B = len(grid["lr"]), len(grid["beta_frac"])
    grids = {f"{m} {equation(m, args.program)}": {
        "lr": grid["lr"], "beta_frac": grid["beta_frac"], "chosen": divmod(choice[m], B),
        "loss": np.array([r["validation_loss"] for r in rows[m]], dtype=float).reshape(L, B)} for m in rows}
    convex = {p: {"beta_frac": np.array(grid["beta_frac"]), "chosen": exact_choice[p],
                  "loss": np.array([r["validation_loss"] for r in exact_rows[p]])} for p in exact_rows}
    plot_tuning(grids, convex, os.path.join(args.out_dir, "tuning.png"))
