"""Options shared by the commands, with argparse types that check values while parsing (a bad
value is a one-line usage error, exit code 2). Standard library only (and the registry's static list of
the built-in families' names, which imports nothing). ``--program`` also takes the families of installed
packages (the entry points of ``cvxtransformer.families``, :mod:`cvxtransformer.core.registry`): their
names are read when the help is shown or a name that is no built-in one is given, never otherwise."""
import argparse
import math

from ..core.registry import builtin_names

PROGRAM_HELP = "; ".join(f"{name}: {line}" for name, line in builtin_names().items())
PROGRAMS = tuple(map(str, builtin_names()))
LOSS_HELP = ("squared (real targets), logistic (labels in {-1, +1}) or cross_entropy (labels in [0, c)); "
             "summed over samples")


def _number(text, kind):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text):
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def positive_int(text):
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


SEED_MAX = 2**64 - 1  # core.validation.SEED_MAX: the largest seed numpy and torch both take


def seed(text):
    """A random seed as numpy and torch take it: an integer in [0, 2^64 - 1]."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 (a seed), got {text}")
    if value > SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected a seed <= 2^64 - 1 (what numpy and torch take), got {text}")
    return value


TOL_FLOOR = 1e-15  # core.validation.TOL_FLOOR (not imported here: it imports numpy, and --help stays instant)


def tolerance(text):
    """A relative duality gap: 1e-15 <= tol < 1 (float64 resolves no smaller one)."""
    value = _number(text, float)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a relative gap in (0, 1), e.g. 1e-6, got {text}")
    if value < TOL_FLOOR:
        raise argparse.ArgumentTypeError(f"expected a relative gap in [{TOL_FLOOR:g}, 1) (float64 resolves no "
                                         f"smaller one), got {text}; pass 1e-15 or more, or --atol")
    return value


def installed_families():
    """The installed packages' families for the help: the entry points of ``cvxtransformer.families`` in the
    ``entry_points.txt`` of each distribution folder on ``sys.path`` (none imported), that are no built-in
    name: name -> a line on it. Read from the files, not by importlib.metadata, whose import would
    double the help's time; the registry calls them through importlib.metadata."""
    import os
    import sys

    found = {}
    for folder in sys.path:
        try:
            entries = list(os.scandir(folder or "."))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(entry.path, "entry_points.txt"), encoding="utf-8") as f:
                    lines = [line.strip() for line in f]
            except OSError:
                continue
            group = None
            for line in lines:
                if line.startswith("["):
                    group = line.strip("[] ")
                elif group == "cvxtransformer.families" and "=" in line:
                    name, value = (part.strip() for part in line.split("=", 1))
                    if name not in PROGRAMS:
                        package = entry.name.split("-")[0]
                        found.setdefault(name, f"a family of the installed package {package} ({value})")
    return found


class ProgramChoices:
    """``--program``'s metavar: the built-in names, and the installed families' while a help is formatted
    (``shown``, set by the command line's help formatter): a run never looks them up for it."""

    shown = False

    def __str__(self):
        return "{" + ",".join(PROGRAMS + (tuple(installed_families()) if ProgramChoices.shown else ())) + "}"


def program(text):
    """A built-in family's name, or a registered one (the installed packages' families are registered
    when such a name is given: an error lists every family)."""
    if text not in PROGRAMS:
        from ..core.errors import InvalidInputError
        from ..core.registry import family

        if not installed_families():
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(PROGRAMS)}, got {text!r}")
        try:
            family(text)
        except InvalidInputError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None
    return int(text) if text.isdigit() else text


def add_program_argument(p, help):
    """``--program``: its help lists the built-in families, then those of the installed packages."""
    action = p.add_argument("--program", type=program, required=True, metavar=ProgramChoices(), help=help)
    action.more_help = lambda: "".join(f"; {name}: {line}" for name, line in installed_families().items())


def add_problem_arguments(p, program_help=PROGRAM_HELP):
    """--program, --loss, --beta/--beta-frac, --gates, --gate-seed, --classes, --tol, --atol, --json."""
    add_program_argument(p, program_help)
    p.add_argument("--loss", choices=("squared", "logistic", "cross_entropy"), required=True, help=LOSS_HELP)
    beta = p.add_mutually_exclusive_group(required=True)
    beta.add_argument("--beta", type=positive_float, help="regularization weight beta > 0")
    beta.add_argument("--beta-frac", type=positive_float, metavar="F",
                      help="beta = F * beta_max of the data (0 < F < 1 gives a nonzero solution)")
    p.add_argument("--gates", type=positive_int, default=8,
                   help="number of gates sampled for a program with gates when DATA has none of its gate arrays "
                        "(h of program (12), P of the others)")
    p.add_argument("--gate-seed", type=seed, default=0, help="seed of the sampled gates of a program with gates")
    p.add_argument("--classes", type=positive_int, default=None,
                   help="number of classes c, cross-entropy only (default: max(y) + 1)")
    p.add_argument("--tol", type=tolerance, default=1e-6,
                   help="relative duality gap (P - D) / D to certify, in [1e-15, 1); it bounds (P - p*) / p*")
    p.add_argument("--atol", type=positive_float, default=None,
                   help="also certify when the duality gap P - D is <= ATOL (off by default; for data near "
                        "interpolation, where float64 cannot reach --tol relative to a tiny optimum)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def make_problem_from(args, X, y, program=None, tuned=False, **gates):
    """The problem of the parsed options on (X, y); validates option combinations first. Gate arrays by
    name (e.g. from DATA) are passed on to the programs that take them (the others are left out). ``tuned``: every beta
    comes from a grid (``compare --tune``), which sets it on this problem; built at beta = 1 meanwhile."""
    from ..core.errors import InvalidInputError
    from ..core.problem import make_problem
    from ..core.registry import family

    program = args.program if program is None else program
    if args.classes is not None and args.loss != "cross_entropy":
        raise InvalidInputError(f"--classes: only for --loss cross_entropy, got --loss {args.loss}; leave it out")
    taken = family(program).options
    gates = {k: v for k, v in gates.items() if k in taken}
    beta, beta_frac = (1.0, None) if tuned else (args.beta, args.beta_frac)
    return make_problem(X, y, program=program, loss=args.loss, beta=beta, beta_frac=beta_frac,
                        gates=args.gates, gate_seed=args.gate_seed, n_classes=args.classes, **gates)


def encode_labels(y, loss, classes=None, role="y"):
    """Class labels that are not numbers (strings, e.g. ``"a"``, ``"b"``) mapped as the estimators map
    them: the classes sorted, class k -> k for cross_entropy, ``classes[0] -> -1``, ``classes[1] -> +1``
    for logistic. ``classes``: the mapping of the training labels, for another split (or a stored
    RESULT). Returns ``(y, classes)``; numeric labels without ``classes`` come back as they are, with
    ``classes`` None."""
    from ..core.losses import are_class_labels, encode_classes

    if classes is None and not are_class_labels(y):
        return y, None
    return encode_classes(y, loss, classes, role)


def class_mapping(classes, loss):
    """How labels were mapped, e.g. ``"a -> 0, b -> 1"`` (logistic: ``"a -> -1, b -> +1"``)."""
    codes = ["-1", "+1"] if loss == "logistic" else [str(k) for k in range(len(classes))]
    return ", ".join(f"{c} -> {k}" for c, k in zip(classes.tolist(), codes))
