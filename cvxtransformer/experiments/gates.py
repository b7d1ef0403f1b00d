"""``cvxtransformer grok-gates``: program (12) on one-hot tokens, solved to a certified gap, with
the gates of a ReLU network that generalised (oracle gates) and with random gates.

    cvxtransformer grok --model relu --steps 20000 --save-weights --out-dir runs/ladder/relu/seed0
    cvxtransformer grok-gates --teacher runs/ladder/relu/seed0 --out-dir runs/gates

The data are the teacher's split (task, modulus, reading, train fraction, seed), with the tokens
``[x, op, y, =]`` embedded one-hot (d = p + 2; the program then runs on
:class:`cvxtransformer.core.attention.TokenOperator`). The teacher, network (11) with ReLU gates
(:class:`cvxtransformer.nn.deep.ReLUNetwork`), has on these inputs exactly the activation pattern
``1[U1_j^T X_i U2_j >= 0]`` with ``U1 = W1`` and ``U2 = (E W2^T)^T``: its gates are bilinear, and
program (12) takes them as they are. ``--oracle-gates K`` keeps the K neurons of the teacher with
the largest contribution ``||w_3j|| mean_i relu(pre_ij)`` (the pruned teacher's own test accuracy
is reported beside). ``--random-gates`` lists the numbers h of N(0, 1) gates
(:func:`cvxtransformer.sample_gates`, seeds ``--gate-seeds``). With several teachers
(``--teacher RUN,RUN,...``, e.g. the seeds of a ladder's relu rung) each gives its oracle gates on
its own split, and the random gates are solved on the first teacher's split.

Each gate set is solved along ``--betas`` (fractions of beta_max, decreasing) by
:func:`cvxtransformer.solve_path` (the torch backend, warm starts, gap-safe screening), each
point certified by the verifier (``relative_gap``, ``certified`` at ``--tol``; a point whose
budget ran out says so). For each point: train accuracy, test accuracy on all rows, on the rows
with ``x != 0`` and ``x = 0`` (Wilson 95% intervals), the mean rank of the true label and
``true_label_operand_evidence``: on the ``x != 0`` test rows, the part of the true label's logit
that comes from the operand tokens, ``sum_j M_ij (Z[j, z, 0, x] + Z[j, z, 2, y])`` (docs/reproduction.md
shows it is <= 0 at every optimum; reported as its mean and the fraction of rows where it is > 0).

Writes ``DIR/summary.partial.json`` after every point (the rows so far; removed at the end) and
``DIR/summary.json`` (``rows``: one per gate set and beta; ``teacher``) and
``DIR/gates.png`` (accuracy on the ``x != 0`` test rows and on the training set against h).
"""
import os

from .config import Given, parse_list

DEFAULTS = dict(oracle_gates="64", random_gates="8,16,32,64", gate_seeds="0", betas="0.3,0.1,0.03", tol=1e-4,
                time_limit=300.0, max_iter=20000)
QUICK = dict(oracle_gates="4", random_gates="2,4", gate_seeds="0", betas="0.3", tol=1e-3, time_limit=20.0,
             max_iter=300)


def _ints(name, text, low=1):
    return parse_list(name, text, int, valid=lambda v: v >= low, expected=f"integers >= {low}")


def _fractions(text):
    values = parse_list("betas", text, float, valid=lambda v: 0 < v < 1, expected="fractions of beta_max in (0, 1)")
    return sorted(values, reverse=True)


def configure(parser):
    parser.add_argument("--teacher", required=True, metavar="RUN[,RUN...]",
                        help="folder(s) of relu runs written with --save-weights (metrics.json, weights.npz)")
    for name, help in (("oracle-gates", "neurons of the teacher kept as gates, comma-separated; 0: none (default 64)"),
                       ("random-gates", "numbers h of random gates, comma-separated; 0: none (default 8,16,32,64)"),
                       ("gate-seeds", "seeds of the random gates (default 0)"),
                       ("betas", "beta / beta_max, comma-separated, solved as one path (default 0.3,0.1,0.03)")):
        parser.add_argument(f"--{name}", default=DEFAULTS[name.replace("-", "_")], action=Given, help=help)
    parser.add_argument("--tol", type=float, default=DEFAULTS["tol"], action=Given,
                        help="relative duality gap certified at every point (default 1e-4)")
    parser.add_argument("--time-limit", type=float, default=DEFAULTS["time_limit"], action=Given,
                        help="seconds per point of a path (default 300)")
    parser.add_argument("--max-iter", type=int, default=DEFAULTS["max_iter"], action=Given,
                        help="proximal-gradient iterations per point (default 20000)")
    parser.add_argument("--progress", action="store_true",
                        help="print each point of a path as it is solved, and the solver's progress (stderr)")
    parser.add_argument("--quick", action="store_true",
                        help="pipeline check in seconds: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()) +
                             " (options given explicitly are kept)")
    parser.add_argument("--out-dir", required=True, metavar="DIR", help="folder for summary.json and gates.png")


def settings(args):
    """The options of a run, with ``--quick`` filling those not given."""
    given = getattr(args, "given", set())
    out = {k: getattr(args, k) for k in DEFAULTS}
    if args.quick:
        out.update({k: v for k, v in QUICK.items() if k not in given})
    return out


def run(args):
    """Entry point of the command line: ``run(args) -> exit code``."""
    from ..core.io import prepare_out_dir, write_json
    from ..core.validation import check_positive, check_tol
    from . import gate_solves

    s = settings(args)
    oracle = [k for k in _ints("oracle-gates", s["oracle_gates"], low=0) if k]
    random_h = [h for h in _ints("random-gates", s["random_gates"], low=0) if h]
    if not oracle and not random_h:
        from ..core.errors import InvalidInputError
        raise InvalidInputError("--oracle-gates, --random-gates: both are 0, nothing to solve; give a number of gates")
    seeds, fractions = _ints("gate-seeds", s["gate_seeds"], low=0), _fractions(s["betas"])
    tol = check_tol(s["tol"])
    options = dict(time_limit=check_positive("time_limit", s["time_limit"]),
                   max_iter=check_positive("max_iter", s["max_iter"], integer=True))
    teachers = [gate_solves.load_teacher(t) for t in args.teacher.split(",") if t.strip()]
    prepare_out_dir(args.out_dir)
    figure, rows = os.path.join(args.out_dir, "gates.png"), []
    summary = {"teacher": teachers[0].summary(), "teachers": [t.summary() for t in teachers], "rows": rows,
               "tol": tol, "options": options, "complete": False}
    partial = os.path.join(args.out_dir, "summary.partial.json")

    def keep(row):  # a long sweep that is stopped keeps the points it solved
        rows.append(row)
        write_json(partial, summary)

    for i, teacher in enumerate(teachers):
        gate_solves.sweep(teacher, oracle, random_h if i == 0 else [], seeds, fractions, tol,
                          dict(options, progress=args.progress), log=print, on_row=keep)
    gate_solves.plot_gates(rows, summary["teachers"], figure)
    summary.update(complete=True, figures=[figure])
    write_json(os.path.join(args.out_dir, "summary.json"), summary)
    os.remove(partial)
    print(f"wrote {os.path.join(args.out_dir, 'summary.json')} and {figure}")
    return 0
