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
import dataclasses

import numpy as np

from .errors import invalid
from .problem import check_problem
from .registry import families
from .validation import _as_real

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
    def check_heads(cls, problem, heads, what):
        """``heads`` if it is this reduction's :attr:`heads` dataclass in a form it recovers, else an error
        naming the weights; ``what`` says what they are (e.g. ``"(W1, W2), the heads of network (5),"``)."""
        if not isinstance(heads, cls.heads):
            raise invalid("weights", f"{cls.heads.__name__} {what} for {problem.program.label}", type(heads).__name__)
        cls.check_form(heads.form, "weights.form")
        return heads

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


def heads_of(weights, name="weights"):
    """``weights`` as the heads of a registered family with every array field a CPU ndarray, or None when
    ``weights`` is neither heads nor a dict.

    ``weights``: any registered family's heads (its reduction's ``heads`` dataclass) or a dict of their
    fields (the family whose required fields are its keys, and no other keys). Each array field may be
    an ndarray, a torch tensor (on any device, requiring grad or not: taken by value, detached, moved to
    the CPU) or an array-like (nested lists); real values become float64 (float32, float16 and bfloat16
    values are exact in it) and integers (gate indices) int64, so that every family computes in float64.
    Strings (``form``) and None are kept. Anything else is refused naming the field, e.g.
    ``weights.W1: expected a numeric array of the heads' values, got booleans``."""
    kinds = tuple(dict.fromkeys(f.reduction.heads for f in families().values()))  # each family's heads
    if isinstance(weights, dict):
        weights = _from_dict(weights, kinds, name)
    if not isinstance(weights, kinds):
        return None
    fields = {}
    for field in dataclasses.fields(weights):
        value = getattr(weights, field.name)
        if value is field.default or isinstance(field.default, str):  # gate=None; form (checked by the family)
            continue
        if value is None:
            raise invalid(f"{name}.{field.name}", "an array of the heads' values", "None")
        a = _as_real(f"{name}.{field.name}", value, "the heads' values")
        fields[field.name] = a.astype(np.int64 if a.dtype.kind in "iu" else np.float64)
    return dataclasses.replace(weights, **fields)


def _from_dict(weights, kinds, name):
    """The heads of the family whose required fields are the dict's keys (and no other keys)."""
    keys = set(weights)
    fields = {kind: [(f.name, f.default is dataclasses.MISSING) for f in dataclasses.fields(kind)] for kind in kinds}
    for kind, named in fields.items():
        if {n for n, required in named if required} <= keys <= {n for n, _ in named}:
            return kind(**weights)
    raise invalid(name, "a dict with " + ", or ".join(
        ", ".join(n if required else f"({n})" for n, required in named) + f" ({kind.__name__})"
        for kind, named in fields.items()), f"keys {sorted(map(str, keys))}")


def nonconvex_objective(problem, weights):
    """The weight-decay objective of the network with ``weights`` on ``problem``'s data, in float64 numpy:
    ``weights`` as :func:`heads_of` takes them (heads or a dict of their fields; tensors, float32 values
    and lists included). Where the family projects weights onto its constraint set within rounding
    (attention rows of (9)/(11), :meth:`~.attention.Proposition1.coefficients`), the objective is that
    of the projected weights, the network :func:`cvxtransformer.certify_network` certifies."""
    reduction = check_problem(problem).reduction
    heads = heads_of(weights)
    if heads is None:
        heads = weights  # not heads: the family's coefficients refuses it by name
    reduction.coefficients(problem, heads)  # checks the weights (their type and shapes) by name
    return float(reduction.objective(problem, heads))


# ---- what the families of heads (or units) with weight decay share (generic: no family is named here)

class Heads:
    """Base of a reduction's heads dataclass: :attr:`heads` counts the rows of its first field."""

    @property
    def heads(self):
        return len(getattr(self, dataclasses.fields(self)[0].name))


def checked_weights(label, arrays, shapes):
    """The weight arrays ``arrays`` (name -> array) as finite float arrays of ``shapes`` (one per array,
    -1 for the number m of heads, the first axis of the first array); errors name the weights and say
    which program (``label``) wants them."""
    names, arrays = list(arrays), [np.asarray(a) for a in arrays.values()]
    m = arrays[0].shape[0] if arrays[0].ndim == len(shapes[0]) else -1
    if any(a.shape != tuple(m if k == -1 else k for k in shape) for a, shape in zip(arrays, shapes)):
        wanted = " and ".join("(" + ", ".join("m" if k == -1 else str(k) for k in shape) + ")" for shape in shapes)
        raise invalid("weights", f"{', '.join(names)} of shapes {wanted} for {label}",
                      " and ".join(str(a.shape) for a in arrays))
    arrays = [a.astype(float) for a in arrays]
    if not all(np.all(np.isfinite(a)) for a in arrays):
        raise invalid("weights", "finite values", "NaN/Inf entries")
    return arrays


def checked_gate(gate, m, gates, what, name="weights.gate"):
    """Each of the m heads' gate as an integer array (m,) of indices in [0, gates); errors name the
    argument ``name`` (``what``: what a gate indexes, e.g. "one gate of H per head")."""
    gate = np.asarray(gate)
    if gate.shape != (m,) or (m and (gate.dtype.kind not in "iu" or gate.min() < 0 or gate.max() >= gates)):
        raise invalid(name, f"{m} integers in [0, {gates}) ({what})", f"shape {gate.shape}, dtype {gate.dtype}")
    return gate


def weight_decay_objective(problem, Yhat, heads, names):
    """``sum_i L(Yhat_i, Y_i) + beta/2 sum_k ||heads.k||^2`` over the weights ``names`` of ``heads``
    (balanced form): a network's objective from its outputs."""
    Reduction.check_form(heads.form, "weights.form")
    penalty = 0.5 * problem.beta * float(sum(np.sum(np.square(getattr(heads, k))) for k in names))
    return problem.loss.value(Yhat, problem.T) + penalty


def by_chunks(X, outputs, width, chunk):
    """``outputs(Xc)`` of every chunk ``Xc`` of ``chunk`` samples of X (float64; a memory map is read
    chunk by chunk), stacked: (N, width)."""
    out = np.empty((len(X), width))
    for s in range(0, len(X), chunk):
        out[s:s + chunk] = outputs(np.asarray(X[s:s + chunk], dtype=float))
    return out


def gated_models(module, gated, relu, note):
    """compare's models (:attr:`Reduction.models`) of a family of heads on fixed gates: the gated network,
    bounded by the program (its heads placed by the ranks of the gates), and the same heads with a real
    ReLU, whose gates move with the weights (not bounded; ``note`` says what its comparison means).
    ``gated``, ``relu``: (model name, equation, builder, network class), both in ``module``."""
    def row(name, equation, build, network, **more):
        return {name: dict(equation=equation, build=f"{module}:{build}", network=f"{module}:{network}", default=True,
                           **more)}

    return {**row(*gated, heads="per_gate_ranks", colour="tab:blue"),
            **row(*relu, heads="around_rank", bounded=False, colour="tab:brown", note=note)}
