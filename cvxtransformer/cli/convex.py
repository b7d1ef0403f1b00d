"""``cvxtransformer solve``, ``verify`` and ``demo``: the convex programs and their certificates."""
from ..core.registry import builtin_gate_arrays, families, family, gate_arrays
from .options import (add_problem_arguments, class_mapping, encode_labels, make_problem_from, positive_float,
                      positive_int, seed, tolerance)

TORCH_ONLY = ("device", "dtype", "progress", "chunk_size")
LOCAL = ("data", "out", "json", "verbose", "quiet", "progress", "run", "command")  # options a process may have its own of
HEARTBEAT = 5.0  # seconds of a silent solve before a progress line


def _line(name, value, note=""):
    """One named quantity a line: ``  name<padding>value  (note)``."""
    return f"  {name:<25s}{value}" + (f"  ({note})" if note else "")


def format_certificate(s):
    """Human-readable certificate, one named number a line (``s``: a ``--json`` summary)."""
    by = s.get("certified_by")
    verdict = ("CERTIFIED" + (" (gap <= atol)" if by == "absolute" else "") if s["certified"]
               else "NOT CERTIFIED (" + (s.get("note") or "relative gap above tol") + ")")
    fam = family(s["program"])  # its label and what its support size counts
    program = fam.label
    if s.get("given_Z"):  # verify: Z read from a file; how it was solved, where RESULT's summary says
        how = f"{s['given_Z']}" + (f" (solved by {s['solver']}, {s['form']} form)" if s.get("solver") else "")
        head = f"{program}, {s['loss']} loss, Z from {how}"
    else:
        head = (f"{program}, {s['loss']} loss, {s['form']} form"
                + (f" ({s['formulation']} formulation)" if s.get("formulation") else "") + f", solver {s['solver']}"
                + (f" ({s['solver_choice']})" if s.get("solver_choice") else ""))
    lines = [
        head,
        _line("beta", f"{s['beta']:.6g}"),
        _line("beta_max", f"{s['beta_max']:.6g}", "Z = 0 is optimal from here on"),
        _line("solver status", s["status"]),
        _line("primal objective P(Z)", f"{s['primal_objective']:.12g}"),
        _line("dual objective D(V)", f"{s['dual_objective']:.12g}", f"dual point: {s['dual_source']}"),
        _line("duality gap", f"{s['duality_gap']:.3e}", "P(Z) - D(V)"),
        _line("relative gap", f"{s['relative_gap']:.3e}", "gap / D(V), >= (P(Z) - p*) / p*"),
        _line("tolerance", f"{s['tol']:.1e}", "relative gap to certify"),
    ]
    if s.get("atol") is not None:
        lines.append(_line("absolute tolerance", f"{s['atol']:.1e}", "duality gap that certifies too"))
    lines += [
        _line("relative gap, Z alone", f"{s['residual_relative_gap']:.3e}", "at the scaled residual dual point"),
    ]
    if s.get("refined_relative_gap") is not None:
        lines += [_line("relative gap, refined", f"{s['refined_relative_gap']:.3e}", "at the refined dual point"),
                  _line("refinement time", f"{s['refine_seconds']:.3f} s"),
                  _line("refinement ended", s["refine_status"], "its own iterate, not Z")]
    lines += [
        _line("KKT stationarity", f"{s['kkt_stationarity']:.3e}"),
        _line("KKT dual feasibility", f"{s['kkt_dual_feasibility']:.3e}"),
        _line("support", s["support_size"], fam.program.support_label),
        _line("heads recovered", s["heads_recovered"]),
        _line("nonconvex objective", f"{s['recovered_objective']:.12g}", "recovered heads, balanced"),
    ]
    if s.get("recovered_objective_lemma1") is not None:
        lines.append(_line("nonconvex, Lemma 1", f"{s['recovered_objective_lemma1']:.12g}", "recovered heads"))
    if s.get("processes") is not None:
        lines.append(_line("processes", s["processes"], "torch.distributed, one shard of the samples each"))
    if s.get("solve_seconds") is not None:
        lines += [_line("solve time", f"{s['solve_seconds']:.3f} s"),
                  _line("build time", f"{s.get('build_seconds', 0):.3f} s")]
    if s.get("class_mapping"):
        lines.append(_line("classes", s["class_mapping"], "labels, sorted, as RESULT stores them"))
    if s.get("data_fingerprint"):
        lines.append(_line("data", s["data_fingerprint"]))
    lines.append(_line("verdict", verdict))
    return "\n".join(lines)


def _print(args, summary, out=None):
    """The summary (``--json``) or the certificate; ``out``: the file written, named as compare names its
    files (``"out"`` in the JSON, a last ``wrote`` line in the text)."""
    from ..core.io import dumps

    if out:
        summary = dict(summary, out=out)
    print(dumps(summary) if args.json else format_certificate(summary) + (f"\nwrote {out}" if out else ""))


def _refine_arguments(p):
    p.add_argument("--no-refine", action="store_true",
                   help="certify with the scaled residual and the given V only (no refined dual point)")
    p.add_argument("--refine-time", type=positive_float, default=10.0,
                   help="seconds allowed to the verifier's refined dual point")


# ----------------------------------------------------------------------------- solve
DATA_HELP = (f"a .npz file with X (N, n, d) and y, optionally the program's gate arrays ({builtin_gate_arrays()}); "
             "or a folder with X.npy, y.npy (optionally the gate arrays as U1.npy, ...), memory-mapped: X is read "
             "in chunks, never whole")


def configure_solve(p):
    p.add_argument("data", metavar="DATA", nargs="+",
                   help=DATA_HELP + "; or several such folders (shards: rows concatenated in the order given)")
    add_problem_arguments(p)
    p.add_argument("--form", choices=("primal", "dual"), default="primal",
                   help="primal: the program; dual: its dual, Z read from the multipliers (clarabel, scs)")
    p.add_argument("--solver", choices=("auto", "clarabel", "scs", "fista"), default="auto",
                   help="clarabel (interior point), scs (splitting), fista (torch proximal gradient), or auto: "
                        "clarabel for a small problem, fista otherwise (the output says which and why)")
    p.add_argument("--formulation", choices=("auto", "compressed", "factored", "direct"), default="auto",
                   help="how clarabel and scs get the program: auto (the squared loss compressed to the size of Z "
                        "whatever N; a factored map where the program has one and it is smaller), or forced; direct is "
                        "the dense design")
    p.add_argument("--out", metavar="RESULT.npz",
                   help=f"write Z, V, beta (and the program's gate arrays: {builtin_gate_arrays()}) here, with the "
                        "data's SHA-256 fingerprint")
    p.add_argument("--verbose", action="store_true", help="show the solver's own log")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines (by default a line on stderr when a solve runs past 5 s, then every 30 s)")
    p.add_argument("--max-iter", type=positive_int, default=None, help="iteration budget of the solver")
    p.add_argument("--time-limit", type=positive_float, default=None,
                   help="time budget of the solver, seconds (clarabel and scs: CVXPY's compilation included; a "
                        "solver started is given 1 s more to stop; the certificate's refinement has --refine-time)")
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

    options = {k: v for k, v in (("device", args.device), ("dtype", args.dtype), ("progress", args.progress))
               if v is not None}
    if options and args.solver not in ("fista", "auto"):
        raise InvalidInputError(f"--{next(iter(options))}: only for --solver fista, got --solver {args.solver}")
    if args.formulation != "auto":
        if args.solver == "fista":
            raise InvalidInputError(f"--formulation: only for --solver clarabel or scs, got --solver {args.solver}")
        options["formulation"] = args.formulation
    options.update({k: v for k, v in (("max_iter", args.max_iter), ("time_limit", args.time_limit)) if v is not None})
    if args.distributed:
        return _run_distributed(args, options)
    data = open_data(args.data)  # headers only (a .npz is loaded): then --out is checked against the inputs
    pieces = None
    if args.out is not None:
        check_output_file(args.out, "--out")
        pieces = data.fingerprint()  # RESULT's, taken before the rows are read; compared again at the end
    X, y = data.rows()
    y, classes = encode_labels(y, args.loss)
    problem = make_problem_from(args, X, y, **data.gates)
    refine = False if args.no_refine else "auto"
    result = solve(problem, solver=args.solver, form=args.form, tol=args.tol, atol=args.atol, verbose=args.verbose,
                   refine=refine,
                   refine_time=args.refine_time, heartbeat_after=None if args.quiet else HEARTBEAT, **options)
    if args.out is not None:
        data.check_unchanged(pieces)  # the data solved is the data the fingerprint names
        result.save(args.out, fingerprint=_fingerprint(data, pieces, problem),
                    **({} if classes is None else {"classes": classes}))
    _print(args, _with_classes(result.summary(), classes, args.loss), args.out)
    return 0 if result.certified else 1


def _fingerprint(data, pieces, problem):
    """RESULT's ``fingerprint`` (a JSON string): the rows of DATA, SHA-256 of X and y by shard (``pieces``,
    as each process read them: :meth:`~cvxtransformer.core.data.DataSet.fingerprint`), and of the gates
    the problem was solved with."""
    import numpy as np

    from ..core.io import dumps

    return np.array(dumps({"hash": "sha256", "N": data.N, "pieces": pieces,
                           "gates": _gates_fingerprint(problem.program.gate_arrays())}))


def _gates_fingerprint(arrays):
    """The fingerprint of gate arrays (a dict name -> array, in float64), None without gates."""
    import numpy as np

    from ..core.fingerprint import fingerprint

    return fingerprint(*(np.asarray(arrays[k], dtype=float) for k in sorted(arrays))) if arrays else None


def _with_classes(summary, classes, loss):
    """The summary with the mapping of string labels (``classes``: sorted, as in RESULT), if any."""
    if classes is not None:
        summary.update(classes=classes.tolist(), class_mapping=class_mapping(classes, loss))
    return summary


def _run_distributed(args, options):
    """``solve --distributed`` on this process (one of torchrun's): checks on every process before
    any work (the same options, the same DATA, the same gates), this process's rows of DATA, the
    solve, V gathered on rank 0, which prints and writes. An error that every process raises alike
    is printed once, by rank 0."""
    import torch.distributed as dist

    from cvxtransformer.solvers import distributed

    from ..core.errors import CvxTransformerError, InvalidInputError

    if args.solver not in ("fista", "auto") or args.form != "primal":
        raise InvalidInputError(f"--distributed: only for --solver fista (primal form), got --solver {args.solver} "
                                f"--form {args.form}")
    options["device"] = distributed.init(options.get("device", "cpu"), args.dist_timeout)
    rank = dist.get_rank()
    try:
        return _solve_distributed(args, options, rank)
    except CvxTransformerError as exc:
        if rank != 0 and getattr(exc, "every_process", False):
            return 2  # the same error on every process: rank 0 prints it, once
        raise
    finally:
        distributed.finish()


def _solve_distributed(args, options, rank):
    import argparse
    import dataclasses

    import torch.distributed as dist

    from cvxtransformer.solvers import distributed

    from ..core.data import open_data
    from ..core.errors import InvalidInputError
    from ..core.io import check_output_file
    from ..solving import solve

    distributed.check_same({f"--{k.replace('_', '-')}": v for k, v in sorted(vars(args).items()) if k not in LOCAL},
                           "launch every process with the same options")
    data = distributed.agree(open_data, args.data)
    distributed.agree(lambda: rank == 0 and args.out is not None and check_output_file(args.out, "--out"))
    local = argparse.Namespace(**dict(vars(args), beta=args.beta or 1.0, beta_frac=None))  # beta_max: once sharded

    def build(X, y, gates, max_label):
        if args.loss == "cross_entropy" and args.classes is None and max_label is not None:
            local.classes = max_label + 1  # the classes of every shard
        return make_problem_from(local, X, y, **gates)

    writes = [bool(args.out)]  # whether rank 0 writes RESULT (--out is its own)
    distributed.collective(dist.broadcast_object_list, writes, src=0)
    # each process's rows of DATA, fingerprinted before that process reads them, and again at the end
    mine = data.fingerprint(*data.split(dist.get_world_size(), rank)) if writes[0] else []
    problem = distributed.shard_data(data, build)
    if args.beta_frac is not None:
        problem = problem.with_beta_frac(args.beta_frac)
    result = solve(problem, solver="fista", tol=args.tol, atol=args.atol, verbose=args.verbose,
                   refine=False if args.no_refine else "auto", refine_time=args.refine_time, **options)
    V = problem.program.shards.gather_rows(result.V)
    shards = problem.program.shards
    changed = None
    if writes[0]:
        try:
            data.check_unchanged(mine)
        except InvalidInputError as exc:
            changed = str(exc)
    pieces = [None] * shards.size
    distributed.collective(dist.all_gather_object, pieces, (mine, changed))
    for r, (_, why) in enumerate(pieces):
        if why is not None:  # raised alike on every process (printed once, by rank 0)
            exc = InvalidInputError(f"{why} (on rank {r})")
            exc.every_process = True
            raise exc
    pieces = [piece for mine, _ in pieces for piece in mine]
    if rank == 0:
        result = dataclasses.replace(result, V=V)
        if args.out is not None:
            result.save(args.out, fingerprint=_fingerprint(data, pieces, problem))
        _print(args, dict(result.summary(), processes=dist.get_world_size()), args.out)
    return 0 if result.certified else 1


# ----------------------------------------------------------------------------- verify
def configure_verify(p):
    p.add_argument("data", metavar="DATA", help=DATA_HELP + ", as for solve")
    p.add_argument("result", metavar="RESULT.npz",
                   help="Z in the program's shape; optionally V (a dual point), beta, and the gates U1 and U2, H or G")
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
    for fam in families().values():  # a family's gate arrays come together
        held = [k for k in fam.gate_arrays if k in res]
        if held and len(held) < len(fam.gate_arrays):
            raise InvalidInputError(f"RESULT: it holds only {', '.join(held)} of the gate arrays "
                                    f"{', '.join(fam.gate_arrays)} ({fam.label}); save all of them or none")
    stored = None if "beta" not in res else _stored_beta(res["beta"])
    fingerprint = _stored_fingerprint(res)
    if fingerprint is not None:
        data.check_fingerprint(fingerprint)
    X, y = data.rows()
    gates = _gates(args, data, res, fingerprint is None)
    y, classes = encode_labels(y, args.loss, res.get("classes"))
    problem = make_problem_from(args, X, y, **{**data.gates, **{k: res[k] for k in gate_arrays() if k in res}})
    if np.shape(res["Z"]) != problem.program.shape:
        raise InvalidInputError(f"RESULT: Z has shape {np.shape(res['Z'])}, {problem.program.label} on this data "
                                f"needs {problem.program.shape}; check --program, --gates and DATA")
    Z = problem.program.check_Z(res["Z"], "RESULT: Z")
    V = res.get("V")
    if V is not None:
        V = problem.program.check_V(V, "RESULT: V")
    solved = _solved_by(res)
    summary = {"program": problem.program.name, "loss": args.loss, "given_Z": args.result,
               "form": solved.get("form"), "solver": solved.get("solver")}
    if gates is not None:
        summary["gates"] = gates
    if fingerprint is None:
        summary["data_fingerprint"] = "not checked: RESULT holds no fingerprint of the data it was solved on"
        print("cvxtransformer verify: note: RESULT holds no data fingerprint (written by an older version, or "
              "not by solve --out): it could not be checked that DATA is the data it was solved on", file=sys.stderr)
    else:
        _check_gates(args, data, problem, fingerprint.get("gates"), gates)
        summary["data_fingerprint"] = "checked: DATA is the data RESULT was solved on (SHA-256 of X, y, gates)"
    if stored is not None:
        summary["result_beta"] = stored
        if not np.isclose(stored, problem.beta, rtol=1e-12, atol=0):
            print(f"cvxtransformer verify: note: RESULT was solved at beta = {stored:.10g}; certifying at "
                  f"beta = {problem.beta:.10g} (from --beta/--beta-frac)", file=sys.stderr)
    cert = certify(problem, Z, V=V, tol=args.tol, refine=not args.no_refine, refine_time=args.refine_time,
                   atol=args.atol)
    if fingerprint is not None:  # DATA is still the data RESULT was solved on: it did not change under the run
        data.check_unchanged()
        if not data.in_memory:
            data.check_fingerprint(fingerprint, during_run=True)
    summary.update(cert.to_dict())
    summary["status"] = "none (a given Z)"
    _print(args, _with_classes(summary, classes, args.loss))
    return 0 if cert.certified else 1


def _check_gates(args, data, problem, recorded, source):
    """Refuse gates other than those RESULT's fingerprint records (``recorded``: the SHA-256 of the gates
    the solve used): DATA's, when DATA holds some (verify says DATA is the data RESULT was solved on),
    and the ones verify certifies with (``source``: RESULT's, DATA's or sampled from --gates and
    --gate-seed; see :func:`_gates`), whichever they are."""
    from ..core.errors import InvalidInputError

    names = family(args.program).gate_arrays
    shown = ", ".join(names) or "the gates"
    fix = "verify against the DATA and the RESULT that solve --out wrote, or solve again"
    if names and names[0] in data.gates and _gates_fingerprint({k: data.gates[k] for k in names}) != recorded:
        raise InvalidInputError(f"RESULT: it was solved with other gates: {shown} (DATA) differ from those of "
                                f"RESULT's fingerprint; {fix}")
    if _gates_fingerprint(problem.program.gate_arrays()) == recorded:
        return
    if source == "RESULT":
        raise InvalidInputError(f"RESULT: its gates {shown} are not the ones its fingerprint records (the gates Z "
                                f"was solved with); {fix}")
    if source is None:
        raise InvalidInputError(f"RESULT: its fingerprint records gates, and {problem.program.label} has none; "
                                "check --program, or solve again")
    raise InvalidInputError(f"RESULT: it was solved with other gates: {shown} ({source}) differ from those of "
                            f"RESULT's fingerprint; pass the --gates and --gate-seed of the solve, or {fix}")


def _solved_by(res):
    """RESULT's own summary (``solve --out`` stores it), if it holds one that reads: how Z was solved."""
    import json

    try:
        solved = json.loads(str(res["summary"]))
    except (KeyError, ValueError, RecursionError):
        return {}
    return {k: solved[k] for k in ("form", "solver") if isinstance(solved, dict) and isinstance(solved.get(k), str)}


def _stored_beta(a):
    """RESULT's ``beta``: one finite number > 0 (a 0-d or one-element numeric array)."""
    import numpy as np

    from ..core.errors import invalid

    a = np.asarray(a)
    value = a.reshape(()).item() if a.size == 1 and a.dtype.kind in "iuf" else None
    if value is None or not np.isfinite(value) or value <= 0:
        given = repr(value) if value is not None else f"an array of shape {a.shape}, dtype {a.dtype}"
        raise invalid("RESULT: beta", "one finite number > 0", given,
                      "save beta as a number (np.savez(path, Z=Z, beta=0.1)), or leave it out")
    return float(value)


def _stored_fingerprint(res):
    """RESULT's data fingerprint (a dict, see :func:`_fingerprint`), or None when it holds none."""
    import json

    from ..core.errors import InvalidInputError

    if "fingerprint" not in res:
        return None
    try:
        out = json.loads(str(res["fingerprint"].reshape(()).item()))
    except (ValueError, TypeError, RecursionError):  # not JSON, not one string, nested too deep
        out = None
    if not isinstance(out, dict) or out.get("hash") != "sha256":
        raise InvalidInputError("RESULT: its fingerprint is not one that cvxtransformer solve writes; remove it to "
                                "verify without checking the data, or solve again")
    return out


def _gates(args, data, res, note=True):
    """Where the gates come from (the family's gate arrays, e.g. U1, U2 of program (12)): "RESULT", "DATA" or
    "sampled (--gates G --gate-seed S)"; None for the programs without gates. When RESULT and DATA
    both hold gates and they differ, RESULT's are used (the gates Z was solved with) and, if ``note``
    (a RESULT without data fingerprint: with one, different gates are refused), a note on stderr
    says so."""
    import sys

    import numpy as np

    names = family(args.program).gate_arrays
    if not names:
        return None
    in_data = names[0] in data.gates
    if names[0] not in res:
        return "DATA" if in_data else f"sampled (--gates {args.gates} --gate-seed {args.gate_seed})"
    if note and in_data and not all(np.shape(res[k]) == np.shape(data.gates[k])
                                    and np.array_equal(res[k], data.gates[k]) for k in names):
        print(f"cvxtransformer verify: note: RESULT's gates {', '.join(names)} differ from DATA's; certifying with "
              "RESULT's (the gates Z was solved with)", file=sys.stderr)
    return "RESULT"


# ----------------------------------------------------------------------------- demo
def configure_demo(p):
    p.add_argument("--seed", type=seed, default=0, help="seed of the data, the network and its training")
    p.add_argument("--tol", type=tolerance, default=1e-6, help="relative duality gap to certify, in [1e-15, 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run_demo(args):
    from ..core.certificate import relative_gap
    from ..core.problem import make_problem
    from ..datasets import student_teacher
    from ..core.attention import WeightDecayProgram
    from ..nn.networks import WeightDecayAttention
    from ..nn.trainer import train
    from ..solving import solve

    X, Y = student_teacher(N=200, n=8, d=6, c=3, heads=2, noise=0.05, seed=args.seed)
    problem = make_problem(X, Y, program=WeightDecayProgram.names[10], loss="squared", beta=1.0)
    problem = problem.with_beta(0.2 * problem.beta_max())
    if not args.json:
        print(f"built-in default: student-teacher data X {X.shape}, Y {Y.shape} (simplex teacher, 2 heads), "
              f"{problem.program.label} (attention with ordinary weight decay: a nuclear norm per token), squared "
              "loss, beta = 0.2 beta_max, Clarabel")
    result = solve(problem, solver="clarabel", tol=args.tol, refine=True)
    summary = result.summary()
    # The alternative attention network with ordinary weight decay (9w), trained by Adam, against the certified
    # optimum: its objective minus D(V) is a certified bound on its distance to the global optimum. As many heads
    # as the optimum needs (its support: the ranks of its token matrices, summed), as compare trains by default.
    heads, steps, lr = max(1, result.certificate.support_size), 2000, 1e-2
    net = WeightDecayAttention(X.shape[1], X.shape[2], problem.T.shape[1], heads=heads, seed=args.seed)
    run = train(net, X, problem.T, problem.loss, problem.beta, optimizer="adam", lr=lr, steps=steps, seed=args.seed)
    gap = run.objective - summary["dual_objective"]
    summary["alternative_adam"] = {
        "network": "(9w)", "heads": heads, "optimizer": "adam", "lr": lr, "steps": steps, "seconds": run.seconds,
        "objective": run.objective, "certified_lower_bound": summary["dual_objective"], "certified_gap": gap,
        "relative_certified_gap": relative_gap(run.objective, summary["dual_objective"])}
    if args.json:
        _print(args, summary)
    else:
        print(format_certificate(summary))
        a = summary["alternative_adam"]
        print("\n".join(["alternative attention network with ordinary weight decay (9w), trained by Adam:",
                         _line("heads", heads), _line("learning rate", f"{lr:g}"), _line("steps", steps),
                         _line("training time", f"{run.seconds:.2f} s"),
                         _line("objective", f"{run.objective:.12g}"),
                         _line("certified lower bound", f"{summary['dual_objective']:.12g}", "D(V) above"),
                         _line("certified gap", f"{gap:.6g}", "objective - D(V)"),
                         _line("relative certified gap", f"{a['relative_certified_gap']:.3e}")]))
    return 0 if result.certified else 1
