"""The contract of a program family, a loss, a regulariser and a solver: what each consumer uses.

Each table maps a consumer to the names (methods, properties or class attributes) it calls on the
class. :func:`check_faces` checks a class against a table when it is registered
(:func:`~.registry.register` for a family's program, regulariser and reduction,
:func:`~.losses.register_loss` for a loss, ``cvxtransformer.solvers.register`` for a solver), so a
missing face is one error at registration naming it and the consumer that needs it, never an
``AttributeError`` in the middle of a solve. A face is missing when the class lacks it or has it
as ``None`` (the base classes' placeholders). The solvers' ``requires`` are these tables
(:data:`TORCH_BACKEND`, :data:`CVXPY_BUILDERS`), not copies.

A program also has, per instance (set by its constructor, so not checked on the class): ``X``,
``N``, ``shape`` (the one shape of Z), ``canonical_shape`` (the torch operator's), ``n_outputs`` and
``n_blocks``.
"""
from .errors import InvalidInputError

PROGRAM_FACES = {
    "make_problem": ("build", "check_targets", "check_target_shape", "regularizer_class", "label", "gate_arrays",
                     "log_norm"),
    "the verifier and the certificates": ("forward", "adjoint", "check_Z", "check_V", "on", "block_norms"),
    "the torch backend": ("operator", "_make_operator", "block_norms"),
    "the command line": ("support_label",),
    "the CVXPY builders": ("cvxpy_formulations", "design", "cvxpy_variable", "cvxpy_forward", "cvxpy_adjoint",
                           "cvxpy_blocks", "from_cvxpy", "from_blocks"),
}
REDUCTION_FACES = {
    "recover_weights, nonconvex_objective and certify_network": ("check_form", "invert", "coefficients",
                                                                 "objective", "heads"),
    "the reduction of a network (Reduction.apply) and compare": ("apply", "networks", "equations"),
}
LOSS_FACES = {
    "make_problem": ("name", "encode"),
    "the verifier and the certificates": ("value", "dual_variable", "dual_objective", "project_dual_domain",
                                          "strong_concavity", "accuracy", "metrics"),
    "the torch backend": ("value", "dual_variable", "dual_objective", "lipschitz", "strong_concavity",
                          "quadratic"),
    "the CVXPY builders": ("cvxpy_value", "cvxpy_dual"),
}
# Optional: proximal Newton (the torch backend's method for a loss that is not quadratic) needs these;
# a loss without them is registered, and the torch backend refuses it up front unless method="data".
NEWTON_FACES = {"loss": ("hessian", "gradient_metric")}
REGULARIZER_FACES = {
    "make_problem": ("name", "with_beta"),
    "the verifier and the certificates": ("value", "norm", "dual_norm", "kkt_residuals", "support_size",
                                          "screen", "zero_blocks"),
    "the torch backend": ("prox", "value", "dual_norm", "screen"),
    "the CVXPY builders": ("cvxpy_value", "cvxpy_dual_constraint"),
}
SOLVER_FACES = {"cvxtransformer.solve": ("name", "forms", "requires", "packages", "options", "validate", "solve")}

# What each solver backend requires, by role (``Solver.requires``).
TORCH_BACKEND = {"loss": LOSS_FACES["the torch backend"], "regularizer": REGULARIZER_FACES["the torch backend"],
                 "program": PROGRAM_FACES["the torch backend"] + ("canonical_shape",)}
CVXPY_BUILDERS = {"loss": LOSS_FACES["the CVXPY builders"], "regularizer": REGULARIZER_FACES["the CVXPY builders"],
                  "program": PROGRAM_FACES["the CVXPY builders"]}


def missing_faces(cls, faces):
    """The names of ``faces`` (a table above) that ``cls`` lacks or has as None, in the table's order."""
    names = dict.fromkeys(name for needed in faces.values() for name in needed)
    return [name for name in names if getattr(cls, name, None) is None]


def check_faces(what, cls, faces):
    """Raise one :class:`~.errors.InvalidInputError` naming every face of ``faces`` that ``cls`` lacks
    and the consumers that need it; ``what`` names the role (e.g. ``"program of family 'x'"``)."""
    missing = missing_faces(cls, faces)
    if missing:
        needs = "; ".join(f"{consumer} needs {', '.join(n for n in needed if n in missing)}"
                          for consumer, needed in faces.items() if set(needed) & set(missing))
        raise InvalidInputError(f"{what}: {getattr(cls, '__name__', cls)!s} lacks {', '.join(missing)} ({needs}); "
                                "define them (docs/architecture.md lists each face)")
    return cls
