"""``cvxtransformer compare``: the certified convex optimum against SGD/Adam-trained networks.

Solves the convex program, trains the chosen nonconvex networks on the same data and beta,
and reports for each network its final objective, the certified lower bound D(V) and its
certified optimality gap ``objective - D(V)``. Which convex program bounds which network
(docs/conventions.md, Proposition 1 and Sahiner et al.):

* alternative attention (6)/(9): program (8) when ``--program 8``, else program (10);
* gated-ReLU network (11): program (12), with the same gates U1, U2;
* linear multi-head self-attention (5): program (6) (``mhsa``);
* softmax attention (3): not covered; it is compared with the optimum of ``--program``, and
  its ``certified_gap`` is null.

Every program that some model needs is solved (``--program`` always), with the verifier's refined
dual point, so a network's gap is not inflated by a loose bound. ``--heads`` takes one head count
or several (``1,2,4``); for ``linear_mhsa`` the default is below, at and above rank(Z*). Everything
is validated before any solve or training, so a user error writes nothing.

Outputs in ``--out-dir``: ``<run>.npz`` (trained weights, with ``objective_history`` and
``seconds_history``; ``<run>`` is the model, or ``<model>_m<heads>`` with several head counts),
``convex_p<program>.npz`` (the convex solutions, as ``solve --out``), ``compare.json`` (what
``--json`` prints), ``objective.png``, ``attention.png`` (group-lasso programs),
``singular_values.png`` (``mhsa``) and, when DATA holds ``X_test`` and ``y_test``, ``test_loss.png``.
"""
import os
import time

from .options import LOSS_HELP, positive_float, positive_int, program, tolerance

MODELS = ("alternative", "gated", "softmax", "linear_mhsa")
EQUATION = {"alternative": "(9)", "gated": "(11)", "softmax": "(3)", "linear_mhsa": "(5)"}
DEFAULT_MODELS = {8: "alternative,softmax", 10: "alternative,softmax", 12: "gated,softmax", "mhsa": "linear_mhsa"}


def configure(p):
    p.add_argument("data", metavar="DATA.npz",
                   help="X (N, n, d) and y as for solve; optionally X_test, y_test, and U1 (h, n), U2 (h, d)")
    p.add_argument("--program", type=program, required=True, metavar="{8,10,12,mhsa}",
                   help="the convex program solved and reported at the top level")
    p.add_argument("--loss", choices=("squared", "logistic", "cross_entropy"), required=True, help=LOSS_HELP)
    beta = p.add_mutually_exclusive_group(required=True)
    beta.add_argument("--beta", type=positive_float, help="regularization weight beta > 0 (shared by every model)")
    beta.add_argument("--beta-frac", type=positive_float, metavar="F", help="beta = F * beta_max of --program on DATA")
    p.add_argument("--models", default=None, metavar="M1,M2",
                   help="comma-separated from alternative, gated, softmax, linear_mhsa (default: alternative,softmax; "
                        "gated,softmax for --program 12; linear_mhsa for --program mhsa)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="the networks' optimiser")
    p.add_argument("--lr", type=positive_float, default=1e-2,
                   help="learning rate (objectives are sums over samples, so SGD needs about 1/(N L))")
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
    p.add_argument("--solver", choices=("clarabel", "scs", "fista"), default="clarabel", help="convex solver")
    p.add_argument("--tol", type=tolerance, default=1e-6, help="relative duality gap to certify, in (0, 1)")
    p.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the weights, JSON and PNG plots")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def bounding_program(model, program):
    """The convex program whose certificate bounds ``model`` (None for the softmax network)."""
    return {"alternative": 8 if program == 8 else 10, "gated": 12, "linear_mhsa": "mhsa"}.get(model)


def parse_models(text, program):
    from ..core.errors import invalid

    text = DEFAULT_MODELS[program] if text is None else text
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad or not names:
        raise invalid("--models", f"a comma-separated list from {', '.join(MODELS)}", repr(text))
    if program == "mhsa" and {"alternative", "gated"} & set(names):
        raise invalid("--models", "linear_mhsa or softmax with --program mhsa", repr(text),
                      "networks (9)/(11) are bounded by programs (10)/(12)")
    if program != "mhsa" and "linear_mhsa" in names:
        raise invalid("--models", "alternative, gated or softmax with --program 8/10/12", repr(text),
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


def prepare(args):
    """Validate everything and build the problems; no solve, no training, no file written."""
    from ..core.errors import InvalidInputError
    from ..core.io import load_npz, prepare_out_dir
    from ..nn.trainer import check_training_options
    from .options import make_problem_from

    models = parse_models(args.models, args.program)
    heads = parse_heads(args.heads)
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise InvalidInputError(f"--out-dir: expected a folder (created if missing), got {args.out_dir!r}, "
                                "an existing file")
    data = load_npz(args.data, "DATA", ("X", "y"))
    n_samples = data["X"].shape[0] if data["X"].ndim else None
    options = dict(zip(("optimizer", "lr", "steps", "batch_size", "eval_every"), check_training_options(
        args.optimizer, args.lr, args.steps, args.batch_size, args.eval_every, None, n_samples)[:5]))
    if ("X_test" in data) != ("y_test" in data):
        raise InvalidInputError(f"DATA: {args.data!r} has only one of X_test, y_test; save both or neither")
    U1, U2 = data.get("U1"), data.get("U2")
    main = make_problem_from(args, data["X"], data["y"], U1, U2)
    needed = [args.program] + [bounding_program(m, args.program) for m in models]
    problems = {}
    for p in dict.fromkeys(q for q in needed if q is not None):
        problem = main if p == args.program else make_problem_from(args, data["X"], data["y"], U1, U2, program=p)
        problems[p] = problem.with_beta(main.beta)
    test = None if "X_test" not in data else _test_targets(data, main)
    prepare_out_dir(args.out_dir)
    return models, heads, problems, main.beta, options, test, data


def _test_targets(data, problem):
    import numpy as np

    from ..core.errors import invalid
    from ..core.validation import check_array

    X_test = check_array("X_test", data["X_test"], 3, f"shape (N_test, {problem.program.X.shape[1]}, "
                                                     f"{problem.program.X.shape[2]}) like X")
    if X_test.shape[1:] != problem.program.X.shape[1:]:
        raise invalid("X_test", "the token shape of X", f"shape {X_test.shape}")
    y_test = np.asarray(data["y_test"])
    if y_test.shape[1:] != np.asarray(data["y"]).shape[1:] or y_test.shape[0] != X_test.shape[0]:
        raise invalid("y_test", f"{X_test.shape[0]} targets shaped like y", f"shape {y_test.shape}")
    if y_test.dtype.kind == "f" and not np.all(np.isfinite(y_test)):
        raise invalid("y_test", "finite values", "NaN/Inf entries")
    n_classes = problem.T.shape[1] if problem.loss.name == "cross_entropy" else None
    return X_test, problem.loss.encode(y_test, n_classes)


def _convex_summary(result, problem, test):
    cert = result.certificate
    out = {"primal_objective": cert.primal_objective, "dual_objective": cert.dual_objective,
           "duality_gap": cert.duality_gap, "relative_gap": cert.relative_gap, "certified": cert.certified,
           "residual_relative_gap": cert.residual_relative_gap, "dual_source": cert.dual_source,
           "support_size": cert.support_size, "heads_recovered": cert.heads_recovered,
           "solve_seconds": result.solve_seconds, "refine_seconds": cert.refine_seconds, "status": result.status}
    out["train_loss"], out["train_accuracy"] = problem.loss.metrics(problem.program.forward(result.Z), problem.T)
    out["test_loss"] = out["test_accuracy"] = None
    if test is not None:
        out["test_loss"], out["test_accuracy"] = problem.loss.metrics(
            problem.program.on(test[0]).forward(result.Z), test[1])
    return out


def default_heads(model, problem, result):
    """Head counts of a model when ``--heads`` is not given."""
    if model == "linear_mhsa":
        r = result.certificate.support_size
        return sorted({max(1, r - 1), max(1, r), max(1, 2 * r)})
    return [problem.program.n_blocks]


def run_compare(args):
    """Solve, train, write the outputs; returns (summary dict, exit code)."""
    import math

    import numpy as np

    from ..nn.networks import build_network
    from ..nn.trainer import train
    from ..solving import solve

    models, heads_arg, problems, beta, options, test, data = prepare(args)
    main = problems[args.program]
    sequence = np.asarray(data["y"]).ndim == 3
    results, convex = {}, {}
    for program, problem in problems.items():
        results[program] = solve(problem, solver=args.solver, tol=args.tol, refine=True)
        convex[program] = _convex_summary(results[program], problem, test)

    X = main.program.X
    N, n, d = X.shape
    report, runs = {}, {}
    for model in models:
        ref = bounding_program(model, args.program)
        problem = problems[ref if ref is not None else args.program]
        counts = heads_arg or default_heads(model, problem, results[problem.program.name])
        for m in counts:
            name = model if len(counts) == 1 else f"{model}_m{m}"
            program = problem.program
            net = build_network(model, n, d, problem.T.shape[1], heads=m, U1=getattr(program, "U1", None),
                                U2=getattr(program, "U2", None), sequence=sequence, seed=args.seed)
            run = train(net, X, problem.T, problem.loss, beta, seed=args.seed, progress=not args.quiet,
                        X_test=None if test is None else test[0], T_test=None if test is None else test[1],
                        **options)
            runs[name] = (model, run)
            report[name] = _model_report(model, ref, run, net, convex, args.program)
    files = _write_outputs(args, problems, results, convex, runs, report, test, sequence)
    top = convex[args.program]
    finite = lambda v: v if v is None or math.isfinite(v) else None
    summary = {"program": args.program, "loss": args.loss, "beta": beta, "beta_max": main.beta_max(),
               "primal_objective": top["primal_objective"], "dual_objective": top["dual_objective"],
               "duality_gap": top["duality_gap"], "relative_gap": top["relative_gap"],
               "certified": top["certified"], "solve_seconds": top["solve_seconds"],
               "convex": {str(p): v for p, v in convex.items()}, "models": report,
               "optimizer": options["optimizer"], "lr": options["lr"], "steps": options["steps"],
               "batch_size": options["batch_size"], "seed": args.seed, "N": N, "n": n, "d": d,
               "sequence_targets": sequence, "out_dir": os.path.abspath(args.out_dir), "files": files}
    summary["beta_max"] = finite(float(summary["beta_max"]))
    from ..core.io import write_json

    write_json(os.path.join(args.out_dir, "compare.json"), summary)
    return summary, (0 if all(c["certified"] for c in convex.values()) else 1)


def _model_report(model, ref, run, net, convex, program):
    h = run.history
    entry = {"network": EQUATION[model], "objective": run.objective, "seconds": run.seconds, "steps": run.steps,
             "status": run.status, "heads": getattr(net, "heads", 1)}
    if ref is not None:
        lower = convex[ref]["dual_objective"]
        gap = run.objective - lower
        entry.update(bounding_program=ref, certified_lower_bound=lower, certified_gap=gap,
                     relative_certified_gap=gap / max(1.0, abs(run.objective)), bound_applies=True)
    else:
        optimum = convex[program]["primal_objective"]
        entry.update(bounding_program=None, certified_lower_bound=convex[program]["dual_objective"],
                     certified_gap=None, bound_applies=False, compared_with_program=program, convex_optimum=optimum,
                     objective_minus_convex_optimum=run.objective - optimum,
                     note="network (3) is not covered by the bound (docs/conventions.md): the convex optimum is a comparison "
                          "point, and certified_lower_bound is D(V) of that program, not a bound on this network")
    entry.update(train_loss=h.train_loss[-1], test_loss=h.test_loss[-1], train_accuracy=h.train_accuracy[-1],
                 test_accuracy=h.test_accuracy[-1])
    return entry


def _write_outputs(args, problems, results, convex, runs, report, test, sequence):
    import numpy as np

    from ..core.io import save_npz
    from .plots import convex_attention_map, plot_attention, plot_objective, plot_singular_values, plot_test_loss

    out = args.out_dir
    files = []
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
    plot_objective({name: {"seconds": r.history.seconds, "objective": r.history.objective, "model": model,
                           "lower_bound": report[name]["certified_lower_bound"] if report[name]["bound_applies"]
                           else None} for name, (model, r) in runs.items()},
                   convex, os.path.join(out, "objective.png"),
                   title=f"Objective against time ({args.loss} loss, beta = {main.beta:.4g})")
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
        for program, result in results.items():
            Z4 = result.Z.reshape(problems[program].program.canonical_shape)
            maps[f"convex ({program}): token group norms"] = convex_attention_map(Z4, rows)
        X = main.program.X
        for name, (model, run) in runs.items():
            if model == "softmax":
                maps[f"{name} (3): mean softmax attention"] = run.network.attention_map(X)
            else:
                maps[f"{name} {EQUATION[model]}: group norms"] = convex_attention_map(
                    run.network.effective_coefficients(), rows)
        plot_attention(maps, os.path.join(out, "attention.png"))
        files.append("attention.png")

    if test is not None:
        plot_test_loss({name: {"eval_seconds": r.history.eval_seconds, "test_loss": r.history.test_loss,
                               "model": model} for name, (model, r) in runs.items()},
                       {p: {"test_loss": c["test_loss"]} for p, c in convex.items()},
                       os.path.join(out, "test_loss.png"))
        files.append("test_loss.png")
    return files + ["compare.json"]


def format_report(s):
    """Human-readable comparison, one network run a line."""
    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)

    lines = [f"convex program ({s['program']}), {s['loss']} loss, beta = {s['beta']:.6g} "
             f"(beta_max = {fmt(s['beta_max'], '.6g')})"]
    for p, c in s["convex"].items():
        verdict = "CERTIFIED" if c["certified"] else "NOT CERTIFIED"
        lines.append(f"  program ({p}): optimum P(Z*) = {c['primal_objective']:.10g}, certified lower bound "
                     f"D(V) = {c['dual_objective']:.10g} (relative gap {c['relative_gap']:.1e}, {verdict}), "
                     f"{c['solve_seconds']:.3f} s")
    lines.append(f"networks trained by {s['optimizer']} (lr {s['lr']:g}, {s['steps']} steps):")
    for name, m in s["models"].items():
        obj = "diverged" if m["objective"] is None else f"{m['objective']:.10g}"
        head = f"  {name:<16s}{m['network']:<5s}m={m['heads']:<4d} objective {obj:<18s}"
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
