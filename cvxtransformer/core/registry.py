"""The program families by name: what :func:`~.problem.make_problem` builds for ``program=...``.

A family is a program class, the reduction that pairs it with its nonconvex network, the losses it
allows and the options of ``make_problem`` that its builder takes (``U1``, ``U2``, ``H``, ``gates``,
``gate_seed``); the program class builds itself from validated data (``program.build``). Families
register themselves (:func:`register`) where their reductions are defined; the registry imports
those modules, listed by name in :data:`MODULES`, on the first lookup. So ``make_problem`` has no
branch per program and imports no reduction, and a new family is a module that calls
:func:`register`, named in :data:`MODULES`. :func:`register` checks the program class, its
regulariser, the reduction and the torch operator against the contract (:mod:`.contracts`): a missing
face is an error at registration that names it.

A family in a user's installed package reaches everything, the command line included, through an
entry point of the group :data:`ENTRY_POINTS` (``cvxtransformer.families``): each is a callable that
registers families (``[project.entry-points."cvxtransformer.families"]`` ``mine = "mypkg.family:register"``;
name it after the family it registers, as the command line's help lists it by that name). The registry
calls them once, after the built-in modules, on the first lookup; one that fails is one line on stderr
naming it (:data:`ENTRY_POINT_ERRORS`), and the other families are registered as usual.

Example
-------
>>> family("mhsa").reduction.__name__, family("12").options
('LinearMHSAReduction', ('U1', 'U2', 'gates', 'gate_seed'))
"""
import importlib
import sys
from dataclasses import dataclass

from .contracts import PROGRAM_FACES, REDUCTION_FACES, REGULARIZER_FACES, check_faces, check_operator
from .errors import invalid

# importing each module registers the built-in families it names; the names and a line on each are listed
# here too, so that the command line's help lists them without importing the modules (a test checks that
# the modules register exactly these)
MODULES = {
    "cvxtransformer.core.attention": {
        8: "attention-only, scalar output", 10: "attention-only, c outputs",
        12: "attention + gated-ReLU FCN (group lasso)",
        "10wd": "attention-only, c outputs, ordinary weight decay (a nuclear norm per token)",
        "12wd": "attention + gated-ReLU FCN, ordinary weight decay (a nuclear norm per token)"},
    "cvxtransformer.core.mhsa": {"mhsa": "linear multi-head self-attention (nuclear norm)",
                                 "gated_mhsa": "gated-ReLU multi-head self-attention (a nuclear norm per gate)"},
    "cvxtransformer.core.mixer": {"mixer": "gated-ReLU token mixing, the MLP-Mixer layer (a nuclear norm per gate)"},
}
# the gate arrays of each built-in family that has some (its program class's gate_array_kinds, with their shapes),
# listed here for the command line's help too, which imports no family module (a test checks them)
BUILTIN_GATE_ARRAYS = {12: {"U1": "(h, n)", "U2": "(h, d)"}, "12wd": {"U1": "(h, n)", "U2": "(h, d)"},
                       "gated_mhsa": {"H": "(P, d, d)"}, "mixer": {"G": "(P, n)"}}
# the options of make_problem that every family may take (besides its gate arrays)
SHARED_OPTIONS = ("gates", "gate_seed")
ENTRY_POINTS = "cvxtransformer.families"  # the entry-point group of the families of installed packages
ENTRY_POINT_ERRORS = {}  # "name = module:callable" -> the line said when calling it failed
_FAMILIES = {}
_ENTRY_POINTS_CALLED = []  # [True] once the entry points were called
_IMPORTED = set()  # the modules of MODULES that families() imported


@dataclass(frozen=True)
class Family:
    """One program family, under one name.

    - ``name``: the program's name (``8``, ``10``, ``12``, ``"mhsa"``, ``"gated_mhsa"``, ``"mixer"``)
    - ``program``: the :class:`~.programs.Program` subclass; ``program.build(name, X, y, T, **options)``
      makes it from validated data (y raw, T encoded by the loss)
    - ``reduction``: the :class:`~.reductions.Reduction` of its nonconvex network
    - ``losses``: names of the losses it allows
    - ``options``: the options of ``make_problem`` that its builder takes: ``gates``, ``gate_seed`` and gate
      arrays that the program class declares (``program.gate_array_kinds``: name -> description)
    - ``cases``: its standard test cases, ``(loss, target kind)`` pairs (the kinds of
      :func:`cvxtransformer.testing.random_targets`); ``testing.CASES`` is built from them
    - ``estimator``: None, or ``(prefix, title, targets)``: :mod:`cvxtransformer.estimators` then offers
      ``<prefix>Regressor`` and ``<prefix>Classifier`` for this family, documented by ``title`` (a line
      naming the program) and ``targets`` (a line on the targets the regressor takes, or "")
    """

    name: object
    program: type
    reduction: type
    losses: tuple
    options: tuple = ()
    cases: tuple = ()
    estimator: tuple = None

    @property
    def label(self):
        """How the program is named to users: its class's ``label`` where that is fixed, else
        ``"program (name)"``."""
        return self.program.label if isinstance(self.program.label, str) else f"program ({self.name})"

    @property
    def gate_arrays(self):
        """The arrays of ``make_problem`` that fix this program's gates (e.g. ``U1``, ``U2``; none): its
        options that its program class declares in ``gate_array_kinds``."""
        return tuple(k for k in self.options if k in self.program.gate_array_kinds)


def builtin_names():
    """The built-in families' names and a line on each, without importing their modules (for the command
    line's help)."""
    return {name: line for names in MODULES.values() for name, line in names.items()}


def builtin_gate_arrays():
    """The built-in families' gate arrays in a line, e.g. ``"U1 (h, n), U2 (h, d) for --program 12, 12wd; H (P,
    d, d) for gated_mhsa; ..."``, without importing their modules (for the command line's help)."""
    takers = {}  # the arrays (with shapes) -> the families that take them
    for name, arrays in BUILTIN_GATE_ARRAYS.items():
        takers.setdefault(tuple(arrays.items()), []).append(str(name))
    return "; ".join(", ".join(f"{k} {shape}" for k, shape in arrays) + " for --program " + ", ".join(names)
                     for arrays, names in takers.items())


def gate_arrays():
    """Every registered family's gate arrays: name -> what they are (e.g. ``{"U1": "gate vectors", ...}``)."""
    return {k: f.program.gate_array_kinds[k] for f in families().values() for k in f.gate_arrays}


def estimator_names():
    """The names of the estimator classes that the registered families declare (``Family.estimator``)."""
    return [f"{f.estimator[0]}{kind}" for f in families().values() if f.estimator
            for kind in ("Regressor", "Classifier")]


def register(name, program, reduction, losses, options=(), cases=(), estimator=None):
    """Register a family under ``name`` (replacing any family of that name), once its program class,
    the program's regulariser, the reduction and the program's torch operator (its ``operator_class``,
    where it declares one) offer every face of the contract (:mod:`.contracts`); otherwise one error
    names the missing faces. ``estimator``: ``(prefix, title)`` or ``(prefix, title,
    targets)``, the family's scikit-learn estimators (:class:`Family`)."""
    check_faces(f"register: program of family {name!r}", program, {**PROGRAM_FACES, **program.extra_faces})
    check_faces(f"register: regularizer of family {name!r}", program.regularizer_class, REGULARIZER_FACES)
    check_faces(f"register: reduction of family {name!r}", reduction, REDUCTION_FACES)
    operators = program.operator_class
    for cls in operators if isinstance(operators, tuple) else () if operators is None else (operators,):
        check_operator(f"register: operator of family {name!r}", cls, program.regularizer_class, instance=False)
    unknown = [k for k in options if k not in SHARED_OPTIONS and k not in program.gate_array_kinds]
    if unknown:
        raise invalid("options", f"options of make_problem: {', '.join(SHARED_OPTIONS)} or the gate arrays that "
                      f"{program.__name__}.gate_array_kinds declares ({', '.join(program.gate_array_kinds) or 'none'})",
                      ", ".join(unknown), f"declare them in {program.__name__}.gate_array_kinds")
    bad = [case for case in cases if case[0] not in losses]
    if bad:
        raise invalid("cases", f"(loss, target kind) pairs with a loss of {tuple(losses)}", repr(bad[0]))
    if estimator is not None:
        if not (isinstance(estimator, tuple) and len(estimator) in (2, 3) and all(isinstance(e, str) for e in estimator)
                and estimator[0].isidentifier()):
            raise invalid("estimator", "(prefix, title) or (prefix, title, targets): strings, the prefix a class name",
                          repr(estimator))
        estimator = estimator + ("",) * (3 - len(estimator))
    _FAMILIES[name] = Family(name, program, reduction, tuple(losses), tuple(options), tuple(map(tuple, cases)),
                             estimator)


def entry_points():
    """The entry points of the group :data:`ENTRY_POINTS` of the installed distributions (none is
    imported), once each."""
    from importlib.metadata import entry_points as installed

    return list({(ep.name, ep.value): ep for ep in installed(group=ENTRY_POINTS)}.values())


def call_entry_points():
    """Call every entry point of :data:`ENTRY_POINTS` once (the first call does; later ones return at
    once): each registers its families. One that fails is one line on stderr naming it, kept in
    :data:`ENTRY_POINT_ERRORS`; the others and the built-in families are registered as usual."""
    if _ENTRY_POINTS_CALLED:
        return
    _ENTRY_POINTS_CALLED.append(True)
    for ep in entry_points():
        try:
            ep.load()()
        except Exception as exc:  # a user's package: whatever it raises is said in one line
            what = f"{ep.name} = {ep.value}"
            reason = (str(exc).strip().splitlines() or [""])[0]
            ENTRY_POINT_ERRORS[what] = (f"cvxtransformer: the entry point {what!r} ({ENTRY_POINTS}) failed: "
                                        f"{type(exc).__name__}{': ' + reason if reason else ''}; its families are "
                                        "not registered")
            print(ENTRY_POINT_ERRORS[what], file=sys.stderr)


def families():
    """Every registered family, by name: the built-in ones (their modules imported) and those of the
    installed packages' entry points (:func:`call_entry_points`)."""
    if len(_IMPORTED) < len(MODULES):  # (import_module of an imported module still costs a few us a call)
        for module in MODULES:
            importlib.import_module(module)
            _IMPORTED.add(module)
    call_entry_points()
    return dict(_FAMILIES)


def family(name):
    """The family of a program name: an int, a string of digits (``"8"``) or a name; errors name
    the argument ``program``."""
    if isinstance(name, str) and name.strip().isdigit():
        name = int(name)
    known = families()
    try:
        found = not isinstance(name, bool) and name in known
    except TypeError:  # unhashable
        found = False
    if not found:
        failed = "; ".join(line.split(": ", 1)[1] for line in ENTRY_POINT_ERRORS.values())
        raise invalid("program", "one of " + ", ".join(map(repr, known)), repr(name), failed or None)
    return known[name]
