"""Reductions between the nonconvex networks and the convex programs, as CVXPY pairs them:
``apply`` (network and data -> convex problem), ``invert`` (solution Z -> network weights) and
``coefficients`` (network weights -> the Z the network implements, the other direction).

This module holds the generic :class:`Reduction`, :func:`recover_weights` and :func:`nonconvex_objective`.
Each family's reduction lives in its family's module with the ``register`` call that pairs it with its
program (:mod:`.registry`): Proposition 1 of Ergen et al. in :mod:`.attention`, the others in the modules
of :data:`.registry.MODULES`.

``objective`` evaluates the network's weight-decay objective in plain numpy from ``X``, the
weights and the gates, without the convex program's linear map: at the recovered weights it
equals P(Z) (tested), and P(Z*) bounds it from below for any number of heads.

``coefficients(problem, weights)`` is the forward map: the network's output equals the program's
``forward(Z)`` at ``Z = coefficients(problem, weights)``, and its regulariser is at most the
network's penalty, so ``P(Z) <=`` the network's objective; ``coefficients(problem, invert(problem,
Z)) = Z``. :func:`cvxtransformer.certify_network` certifies a network through it.

Example
-------
>>> import numpy as np
>>> from cvxtransformer.core.problem import make_problem
>>> X = np.random.default_rng(0).standard_normal((10, 3, 2))
>>> P = make_problem(X, X[:, 0, :], program=10, beta=0.5)
>>> Z = np.zeros(P.program.shape); Z[1, 2] = [3.0, 4.0]
>>> heads = P.reduction.invert(P, Z)
>>> heads.heads, heads.W1[0].tolist(), bool(np.isclose(P.reduction.objective(P, heads), P.primal_objective(Z)))
(1, [0.0, 0.0, 1.0], True)
>>> bool(np.array_equal(P.reduction.coefficients(P, heads), Z))
True
"""
from .errors import invalid
from .problem import check_problem

# the losses of every built-in family but program (8)
ALL_LOSSES = ("squared", "logistic", "cross_entropy")


class Reduction:
    """A convexification and its inverse: ``apply`` (network and data -> convex problem), ``invert``
    (Z -> the network's weights), ``coefficients`` (weights -> Z), ``objective`` (the network's
    objective at weights, in numpy; ``penalty``, its penalty in words). ``networks`` maps each network this
    reduction covers to its
    convex program; ``equations`` each program to the equation of the network it bounds; ``heads``
    is the dataclass of the network's weights (what ``invert`` returns).

    ``models``: the models that ``compare`` trains against the family's program (plain data, so the
    core imports no network), name -> a dict with ``equation``, ``build`` (``"module:function"``, a
    function ``(problem, heads, sequence, seed) -> network``, imported when called), ``network``
    (``"module:Class"``, the network's class, which :func:`cvxtransformer.nn.networks.build_network` calls as
    ``Class(n, d, c, heads, pooled=..., seed=..., **gate_arrays)``), ``heads`` (how
    the default head counts are chosen: ``"around_rank"``, ``"per_gate_ranks"`` or ``"groups"``, see
    :mod:`cvxtransformer.comparison.models`), ``bounded`` (whether the program's certificate bounds
    it; default True), ``default`` (trained when the user names no models), ``colour`` (matplotlib's)
    and ``note`` (for a model no program bounds); an empty dict joins a model of the comparison
    itself (e.g. ``"softmax"``) to the family's program."""

    forms = ("balanced",)
    networks = {}
    equations = {}
    models = {}
    penalty = "beta/2 times the sum of squares of the network's weights (ordinary weight decay)"  # in words

    @classmethod
    def check_form(cls, form, name="form"):
        """``form`` if this reduction recovers weights in it; errors name the argument (``name``)."""
        if not isinstance(form, str) or form not in cls.forms:
            raise invalid(name, f"one of {cls.forms}", repr(form))
        return form

    @classmethod
    def apply(cls, network, X, y, loss="squared", beta=1.0, **options):
        """The convex program of ``network`` on data (X, y), built by :func:`make_problem`."""
        from .problem import make_problem

        if network not in cls.networks:
            raise invalid("network", f"one of {sorted(cls.networks)}", repr(network))
        return make_problem(X, y, program=cls.networks[network], loss=loss, beta=beta, **options)


def recover_weights(problem, Z, form="balanced"):
    """The nonconvex network's weights behind coefficients Z of ``problem`` (the program's shape):
    the inverse of the family's reduction (e.g. Proposition 1's heads for programs (8)/(10)/(12))."""
    return check_problem(problem).reduction.invert(problem, problem.program.check_Z(Z), form)


def nonconvex_objective(problem, weights):
    """The weight-decay objective of the network with ``weights`` on ``problem``'s data, in numpy."""
    reduction = check_problem(problem).reduction
    reduction.coefficients(problem, weights)  # checks the weights (their type and shapes) by name
    return reduction.objective(problem, weights)
