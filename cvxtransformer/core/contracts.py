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
``n_blocks``. A program class may add faces of its own kind (``extra_faces``, e.g.
:data:`DESIGN_FACES`), checked with the others.

**The torch operator** (what ``Program._make_operator(X, device, chunk)`` returns, on coefficients of the
program's ``canonical_shape``; docs/architecture.md describes each face): :data:`OPERATOR_FACES` on the
class, :data:`OPERATOR_ATTRIBUTES` on the instance, the faces the regulariser's working set calls
(:data:`WORKING_SET_FACES`), and for each fast path an operator offers, the faces it brings along
(:data:`FAST_PATH_FACES`; the Gram paths assume the coefficient layout :data:`GRAM_LAYOUT`, which the
operator must declare as ``coefficient_layout``). :func:`check_operator` checks them all: at
registration on the program's ``operator_class`` (where it declares one: a class or a tuple of them),
and on every operator ``Program.operator`` makes, before any product.
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
# A program defined by its design (core/design.py) gives its design rows; the rest is derived.
DESIGN_FACES = {"the design base (DesignProgram)": ("features",)}

# The torch operator: forward(Z) -> Yhat (N, n_outputs); adjoint(V) -> A^T V (shape); forward_adjoint(Z,
# dual) -> (Yhat, V, A^T V) in one pass, V[s:e] = dual(Yhat[s:e], s, e), used when the data streams;
# streams: whether each product reads the data from outside the device; shape: the coefficients' shape
# (the program's canonical_shape, restricted); N_total: samples of all shards.
OPERATOR_FACES = {"the torch backend and the verifier": ("forward", "adjoint", "forward_adjoint", "streams", "shape",
                                                         "N_total")}
# per instance: N (samples here), shards (None, or those of a distributed solve: A^T V, Gram matrices
# and norms are summed over them), device, dtype (of the coefficients and outputs)
OPERATOR_ATTRIBUTES = ("N", "shards", "device", "dtype")
# what each regulariser's working-set strategy (cvxtransformer.solvers.proxgrad.working_sets) calls
WORKING_SET_FACES = {
    # the blocks (gate j, token k) of Z (h, c, n, d): restrict(J, K) keeps entries J of axis 0 and K of
    # axis 2; block_norms() and block_norm_bounds(): ||A_g|| and an upper bound per (j, k), (|J|, |K|)
    "group_lasso": {"the block working set": ("restrict", "block_norms", "block_norm_bounds")},
    # the gates of Z (P, p, q) (a single matrix is one gate): restrict(J) keeps entries J of axis 0
    "nuclear_norm": {"the gate working set": ("restrict",)},
    # the blocks (gate j, token k) of Z (h, c, n, d), as the group lasso's
    "token_nuclear_norm": {"the token working set": ("restrict", "block_norms", "block_norm_bounds")},
}
# The fast paths, each reached by offering its first face, with the faces it brings along. gram(T) ->
# (H, B): the squared loss from H = A_l^T A_l (F, F), one Gram matrix shared by the outputs, and
# B = A^T T (c, F), F = |J| |K| d; weighted_gram(W) -> (m, F, F): sum_i W[i, m] D_i^T D_i (proximal
# Newton's model); weighted_gram_cost(): its multiply-adds per weight column; sample_norms(): ||D_i||^2
# (N,); cross_gram(other) -> A^T A' (F, F'); materialize(): the op with its data copied contiguous.
FAST_PATH_FACES = {
    "gram": ("gram", "weighted_gram_cost", "restrict", "coefficient_layout"),
    "weighted_gram": ("weighted_gram", "weighted_gram_cost", "sample_norms", "restrict", "coefficient_layout"),
    "cross_gram": ("cross_gram", "gram"),
    "materialize": ("materialize",),
}
FAST_PATH_ATTRIBUTES = {"gram": ("hJ", "nK", "d", "F", "X"), "weighted_gram": ("hJ", "F"), "cross_gram": ("mask",)}
# the coefficient layout the Gram paths assume: (|J|, c, |K|, d), outputs on axis 1, groups on the last axis
GRAM_LAYOUT = ("gate", "output", "token", "feature")

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


def missing_operator_faces(op, regularizer, instance=True):
    """``{consumer: [faces]}`` that the torch operator ``op`` (an instance, or a class with ``instance``
    False: its constructor's attributes are then not checked) lacks: :data:`OPERATOR_FACES`,
    :data:`OPERATOR_ATTRIBUTES`, the working set of ``regularizer`` (a class or its name,
    :data:`WORKING_SET_FACES`), and the faces of each fast path it offers (:data:`FAST_PATH_FACES`),
    a wrong ``coefficient_layout`` counted as missing."""
    name = regularizer if isinstance(regularizer, str) else getattr(regularizer, "name", None)
    needs = dict(OPERATOR_FACES)
    if instance:
        needs["the torch backend and the verifier (per instance)"] = OPERATOR_ATTRIBUTES
    needs.update(WORKING_SET_FACES.get(name, {}))
    for path, faces in FAST_PATH_FACES.items():
        if getattr(op, path, None) is not None:
            needs[f"its fast path {path}"] = faces + (FAST_PATH_ATTRIBUTES.get(path, ()) if instance else ())
    attributes = set(OPERATOR_ATTRIBUTES).union(*FAST_PATH_ATTRIBUTES.values())  # None is a value there (shards)
    missing = {}
    for consumer, faces in needs.items():
        lacks = [f for f in faces if not hasattr(op, f) or (getattr(op, f) is None and f not in attributes)
                 or (f == "coefficient_layout" and tuple(getattr(op, f)) != GRAM_LAYOUT)]
        if lacks:
            missing[consumer] = lacks
    return missing


def check_operator(what, op, regularizer, instance=True):
    """Raise one :class:`~.errors.InvalidInputError` naming every face that the torch operator ``op``
    lacks (:func:`missing_operator_faces`) and who needs it; ``what`` names it (e.g. ``"register:
    operator of family 'x'"``). Returns ``op``."""
    missing = missing_operator_faces(op, regularizer, instance)
    if missing:
        names = list(dict.fromkeys(f for faces in missing.values() for f in faces))
        layout = " (coefficient_layout: the Gram paths assume " + repr(GRAM_LAYOUT) + ")" \
            if "coefficient_layout" in names else ""
        needs = "; ".join(f"{consumer} needs {', '.join(faces)}" for consumer, faces in missing.items())
        cls = op if isinstance(op, type) else type(op)
        raise InvalidInputError(f"{what}: {cls.__name__} lacks {', '.join(names)} ({needs}){layout}; define them "
                                "(docs/architecture.md, the torch operator's faces)")
    return op
