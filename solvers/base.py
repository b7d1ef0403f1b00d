"""The contract of a solver backend, checked before it runs.

A solver is a class with a ``name``, the ``forms`` it solves (``"primal"``, ``"dual"``), what it
``requires`` of the problem's objects (attribute names per role, as skglm's solvers check their
datafit and penalty), the optional ``packages`` it needs, and the ``options`` it takes.
:meth:`Solver.validate` checks all of that and raises an error naming the argument; then
:meth:`Solver.solve` returns a :class:`~cvxtransformer.core.result.BackendOutput`, which
:func:`cvxtransformer.solve` certifies. A solver never compares a loss or program by name.
"""
import importlib.util

from cvxtransformer.core.errors import InvalidInputError, MissingDependencyError, invalid


class Solver:
    """Base class of the solver backends (see the module docstring). A subclass sets ``name`` and
    defines ``solve(problem, form="primal", tol=1e-6, verbose=False, **options) -> BackendOutput``;
    ``cvxtransformer.solvers.register`` checks them (:data:`~cvxtransformer.core.contracts.SOLVER_FACES`)."""

    name = None
    forms = ("primal",)
    requires = {}  # role ("loss", "regularizer", "program") -> attribute names it must offer
    packages = {}  # importable module -> pip command
    options = ()   # keyword options of :meth:`solve`

    def validate(self, problem, form, options):
        """Raise an error naming the argument if this solver cannot solve ``problem`` in ``form``."""
        if form not in self.forms:
            raise invalid("form", f"one of {self.forms} for solver {self.name!r}", repr(form))
        for module, command in self.packages.items():
            if importlib.util.find_spec(module) is None:
                raise MissingDependencyError(f"solver: {self.name} needs the package {module!r}; {command}")
        self.check_requires(problem, self.requires)
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise invalid(unknown[0], f"an option of solver {self.name!r} ({', '.join(self.options) or 'none'})",
                          repr(options[unknown[0]]), "leave it out or choose another solver")

    def check_requires(self, problem, requires, fix="choose another solver"):
        """Raise an error naming the first face of ``requires`` (role -> attribute names) that the
        problem's loss, regulariser or program lacks."""
        objects = {"loss": problem.loss, "regularizer": problem.regularizer, "program": problem.program}
        for role, attributes in requires.items():
            missing = [a for a in attributes if getattr(objects[role], a, None) is None]
            if missing:
                raise InvalidInputError(
                    f"solver: {self.name!r} cannot solve {problem.program.label} with "
                    f"{type(objects[role]).__name__}: it needs {role}.{missing[0]}; {fix}")

    def __repr__(self):
        return f"{type(self).__name__}()"
