"""The program families by name: what :func:`~.problem.make_problem` builds for ``program=...``.

A family is a program class, the reduction that pairs it with its nonconvex network, the losses it
allows and the options of ``make_problem`` that its builder takes (``U1``, ``U2``, ``H``, ``gates``,
``gate_seed``); the program class builds itself from validated data (``program.build``). Families
register themselves (:func:`register`) where their reductions are defined; the registry imports
those modules, listed by name in :data:`MODULES`, on the first lookup. So ``make_problem`` has no
branch per program and imports no reduction, and a new family is a module that calls
:func:`register`, named in :data:`MODULES`. :func:`register` checks the program class, its
regulariser and the reduction against the contract (:mod:`.contracts`): a missing face is an error
at registration that names it.

Example
-------
>>> family("mhsa").reduction.__name__, family("12").options
('LinearMHSAReduction', ('U1', 'U2', 'gates', 'gate_seed'))
"""
import importlib
from dataclasses import dataclass

from .contracts import PROGRAM_FACES, REDUCTION_FACES, REGULARIZER_FACES, check_faces
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
# the options of make_problem that every family may take (besides its gate arrays)
SHARED_OPTIONS = ("gates", "gate_seed")
_FAMILIES = {}


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


def gate_arrays():
    """Every registered family's gate arrays: name -> what they are (e.g. ``{"U1": "gate vectors", ...}``)."""
    return {k: f.program.gate_array_kinds[k] for f in families().values() for k in f.gate_arrays}


def estimator_names():
    """The names of the estimator classes that the registered families declare (``Family.estimator``)."""
    return [f"{f.estimator[0]}{kind}" for f in families().values() if f.estimator
            for kind in ("Regressor", "Classifier")]


def register(name, program, reduction, losses, options=(), cases=(), estimator=None):
    """Register a family under ``name`` (replacing any family of that name), once its program class,
    the program's regulariser and the reduction offer every face of the contract (:mod:`.contracts`);
    otherwise one error names the missing faces. ``estimator``: ``(prefix, title)`` or ``(prefix, title,
    targets)``, the family's scikit-learn estimators (:class:`Family`)."""
    check_faces(f"register: program of family {name!r}", program, PROGRAM_FACES)
    check_faces(f"register: regularizer of family {name!r}", program.regularizer_class, REGULARIZER_FACES)
    check_faces(f"register: reduction of family {name!r}", reduction, REDUCTION_FACES)
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


def families():
    """Every registered family, by name (the built-in ones included)."""
    for module in MODULES:
        importlib.import_module(module)
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
        raise invalid("program", "one of " + ", ".join(map(repr, known)), repr(name))
    return known[name]
