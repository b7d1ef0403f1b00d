"""The ``cvxtransformer`` command line.

Exit codes: 0 success (and, for solve/verify/demo, certified); 1 the run finished but the
certificate did not reach ``--tol``; 2 a user error (one line on stderr, no traceback,
no output file).
"""
import argparse
import json
import sys
from importlib import import_module

import numpy as np

from .errors import CvxTransformerError, InvalidInputError

# Subcommands living in their own modules (which import torch): name -> (module exposing
# configure(parser) and run(args), help). A module is imported only when its subcommand runs.
EXTERNAL = {
    "compare": ("cvxtransformer.compare",
                "solve the convex program, train nonconvex networks by SGD/Adam, report their certified gaps"),
    "grok": ("cvxtransformer.experiments.grok",
             "one grokking run: convex (stacked program (12)) or standard transformer on modular arithmetic"),
    "grok-suite": ("cvxtransformer.experiments.suite",
                   "grokking experiment (Figures 4-7): division mod 97 (L=1,2) and mod 15 (L=1,4), "
                   "convex vs standard"),
    "kernel": ("cvxtransformer.experiments.kernel",
               "kernel preconditioning (UCSD eq. (9)): periodicity task, convex vs convex+Fastfood vs standard"),
    "spectral": ("cvxtransformer.experiments.spectra",
                 "spectral analysis: singular values and effective rank of each layer during training"),
}


def load_npz(path, role, required=()):
    """Arrays of a .npz file as a dict; errors name the argument and the fix."""
    try:
        with np.load(path, allow_pickle=False) as f:
            data = {k: f[k] for k in f.files}
    except FileNotFoundError:
        raise InvalidInputError(f"{role}: file {path!r} not found") from None
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{role}: {path!r} is not a readable .npz file ({exc})") from None
    missing = [k for k in required if k not in data]
    if missing:
        raise InvalidInputError(f"{role}: {path!r} has no array {missing[0]!r} (it holds "
                                f"{sorted(data) or 'nothing'}); save it with np.savez(path, {missing[0]}=...)")
    return data


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(type(obj).__name__)


def print_json(obj):
    print(json.dumps(obj, default=_json_default))


def _problem_args(p):
    p.add_argument("--program", type=int, choices=(8, 10, 12), required=True)
    p.add_argument("--loss", choices=("squared", "logistic", "cross_entropy"), required=True)
    beta = p.add_mutually_exclusive_group(required=True)
    beta.add_argument("--beta", type=float, help="regularization weight beta > 0")
    beta.add_argument("--beta-frac", type=float, metavar="F",
                      help="beta = F * beta_max of the data (0 < F < 1 gives a nonzero solution)")
    p.add_argument("--gates", type=int, default=8, help="number of gates h of program (12) when DATA has no U1, U2")
    p.add_argument("--gate-seed", type=int, default=0, help="seed of the sampled gates of program (12)")
    p.add_argument("--classes", type=int, default=None, help="number of classes (cross-entropy; default max(y)+1)")
    p.add_argument("--tol", type=float, default=1e-6, help="relative duality gap to certify (default 1e-6)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _make_problem(args, data, gates=None):
    from .problem import make_problem

    U1, U2 = gates if gates is not None else (data.get("U1"), data.get("U2"))
    if args.program != 12:
        U1 = U2 = None
    problem = make_problem(data["X"], data["y"], program=args.program, loss=args.loss,
                           beta=args.beta if args.beta is not None else 1.0, U1=U1, U2=U2,
                           heads=args.gates, gate_seed=args.gate_seed, n_classes=args.classes)
    if args.beta_frac is not None:
        if not 0 < args.beta_frac:
            raise InvalidInputError(f"--beta-frac: expected a number > 0, got {args.beta_frac}")
        problem = problem.with_beta(args.beta_frac * problem.beta_max())
    return problem


def format_certificate(summary):
    """Human-readable certificate, one quantity a line."""
    s = summary
    verdict = "CERTIFIED" if s["certified"] else "NOT CERTIFIED (gap above tolerance)"
    lines = [
        f"program ({s['program']}), {s['loss']} loss, {s['form']} form, solver {s['solver']}",
        f"  beta                     {s['beta']:.6g}  (beta_max = {s['beta_max']:.6g})",
        f"  solver status            {s['status']}  (reported, not trusted)",
        f"  primal objective P(Z)    {s['primal_objective']:.12g}",
        f"  dual objective D(V)      {s['dual_objective']:.12g}",
        f"  duality gap              {s['duality_gap']:.3e}  (relative {s['relative_gap']:.3e}, tol {s['tol']:.1e})",
        f"  KKT stationarity         {s['kkt_stationarity']:.3e}",
        f"  KKT dual feasibility     {s['kkt_dual_feasibility']:.3e}",
        f"  heads recovered          {s['heads_recovered']}",
        f"  nonconvex objective      {s['recovered_objective']:.12g}  (balanced; Lemma 1: "
        f"{s['recovered_objective_lemma1']:.12g})",
    ]
    if s.get("solve_seconds") is not None:
        lines.append(f"  time                     solve {s['solve_seconds']:.3f} s, build {s.get('build_seconds', 0):.3f} s")
    lines.append(f"  verdict                  {verdict}")
    return "\n".join(lines)


def cmd_solve(args):
    from .solve import solve

    data = load_npz(args.data, "DATA", ("X", "y"))
    problem = _make_problem(args, data)
    options = {}
    if args.solver == "fista":
        options = dict(device=args.device, dtype=args.dtype, progress=args.progress)
        options.update({k: v for k, v in (("max_iter", args.max_iter), ("time_limit", args.time_limit))
                        if v is not None})
    result = solve(problem, solver=args.solver, form=args.form, tol=args.tol, verbose=args.verbose, **options)
    if args.out:
        result.save(args.out)
    summary = result.summary()
    print_json(summary) if args.json else print(format_certificate(summary))
    return 0 if result.certified else 1


def cmd_verify(args):
    from .certificate import certify

    data = load_npz(args.data, "DATA", ("X", "y"))
    res = load_npz(args.result, "RESULT", ("Z",))
    gates = (res["U1"], res["U2"]) if "U1" in res and "U2" in res else None
    problem = _make_problem(args, data, gates)
    if res["Z"].shape != problem.program.shape:
        raise InvalidInputError(f"RESULT: Z has shape {res['Z'].shape}, program ({args.program}) on this "
                                f"data needs {problem.program.shape}; check --program, --gates and DATA")
    if not np.all(np.isfinite(res["Z"])):
        raise InvalidInputError("RESULT: Z has NaN/Inf entries; it is not a solution to certify")
    V = res.get("V")
    if V is not None and V.size != problem.T.size:
        V = None
    cert = certify(problem, res["Z"], V=V, tol=args.tol)
    summary = {"program": args.program, "loss": args.loss, "form": "given", "solver": "none",
               "beta": problem.beta, **cert.to_dict(), "status": "verified"}
    print_json(summary) if args.json else print(format_certificate(summary))
    return 0 if cert.certified else 1


def cmd_demo(args):
    from .datasets import student_teacher
    from .networks import AlternativeAttention
    from .problem import make_problem
    from .solve import solve
    from .train import train

    X, Y = student_teacher(N=200, n=8, d=6, c=3, heads=2, noise=0.05, seed=args.seed)
    problem = make_problem(X, Y, program=10, loss="squared", beta=1.0)
    problem = problem.with_beta(0.2 * problem.beta_max())
    if not args.json:
        print(f"built-in default: student-teacher data X {X.shape}, Y {Y.shape} (simplex teacher, 2 heads), "
              "program (10), squared loss, beta = 0.2 beta_max, Clarabel")
    result = solve(problem, solver="clarabel", tol=args.tol)
    summary = result.summary()
    # The alternative attention network (9), trained by Adam, against the certified optimum:
    # its objective minus D(V) is a certified bound on its distance to the global optimum.
    heads, steps, lr = problem.program.n_groups, 2000, 1e-2
    net = AlternativeAttention(X.shape[1], X.shape[2], problem.T.shape[1], heads=heads, seed=args.seed)
    run = train(net, X, problem.T, problem.loss, problem.beta, optimizer="adam", lr=lr, steps=steps,
                seed=args.seed)
    gap = run.objective - summary["dual_objective"]
    summary["alternative_adam"] = {
        "network": "(9)", "heads": heads, "optimizer": "adam", "lr": lr, "steps": steps, "seconds": run.seconds,
        "objective": run.objective, "certified_lower_bound": summary["dual_objective"], "certified_gap": gap,
        "relative_certified_gap": gap / max(1.0, abs(run.objective))}
    if args.json:
        print_json(summary)
    else:
        print(format_certificate(summary))
        print(f"alternative attention network (9), {heads} heads, Adam (lr {lr:g}, {steps} steps, "
              f"{run.seconds:.2f} s):\n"
              f"  objective                {run.objective:.12g}\n"
              f"  certified gap            {gap:.6g} over D(V) = {summary['dual_objective']:.12g} "
              f"(relative {gap / max(1.0, abs(run.objective)):.3e})")
    return 0 if result.certified else 1


def build_parser(argv=None):
    parser = argparse.ArgumentParser(prog="cvxtransformer", description=(
        "Convexified transformer attention: solve programs (8), (10), (12) to global optimality and "
        "certify any solution (Ergen, Neyshabur & Mehta, arXiv 2211.11052)."))
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("solve", help="solve a convex program and print its certificate")
    p.add_argument("data", metavar="DATA.npz", help="X (N, n, d) and y; optionally U1 (h, n), U2 (h, d)")
    _problem_args(p)
    p.add_argument("--form", choices=("primal", "dual"), default="primal")
    p.add_argument("--solver", default="clarabel", help="clarabel (default), scs, or fista (torch backend)")
    p.add_argument("--out", metavar="RESULT.npz", help="write Z, V (and U1, U2) here")
    p.add_argument("--verbose", action="store_true", help="show the solver's own log")
    torch_opts = p.add_argument_group("torch backend (--solver fista)")
    torch_opts.add_argument("--device", default="cpu", help="cpu or cuda")
    torch_opts.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    torch_opts.add_argument("--max-iter", type=int, default=None, help="iteration budget")
    torch_opts.add_argument("--time-limit", type=float, default=None, help="time budget in seconds")
    torch_opts.add_argument("--progress", action="store_true", help="show gap and objective as the solve goes")
    p.set_defaults(run=cmd_solve)

    p = sub.add_parser("verify", help="certify a given solution Z")
    p.add_argument("data", metavar="DATA.npz")
    p.add_argument("result", metavar="RESULT.npz", help="Z in the program's shape (V, U1, U2 optional)")
    _problem_args(p)
    p.set_defaults(run=cmd_verify)

    p = sub.add_parser("demo", help="the built-in default: solve and certify program (10) on student-teacher data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_demo)

    command = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    for name, (module, help) in EXTERNAL.items():
        p = sub.add_parser(name, help=help)
        if name == command:  # the other modules are not needed to parse this command line
            mod = import_module(module)
            mod.configure(p)
            p.set_defaults(run=mod.run)
    return parser


def main(argv=None):
    args = build_parser(argv).parse_args(argv)
    try:
        return args.run(args)
    except CvxTransformerError as exc:
        print(f"cvxtransformer {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"cvxtransformer {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
