""":func:`cvxtransformer.compare` with ``tune``: the learning rate and beta of every model chosen on the
validation split.

The protocol of Section 4 of the paper ("tune the learning rate and regularization coefficient by
performing a grid search on a validation dataset"), with every model on the same three splits:

1. ``betas = F * beta_max`` of the comparison's program on the training split, for F in
   ``tune["beta_frac"]``;
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
from .models import equation
from .result import convex_summary, head_counts, model_report

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


def run_tuned(plan):
    """Tune, choose, then report on the test split: a :class:`~.result.Comparison`."""
    from .result import Comparison, ModelResult, label

    val, test, grid = plan.validation, plan.test, plan.tune
    main = plan.problem.program.name
    problems = plan.problems()
    beta_max = float(plan.problem.beta_max())
    fracs = grid["beta_frac"]
    betas = [f * beta_max for f in fracs]
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if plan.progress else (lambda text: None)

    # steps 1-2: exact solutions at every beta, scored on the validation split
    exact, exact_rows, exact_choice = {}, {}, {}
    for p, problem in problems.items():
        exact[p], exact_rows[p] = [], []
        for f, b in zip(fracs, betas):
            result = solve(problem.with_beta(b), solver=plan.solver, tol=plan.tol, refine=True,
                           heartbeat_after=plan.heartbeat)
            score = problem.loss.metrics(problem.program.on(val[0]).forward(result.Z), val[1])[0]
            exact[p].append(result)
            exact_rows[p].append(dict(beta=b, beta_fraction=f, validation_loss=score,
                                      **_certificate(result, problem.with_beta(b))))
            say(f"tune convex ({p}) exact, beta {f:g} beta_max: validation loss {score:.6g}, "
                f"relative gap {result.certificate.relative_gap:.1e}")
        exact_choice[p] = choose([r["validation_loss"] for r in exact_rows[p]])

    # steps 3-4: every model at every (lr, beta), scored on the validation split
    rows, choice = {}, {}
    for model in plan.models:
        bound = plan.bounding(model)
        problem = problems[main if bound is None else bound.program.name]
        rows[model] = []
        for lr in grid["lr"]:
            for j, (f, b) in enumerate(zip(fracs, betas)):
                heads = max(head_counts(plan, model, problem, exact[problem.program.name][j]), key=lambda m: m or 0)
                run = plan.train(model, problem.with_beta(b), lr, heads, val)
                score = math.inf if run.status == "diverged" else float(run.history.test_loss[-1])
                rows[model].append(dict(lr=lr, beta=b, beta_fraction=f, heads=heads, validation_loss=score,
                                        objective=run.objective, status=run.status, seconds=run.seconds))
                say(f"tune {model} {equation(model, main)}, lr {lr:g}, beta {f:g} beta_max: "
                    f"validation loss {score:.6g}, objective {run.objective:.6g} ({run.seconds:.1f} s)")
        choice[model] = choose([r["validation_loss"] for r in rows[model]])

    # step 5: the test split, for the chosen configurations only
    runs, tuning_models = {}, {}
    for model in plan.models:
        bound = plan.bounding(model)
        key = main if bound is None else bound.program.name
        row = rows[model][choice[model]]
        j = fracs.index(row["beta_fraction"])
        problem = problems[key].with_beta(row["beta"])
        run = plan.train(model, problem, row["lr"], row["heads"], test)
        report = model_report(model, plan.bound_of(model, run, problem, bound), run, problem, exact_rows[key][j], main)
        report.update(validation_loss=row["validation_loss"], beta_fraction=row["beta_fraction"])
        runs[model] = ModelResult(model, model, label(model, main, row["heads"]), run, report,
                                  detail=f"lr {row['lr']:g}, beta {row['beta_fraction']:g} beta_max")
        tuning_models[model] = {"grid": rows[model], "chosen": {k: row[k] for k in ("lr", "beta", "beta_fraction",
                                                                                      "heads", "validation_loss")},
                                "reproduced": _same(run.objective, row["objective"])}
    solutions, convex, chosen = {}, {}, {}
    for p, problem in problems.items():
        j = exact_choice[p]
        chosen[p] = problem.with_beta(betas[j])
        solutions[p] = exact[p][j]
        convex[p] = convex_summary(solutions[p], chosen[p], test, val)
        convex[p]["beta_fraction"] = fracs[j]
    tuning = {"split": "validation", "criterion": CRITERION, "lr_grid": grid["lr"], "beta_grid": fracs,
              "betas": betas, "beta_max": beta_max, "steps": plan.options["steps"], "models": tuning_models,
              "convex_exact": {p: {"grid": exact_rows[p], "chosen": {
                  k: exact_rows[p][exact_choice[p]][k] for k in ("beta", "beta_fraction", "validation_loss")}}
                  for p in problems}}
    certified = all(r.certified for results in exact.values() for r in results)
    return Comparison(plan, chosen, solutions, convex, runs, tuning=tuning, all_certified=certified)


def _same(a, b):
    return (a == b) or (not math.isfinite(a) and not math.isfinite(b))
