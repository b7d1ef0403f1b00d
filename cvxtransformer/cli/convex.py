"""``cvxtransformer solve``, ``verify`` and ``demo``: the convex programs and their certificates."""
from .options import add_problem_arguments, make_problem_from, positive_float, positive_int, tolerance

TORCH_ONLY = ("device", "dtype", "progress", "chunk_size")
NAMES = {"mhsa": "program (6) (linear MHSA)", "gated_mhsa": "gated-ReLU MHSA program"}
SUPPORT = {"mhsa": "rank", "gated_mhsa": "rank, summed over the gates"}


def format_certificate(s):
    """Human-readable certificate, one quantity a line (``s``: a ``--json`` summary)."""
    verdict = "CERTIFIED" if s["certified"] else f"NOT CERTIFIED (relative gap above tol {s['tol']:.1e})"
    program = NAMES.get(s["program"], f"program ({s['program']})")
    refined = s.get("refined_relative_gap")
    lines = [
        f"{program}, {s['loss']} loss, {s['form']} form, solver {s['solver']}",
        f"  beta                     {s['beta']:.6g}  (beta_max = {s['beta_max']:.6g})",
        f"  solver status            {s['status']}",
        f"  primal objective P(Z)    {s['primal_objective']:.12g}",
        f"  dual objective D(V)      {s['dual_objective']:.12g}  (dual point: {s['dual_source']})",
        f"  duality gap              {s['duality_gap']:.3e}  (relative {s['relative_gap']:.3e}, tol {s['tol']:.1e})",
        f"  gap from Z alone         {s['residual_relative_gap']:.3e}  (relative, scaled residual)",
    ]
    if refined is not None:
        lines.append(f"  gap, refined dual point  {refined:.3e}  (relative; refinement {s['refine_seconds']:.3f} s, "
                     f"{s['refine_status']})")
    lines += [
        f"  KKT stationarity         {s['kkt_stationarity']:.3e}",
        f"  KKT dual feasibility     {s['kkt_dual_feasibility']:.3e}",
        f"  support                  {s['support_size']} ({SUPPORT.get(s['program'], 'nonzero groups')})",
        f"  heads recovered          {s['heads_recovered']}",
    ]
    lemma = s.get("recovered_objective_lemma1")
    lines.append(f"  nonconvex objective      {s['recovered_objective']:.12g}  (balanced"
                 + ("" if lemma is None else f"; Lemma 1: {lemma:.12g}") + ")")
    if s.get("solve_seconds") is not None:
        lines.append(f"  time                     solve {s['solve_seconds']:.3f} s, build {s.get('build_seconds', 0):.3f} s")
    lines.append(f"  verdict                  {verdict}")
    return "\n".join(lines)


def _print(args, summary):
    from ..core.io import dumps

    print(dumps(summary) if args.json else format_certificate(summary))


def _refine_arguments(p):
    p.add_argument("--no-refine", action="store_true",
                   help="certify with the scaled residual and the given V only (no refined dual point)")
    p.add_argument("--refine-time", type=positive_float, default=10.0,
                   help="seconds allowed to the verifier's refined dual point")


# ----------------------------------------------------------------------------- solve
DATA_HELP = ("a .npz file with X (N, n, d) and y, optionally U1 (h, n) and U2 (h, d) (program 12) or H (P, d, d) "
             "(gated_mhsa); or a folder with X.npy, y.npy (optionally U1.npy, U2.npy, H.npy), memory-mapped: X is "
             "read in chunks, never whole")


def configure_solve(p):
    p.add_argument("data", metavar="DATA", nargs="+",
                   help=DATA_HELP + "; or several such folders (shards: rows concatenated in the order given)")
    add_problem_arguments(p)
    p.add_argument("--form", choices=("primal", "dual"), default="primal",
                   help="primal: the program; dual: its dual, Z read from the multipliers (clarabel, scs)")
    p.add_argument("--solver", choices=("clarabel", "scs", "fista"), default="clarabel",
                   help="clarabel (interior point), scs (splitting), fista (torch proximal gradient)")
    p.add_argument("--out", metavar="RESULT.npz", help="write Z, V, beta (and the gates U1, U2 or H) here")
    p.add_argument("--verbose", action="store_true", help="show the solver's own log")
    p.add_argument("--max-iter", type=positive_int, default=None, help="iteration budget of the solver")
    p.add_argument("--time-limit", type=positive_float, default=None, help="time budget of the solver, seconds")
    _refine_arguments(p)
    t = p.add_argument_group("torch backend (--solver fista only)")
    t.add_argument("--device", default=None, help="cpu or cuda (default cpu)")
    t.add_argument("--dtype", choices=("float64", "float32"), default=None, help="working precision (default float64)")
    t.add_argument("--progress", action="store_true", default=None, help="show gap and objective as the solve goes")
    t.add_argument("--distributed", action="store_true",
                   help="data-parallel solve over torch.distributed: launch with torchrun --nproc-per-node K -m "
                        "cvxtransformer solve DATA ... --distributed; every process reads its rows of DATA, rank 0 "
                        "prints and writes --out (see docs/scaling.md)")
    t.add_argument("--dist-timeout", type=positive_float, default=600.0, metavar="S",
                   help="with --distributed: seconds a process waits for the others before it stops with an error")


def run_solve(args):
    from ..core.data import open_data
    from ..core.errors import InvalidInputError
    from ..core.io import check_output_file
    from ..solving import solve

    if args.out and not args.distributed:
        check_output_file(args.out, "--out")
    options = {k: v for k, v in (("device", args.device), ("dtype", args.dtype), ("progress", args.progress))
               if v is not None}
    if options and args.solver != "fista":
        raise InvalidInputError(f"--{next(iter(options))}: only for --solver fista, got --solver {args.solver}")
    options.update({k: v for k, v in (("max_iter", args.max_iter), ("time_limit", args.time_limit)) if v is not None})
    if args.distributed:
        return _run_distributed(args, options)
    data = open_data(args.data)
    X, y = data.rows()
    problem = make_problem_from(args, X, y, data.U1, data.U2, H=data.H)
    refine = False if args.no_refine else "auto"
    result = solve(problem, solver=args.solver, form=args.form, tol=args.tol, verbose=args.verbose, refine=refine,
                   refine_time=args.refine_time, **options)
    if args.out:
        result.save(args.out)
    _print(args, result.summary())
    return 0 if result.certified else 1


def _run_distributed(args, options):
    """``solve --distributed`` on this process (one of torchrun's): checks on every process before
    any work, this process's rows of DATA, the solve, V gathered on rank 0, which prints and writes."""
    import argparse
    import dataclasses

    import torch.distributed as dist

    from solvers import distributed

    from ..core.data import open_data
    from ..core.errors import InvalidInputError
    from ..core.io import check_output_file
    from ..solving import solve

    if args.solver != "fista" or args.form != "primal":
        raise InvalidInputError(f"--distributed: only for --solver fista (primal form), got --solver {args.solver} "
                                f"--form {args.form}")
    options["device"] = distributed.init(options.get("device", "cpu"), args.dist_timeout)
    try:
        rank = dist.get_rank()
        distributed.agree(lambda: rank == 0 and args.out and check_output_file(args.out, "--out"))
        data = distributed.agree(open_data, args.data)
        local = argparse.Namespace(**dict(vars(args), beta_frac=None))  # beta_max is known once sharded

        def build(X, y, U1, U2, max_label):
            if args.loss == "cross_entropy" and args.classes is None and max_label is not None:
                local.classes = max_label + 1  # the classes of every shard
            return make_problem_from(local, X, y, U1, U2, H=data.H)

        problem = distributed.shard_data(data, build)
        if args.beta_frac is not None:
            problem = problem.with_beta(args.beta_frac * problem.beta_max())
        result = solve(problem, solver="fista", tol=args.tol, verbose=args.verbose,
                       refine=False if args.no_refine else "auto", refine_time=args.refine_time, **options)
        V = problem.program.shards.gather_rows(result.V)
        if rank == 0:
            result = dataclasses.replace(result, V=V)
            if args.out:
                result.save(args.out)
            _print(args, result.summary())
        return 0 if result.certified else 1
    finally:
        distributed.finish()


# ----------------------------------------------------------------------------- verify
def configure_verify(p):
    p.add_argument("data", metavar="DATA", help=DATA_HELP + ", as for solve")
    p.add_argument("result", metavar="RESULT.npz",
                   help="Z in the program's shape; optionally V (a dual point), beta, and the gates U1 and U2 or H")
    add_problem_arguments(p)
    _refine_arguments(p)


def run_verify(args):
    import sys

    import numpy as np

    from ..core.data import open_data
    from ..core.errors import InvalidInputError
    from ..core.io import load_npz
    from ..verify import certify

    data = open_data(args.data)
    res = load_npz(args.result, "RESULT", ("Z",))
    if ("U1" in res) != ("U2" in res):
        raise InvalidInputError("RESULT: it holds only one of U1, U2; save both or neither")
    X, y = data.rows()
    problem = make_problem_from(args, X, y, res.get("U1", data.U1), res.get("U2", data.U2), H=res.get("H", data.H))
    if res["Z"].shape != problem.program.shape:
        raise InvalidInputError(f"RESULT: Z has shape {res['Z'].shape}, {problem.program.label} on this data needs "
                                f"{problem.program.shape}; check --program, --gates and DATA")
    if not np.all(np.isfinite(res["Z"])):
        raise InvalidInputError("RESULT: Z has NaN/Inf entries; it is not a solution to certify")
    V = res.get("V")
    if V is not None:
        V = problem.program.check_V(V, "RESULT: V")
    summary = {"program": problem.program.name, "loss": args.loss, "form": "given", "solver": "none"}
    if "beta" in res:
        stored = float(res["beta"])
        summary["result_beta"] = stored
        if not np.isclose(stored, problem.beta, rtol=1e-12, atol=0):
            print(f"cvxtransformer verify: note: RESULT was solved at beta = {stored:.10g}; certifying at "
                  f"beta = {problem.beta:.10g} (from --beta/--beta-frac)", file=sys.stderr)
    cert = certify(problem, res["Z"], V=V, tol=args.tol, refine=not args.no_refine, refine_time=args.refine_time)
    summary.update(cert.to_dict())
    summary["status"] = "none (a given Z)"
    _print(args, summary)
    return 0 if cert.certified else 1


# ----------------------------------------------------------------------------- demo
def configure_demo(p):
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the network and its training")
    p.add_argument("--tol", type=tolerance, default=1e-6, help="relative duality gap to certify, in (0, 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run_demo(args):
    from ..core.problem import make_problem
    from ..datasets import student_teacher
    from ..nn.networks import AlternativeAttention
    from ..nn.trainer import train
    from ..solving import solve

    X, Y = student_teacher(N=200, n=8, d=6, c=3, heads=2, noise=0.05, seed=args.seed)
    problem = make_problem(X, Y, program=10, loss="squared", beta=1.0)
    problem = problem.with_beta(0.2 * problem.beta_max())
    if not args.json:
        print(f"built-in default: student-teacher data X {X.shape}, Y {Y.shape} (simplex teacher, 2 heads), "
              "program (10), squared loss, beta = 0.2 beta_max, Clarabel")
    result = solve(problem, solver="clarabel", tol=args.tol, refine=True)
    summary = result.summary()
    # The alternative attention network (9), trained by Adam, against the certified optimum:
    # its objective minus D(V) is a certified bound on its distance to the global optimum.
    heads, steps, lr = problem.program.n_blocks, 2000, 1e-2
    net = AlternativeAttention(X.shape[1], X.shape[2], problem.T.shape[1], heads=heads, seed=args.seed)
    run = train(net, X, problem.T, problem.loss, problem.beta, optimizer="adam", lr=lr, steps=steps, seed=args.seed)
    gap = run.objective - summary["dual_objective"]
    summary["alternative_adam"] = {
        "network": "(9)", "heads": heads, "optimizer": "adam", "lr": lr, "steps": steps, "seconds": run.seconds,
        "objective": run.objective, "certified_lower_bound": summary["dual_objective"], "certified_gap": gap,
        "relative_certified_gap": gap / max(1.0, abs(run.objective))}
    if args.json:
        _print(args, summary)
    else:
        print(format_certificate(summary))
        print(f"alternative attention network (9), {heads} heads, Adam (lr {lr:g}, {steps} steps, "
              f"{run.seconds:.2f} s):\n"
              f"  objective                {run.objective:.12g}\n"
              f"  certified gap            {gap:.6g} over D(V) = {summary['dual_objective']:.12g} "
              f"(relative {gap / max(1.0, abs(run.objective)):.3e})")
    return 0 if result.certified else 1
