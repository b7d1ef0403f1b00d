"""``cvxtransformer compare``: the certified convex optimum against SGD/Adam-trained networks.

Solves the convex program, trains the chosen nonconvex networks on the same data and beta,
and reports for each network its final objective, the certified lower bound D(V) and its
certified optimality gap ``objective - D(V)``. Which convex program bounds which network
(SPEC.md, Proposition 1):

* alternative attention (6)/(9): program (8) when ``--program 8``, else program (10);
* gated-ReLU network (11): program (12), with the same gates U1, U2;
* softmax attention (3): not covered; it is compared with the optimum of ``--program``, and
  its ``certified_gap`` is null.

Every program that some model needs is solved (``--program`` always). Everything is
validated before any solve or training, so a user error writes nothing.

Outputs in ``--out-dir``: ``<model>.npz`` (trained weights: ``W1`` (m, n), ``W2`` (m, d),
``W3`` (m, c), plus ``gate`` (m,), ``U1``, ``U2`` for the gated network; ``Wq``, ``Wk``,
``Wv``, ``Wo`` for the softmax network; each with ``objective_history`` and
``seconds_history``), ``convex_p<program>.npz`` (the convex solutions, as ``solve --out``),
``compare.json`` (what ``--json`` prints), ``objective.png``, ``attention.png`` and, when
DATA holds ``X_test`` and ``y_test``, ``test_loss.png``.
"""
import json
import math
import os
import tempfile
import time

import numpy as np

from .errors import InvalidInputError, invalid

MODELS = ("alternative", "gated", "softmax")
EQUATION = {"alternative": "(9)", "gated": "(11)", "softmax": "(3)"}
DEFAULT_MODELS = {8: "alternative,softmax", 10: "alternative,softmax", 12: "gated,softmax"}


def configure(p):
    p.add_argument("data", metavar="DATA.npz",
                   help="X (N, n, d) and y as for solve; optionally X_test, y_test, and U1 (h, n), U2 (h, d)")
    p.add_argument("--program", type=int, choices=(8, 10, 12), required=True,
                   help="the convex program solved and reported at the top level")
    p.add_argument("--loss", choices=("squared", "logistic", "cross_entropy"), required=True)
    beta = p.add_mutually_exclusive_group(required=True)
    beta.add_argument("--beta", type=float, help="regularization weight beta > 0 (shared by every model)")
    beta.add_argument("--beta-frac", type=float, metavar="F", help="beta = F * beta_max of --program on DATA")
    p.add_argument("--models", default=None, metavar="M1,M2",
                   help="comma-separated from alternative, gated, softmax "
                        "(default: alternative,softmax; gated,softmax for --program 12)")
    p.add_argument("--optimizer", default="adam", help="adam (default) or sgd")
    p.add_argument("--lr", type=float, default=1e-2, help="learning rate (default 1e-2; "
                   "objectives are sums over samples, so SGD needs about 1/(N L))")
    p.add_argument("--steps", type=int, default=2000, help="training steps (default 2000)")
    p.add_argument("--batch-size", type=int, default=None, help="mini-batch size (default: full batch)")
    p.add_argument("--heads", type=int, default=None, metavar="M",
                   help="heads m of networks (9)/(11) (default: the number of groups of the bounding "
                        "program, n*c for (9) and h*n*c for (11), enough for any convex solution)")
    p.add_argument("--gates", type=int, default=8, metavar="H",
                   help="gates h of program (12) and network (11) when DATA has no U1, U2 (default 8)")
    p.add_argument("--gate-seed", type=int, default=0, help="seed of the sampled gates")
    p.add_argument("--classes", type=int, default=None, help="number of classes (cross-entropy)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialisations and mini-batches")
    p.add_argument("--eval-every", type=int, default=None, help="steps between metric evaluations")
    p.add_argument("--solver", default="clarabel", help="convex solver (default clarabel; see solve --solver)")
    p.add_argument("--tol", type=float, default=1e-6, help="relative duality gap to certify (default 1e-6)")
    p.add_argument("--out-dir", required=True, metavar="DIR", help="folder for the weights, JSON and PNG plots")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def bounding_program(model, program):
    """The convex program whose certificate bounds ``model`` (None for the softmax network)."""
    return {"alternative": 8 if program == 8 else 10, "gated": 12}.get(model)


def parse_models(text, program):
    text = DEFAULT_MODELS[program] if text is None else text
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad or not names:
        raise invalid("--models", f"a comma-separated list from {', '.join(MODELS)}", repr(text))
    return list(dict.fromkeys(names))


def _check_out_dir(path):
    if os.path.exists(path) and not os.path.isdir(path):
        raise invalid("--out-dir", "a folder (created if missing)", f"{path!r}, an existing file")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent if not os.path.isdir(path) else path, os.W_OK):
        raise invalid("--out-dir", "a writable folder", repr(path))


def prepare(args):
    """Validate everything and build the problems; no solve, no training, no file written."""
    from .cli import load_npz
    from .problem import make_problem
    from .train import check_training_options

    from solvers import BACKENDS

    models = parse_models(args.models, args.program)
    if args.solver not in BACKENDS:
        raise invalid("--solver", f"one of {sorted(BACKENDS)}", repr(args.solver))
    if args.heads is not None and args.heads < 1:
        raise invalid("--heads", "an integer >= 1 (heads of the networks)", args.heads)
    if args.gates < 1:
        raise invalid("--gates", "an integer >= 1 (gates of program (12))", args.gates)
    if not (args.tol > 0 and math.isfinite(args.tol)):
        raise invalid("--tol", "a number > 0", args.tol)
    if args.beta_frac is not None and not (args.beta_frac > 0 and math.isfinite(args.beta_frac)):
        raise invalid("--beta-frac", "a number > 0", args.beta_frac)
    _check_out_dir(args.out_dir)
    data = load_npz(args.data, "DATA", ("X", "y"))
    X = np.asarray(data["X"])
    options = dict(zip(("optimizer", "lr", "steps", "batch_size", "eval_every"), check_training_options(
        args.optimizer, args.lr, args.steps, args.batch_size, args.eval_every, None,
        X.shape[0] if X.ndim else None)[:5]))
    if ("X_test" in data) != ("y_test" in data):
        raise InvalidInputError(f"DATA: {args.data!r} has only one of X_test, y_test; save both or neither")
    gates = (data.get("U1"), data.get("U2"))

    def build(program, beta):
        U1, U2 = gates if program == 12 else (None, None)
        return make_problem(data["X"], data["y"], program=program, loss=args.loss, beta=beta, U1=U1, U2=U2,
                            heads=args.gates, gate_seed=args.gate_seed, n_classes=args.classes)

    main = build(args.program, args.beta if args.beta is not None else 1.0)
    beta = main.beta if args.beta_frac is None else args.beta_frac * main.beta_max()
    needed = [args.program] + [bounding_program(m, args.program) for m in models]
    problems = {p: (main.with_beta(beta) if p == args.program else build(p, beta))
                for p in dict.fromkeys(q for q in needed if q is not None)}
    test = None
    if "X_test" in data:
        test = _test_targets(data, main)
    return models, problems, beta, options, test, data


def _test_targets(data, problem):
    X_test = np.asarray(data["X_test"], dtype=float)
    if X_test.ndim != 3 or X_test.shape[1:] != problem.program.X.shape[1:] or X_test.shape[0] == 0:
        raise invalid("X_test", f"shape (N_test, {problem.program.n}, {problem.program.d}) like X",
                      f"shape {X_test.shape}")
    y_test = np.asarray(data["y_test"])
    if y_test.shape[1:] != np.asarray(data["y"]).shape[1:] or y_test.shape[0] != X_test.shape[0]:
        raise invalid("y_test", f"{X_test.shape[0]} targets shaped like y", f"shape {y_test.shape}")
    if not np.all(np.isfinite(X_test)) or (y_test.dtype.kind == "f" and not np.all(np.isfinite(y_test))):
        raise invalid("X_test, y_test", "finite values", "NaN/Inf entries")
    n_classes = problem.T.shape[1] if problem.loss.name == "cross_entropy" else None
    return X_test, problem.loss.encode(y_test, n_classes)


def _finite(x):
    return float(x) if x is not None and math.isfinite(x) else None


def _convex_summary(result, problem, test):
    from .programs import Program, gate_mask
    from .train import metrics

    cert = result.certificate
    Z4 = problem.program.to_canonical(result.Z)
    out = {"primal_objective": cert.primal_objective, "dual_objective": cert.dual_objective,
           "duality_gap": cert.duality_gap, "relative_gap": cert.relative_gap, "certified": cert.certified,
           "heads_recovered": cert.heads_recovered, "solve_seconds": result.solve_seconds,
           "status": result.status}
    out["train_loss"], out["train_accuracy"] = metrics(problem.loss, problem.program.forward(Z4), problem.T)
    out["test_loss"] = out["test_accuracy"] = None
    if test is not None:
        mask = None if problem.U1 is None else gate_mask(test[0], problem.U1, problem.U2)
        program = Program(problem.program.number, test[0], problem.program.c, mask)
        out["test_loss"], out["test_accuracy"] = metrics(problem.loss, program.forward(Z4), test[1])
    return {k: (_finite(v) if isinstance(v, float) else v) for k, v in out.items()}


def run_compare(args):
    """Solve, train, write the outputs; returns (summary dict, exit code)."""
    from .networks import build_network
    from .result import save_npz_atomic
    from .solve import solve
    from .train import train

    models, problems, beta, options, test, data = prepare(args)
    main = problems[args.program]
    sequence = np.asarray(data["y"]).ndim == 3
    os.makedirs(args.out_dir, exist_ok=True)

    results, convex = {}, {}
    for program, problem in problems.items():
        results[program] = solve(problem, solver=args.solver, tol=args.tol)
        convex[program] = _convex_summary(results[program], problem, test)

    X = main.program.X
    N, n, d = X.shape
    report, runs = {}, {}
    for model in models:
        ref = bounding_program(model, args.program)
        problem = problems[ref if ref is not None else args.program]
        heads = args.heads if args.heads is not None else problem.program.n_groups
        net = build_network(model, n, d, problem.T.shape[1], heads=heads, U1=problem.U1, U2=problem.U2,
                            sequence=sequence, seed=args.seed)
        run = train(net, X, problem.T, problem.loss, beta, seed=args.seed, progress=not args.quiet,
                    X_test=None if test is None else test[0], T_test=None if test is None else test[1],
                    **options)
        runs[model] = run
        h = run.history
        lower = convex[problem.program.number]["dual_objective"]
        entry = {"network": EQUATION[model], "objective": _finite(run.objective), "seconds": run.seconds,
                 "steps": run.steps, "status": run.status}
        if ref is not None:
            gap = run.objective - lower
            entry.update(bounding_program=ref, certified_lower_bound=lower, certified_gap=_finite(gap),
                         relative_certified_gap=_finite(gap / max(1.0, abs(run.objective))), heads=net.heads,
                         bound_applies=True)
        else:
            optimum = convex[args.program]["primal_objective"]
            entry.update(bounding_program=None, certified_lower_bound=lower, certified_gap=None,
                         bound_applies=False, compared_with_program=args.program, convex_optimum=optimum,
                         objective_minus_convex_optimum=_finite(run.objective - optimum),
                         note="network (3) is not covered by the bound (SPEC.md): the convex optimum is a "
                              "comparison point, and certified_lower_bound is D(V) of that program, not a "
                              "bound on this network")
        entry.update(train_loss=_finite(h.train_loss[-1]), test_loss=_finite(h.test_loss[-1]),
                     train_accuracy=_finite(h.train_accuracy[-1]), test_accuracy=_finite(h.test_accuracy[-1]))
        report[model] = entry

    files = _write_outputs(args, models, problems, results, convex, runs, report, test, sequence, save_npz_atomic)
    top = convex[args.program]
    summary = {"program": args.program, "loss": args.loss, "beta": beta, "beta_max": main.beta_max(),
               "primal_objective": top["primal_objective"], "dual_objective": top["dual_objective"],
               "duality_gap": top["duality_gap"], "relative_gap": top["relative_gap"],
               "certified": top["certified"], "solve_seconds": top["solve_seconds"],
               "convex": {str(p): v for p, v in convex.items()}, "models": report,
               "optimizer": options["optimizer"], "lr": options["lr"], "steps": options["steps"],
               "batch_size": options["batch_size"], "seed": args.seed, "N": N, "n": n, "d": d,
               "sequence_targets": sequence, "out_dir": os.path.abspath(args.out_dir), "files": files}
    _write_json_atomic(os.path.join(args.out_dir, "compare.json"), summary)
    return summary, (0 if all(c["certified"] for c in convex.values()) else 1)


def _write_outputs(args, models, problems, results, convex, runs, report, test, sequence, save_npz_atomic):
    from .plots import convex_attention_map, plot_attention, plot_objective, plot_test_loss

    out = args.out_dir
    files = []
    for program, result in results.items():
        result.save(os.path.join(out, f"convex_p{program}.npz"))
        files.append(f"convex_p{program}.npz")
    for model, run in runs.items():
        arrays = run.network.arrays()
        if model == "gated":
            arrays.update(U1=run.network.U1, U2=run.network.U2)
        save_npz_atomic(os.path.join(out, f"{model}.npz"), objective_history=run.history.objective,
                        seconds_history=run.history.seconds, **arrays)
        files.append(f"{model}.npz")

    n = problems[args.program].program.n
    rows = n if sequence else 1
    plot_objective({m: {"seconds": r.history.seconds, "objective": r.history.objective,
                        "lower_bound": report[m]["certified_lower_bound"] if report[m]["bound_applies"] else None}
                    for m, r in runs.items()}, convex, os.path.join(out, "objective.png"),
                   title=f"Objective against time ({args.loss} loss, beta = {problems[args.program].beta:.4g})")
    files.append("objective.png")

    maps = {}
    for program, result in results.items():
        Z4 = problems[program].program.to_canonical(result.Z)
        maps[f"Convex ({program}): token group norms"] = convex_attention_map(Z4, rows)
    X = problems[args.program].program.X
    for model, run in runs.items():
        if model == "softmax":
            maps["Nonconvex-Standard (3): mean softmax"] = run.network.attention_map(X)
        else:
            maps[f"Nonconvex {EQUATION[model]}: group norms"] = convex_attention_map(
                run.network.effective_coefficients(), rows)
    plot_attention(maps, os.path.join(out, "attention.png"))
    files.append("attention.png")

    if test is not None:
        plot_test_loss({m: {"eval_seconds": r.history.eval_seconds, "test_loss": r.history.test_loss}
                        for m, r in runs.items()},
                       {p: {"test_loss": c["test_loss"]} for p, c in convex.items()},
                       os.path.join(out, "test_loss.png"))
        files.append("test_loss.png")
    return files + ["compare.json"]


def _write_json_atomic(path, obj):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".json.tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, default=_json_default)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(type(obj).__name__)


def format_report(s):
    """Human-readable comparison, one model a line."""
    lines = [f"convex program ({s['program']}), {s['loss']} loss, beta = {s['beta']:.6g} "
             f"(beta_max = {s['beta_max']:.6g})"]
    for p, c in s["convex"].items():
        verdict = "CERTIFIED" if c["certified"] else "NOT CERTIFIED"
        lines.append(f"  program ({p}): optimum P(Z*) = {c['primal_objective']:.10g}, certified lower bound "
                     f"D(V) = {c['dual_objective']:.10g} (relative gap {c['relative_gap']:.1e}, {verdict}), "
                     f"{c['solve_seconds']:.3f} s")
    lines.append(f"networks trained by {s['optimizer']} (lr {s['lr']:g}, {s['steps']} steps):")
    for model, m in s["models"].items():
        obj = "diverged" if m["objective"] is None else f"{m['objective']:.10g}"
        head = f"  {model:<12s}{m['network']:<6s}objective {obj:<18s}"
        if m["bound_applies"]:
            gap = "n/a" if m["certified_gap"] is None else (
                f"{m['certified_gap']:.4g} (relative {m['relative_certified_gap']:.2e})")
            lines.append(f"{head}certified gap {gap} over D(V) of program ({m['bounding_program']}), "
                         f"{m['seconds']:.2f} s")
        else:
            diff = m["objective_minus_convex_optimum"]
            diff = "n/a" if diff is None else f"{diff:+.4g}"
            lines.append(f"{head}not covered by the bound; objective - convex optimum "
                         f"({m['compared_with_program']}) = {diff}, {m['seconds']:.2f} s")
    lines.append(f"wrote {', '.join(s['files'])} in {s['out_dir']}")
    return "\n".join(lines)


def run(args):
    from .cli import print_json

    start = time.perf_counter()
    summary, code = run_compare(args)
    summary["total_seconds"] = time.perf_counter() - start
    print_json(summary) if args.json else print(format_report(summary))
    return code
