"""Reductions between the nonconvex networks and the convex programs, as CVXPY pairs them:
``apply`` (network and data -> convex problem), ``invert`` (solution Z -> network weights) and
``coefficients`` (network weights -> the Z the network implements, the other direction).

* :class:`Proposition1` (Ergen et al.): the alternative attention network (6)/(9) <-> program (8)
  or (10), the gated-ReLU network (11) <-> program (12). Every nonzero group ``z = Z[j, l, k]``
  becomes one head with attention row ``w_1 = e_k`` (a vertex of the simplex), value vector
  ``w_2`` and output vector ``w_3``: balanced form ``w_2 = z / sqrt(||z||)``,
  ``w_3 = sqrt(||z||) e_l`` (penalty ``beta/2 (||w_2||^2 + ||w_3||_1^2)``), or Lemma-1 form
  ``w_2 = z / ||z||``, ``w_3 = ||z|| e_l`` (penalty ``beta ||w_3||_1``).

This module holds the generic :class:`Reduction`, :func:`recover_weights` and :func:`nonconvex_objective`,
and registers the attention family (:mod:`.registry`): each program with its reduction, the losses it
allows and the options of ``make_problem`` it takes. Every other family's reduction lives in its own
module (e.g. :mod:`cvxtransformer.core.mixer`), which registers it.

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
from dataclasses import dataclass

import numpy as np

from .errors import invalid
from .problem import check_problem
from .programs import AttentionProgram
from .registry import register


@dataclass
class AttentionHeads:
    """Heads of the network (6)/(9)/(11).

    W1 : ndarray of shape (m, n), attention rows on the simplex
    W2 : ndarray of shape (m, d), value vectors
    W3 : ndarray of shape (m, c), output vectors
    gate : ndarray of shape (m,) of ints indexing rows of U1, U2 (network (11)); None otherwise
    form : "balanced" or "lemma1", which penalty the weights are scaled for
    """

    W1: np.ndarray
    W2: np.ndarray
    W3: np.ndarray
    gate: np.ndarray = None
    form: str = "balanced"

    @property
    def heads(self):
        return self.W1.shape[0]


class Reduction:
    """A convexification and its inverse: ``apply`` (network and data -> convex problem), ``invert``
    (Z -> the network's weights), ``coefficients`` (weights -> Z), ``objective`` (the network's
    objective at weights, in numpy). ``networks`` maps each network this reduction covers to its
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


def _bilinear(W1, X, W2, chunk=256):
    """``w_1j^T X_i w_2j`` of shape (N, m) for rows ``W1`` (m, n), ``W2`` (m, d) and ``X`` (N, n, d): BLAS
    products over chunks of heads (a three-operand ``np.einsum`` loops in C, far slower for many heads)."""
    out = np.empty((X.shape[0], W1.shape[0]))
    for s in range(0, W1.shape[0], chunk):
        T = np.tensordot(X, W2[s:s + chunk], axes=([2], [1]))  # (N, n, rows)
        out[:, s:s + chunk] = np.einsum("ikj,jk->ij", T, W1[s:s + chunk])
    return out


class Proposition1(Reduction):
    """Proposition 1 of Ergen et al.: networks (6)/(9) and (11) <-> programs (10) (or (8)) and (12)."""
    heads = AttentionHeads

    forms = ("balanced", "lemma1")
    networks = {"alternative": 10, "alternative_scalar": 8, "gated": 12}
    equations = {8: "(9)", 10: "(9)", 12: "(11)"}

    @staticmethod
    def coefficients(problem, weights):
        """Coefficients Z (the program's shape) that the network (9) (programs (8)/(10)) or (11)
        (program (12), on the program's gates) with heads ``weights`` implements:

        ``Z[g, l, k] = sum_{j: gate(j) = g} w_3j[l] w_1j[k] w_2j``

        The network's output is the program's ``forward(Z)``; with the attention rows ``w_1j`` on the
        simplex, ``||Z[g, l, k]||`` summed is at most ``sum_j ||w_2j|| ||w_3j||_1``, so P(Z) is at
        most the network's objective in either form (checked here: rows off the simplex are refused).
        """
        program = problem.program
        if not isinstance(weights, AttentionHeads):
            raise invalid("weights", f"AttentionHeads (W1, W2, W3), the heads of network (9)/(11), for {program.label}",
                          type(weights).__name__)
        Proposition1.check_form(weights.form, "weights.form")
        h, c, n, d = program.canonical_shape
        W1, W2, W3 = (np.asarray(a, dtype=float) for a in (weights.W1, weights.W2, weights.W3))
        m = W1.shape[0] if W1.ndim == 2 else -1
        if W1.shape != (m, n) or W2.shape != (m, d) or W3.shape != (m, c):
            raise invalid("weights", f"W1, W2, W3 of shapes (m, {n}), (m, {d}), (m, {c}) for {program.label}",
                          f"{W1.shape}, {W2.shape}, {W3.shape}")
        for name, W in (("W1", W1), ("W2", W2), ("W3", W3)):
            if not np.all(np.isfinite(W)):
                raise invalid(f"weights.{name}", "finite values", "NaN/Inf entries")
        if m and (W1.min() < -1e-12 or np.max(np.abs(W1.sum(axis=1) - 1.0)) > 1e-9):
            raise invalid("weights.W1", "attention rows on the simplex (nonnegative, summing to 1)",
                          f"min {W1.min():.3g}, row sums off by {np.max(np.abs(W1.sum(axis=1) - 1)):.3g}",
                          "only such networks are bounded by the program; parametrise each row as a softmax "
                          "of logits, or project it onto the simplex")
        gate = weights.gate
        if (gate is None) != (program.mask is None):
            raise invalid("weights.gate", "each head's gate (network (11)) for program (12), and none for "
                          "(8)/(10)", "None" if gate is None else "gates",
                          "network (9) is bounded by program (10), network (11) by program (12) on its gates")
        gate = np.zeros(m, dtype=int) if gate is None else np.asarray(gate)
        if gate.shape != (m,) or (m and (gate.dtype.kind not in "iu" or gate.min() < 0 or gate.max() >= h)):
            raise invalid("weights.gate", f"{m} integers in [0, {h}) (rows of the program's U1, U2)",
                          f"shape {gate.shape}, dtype {gate.dtype}")
        return Proposition1.sum_heads(W1, W2, W3, gate, h).reshape(program.shape)

    @staticmethod
    def sum_heads(W1, W2, W3, gate, h):
        """``Z[g, l, k] = sum_{j: gate(j) = g} w_3j[l] w_1j[k] w_2j`` of shape (h, c, n, d), unchecked:
        the one implementation behind :meth:`coefficients` and the networks' ``effective_coefficients``."""
        Z = np.zeros((h, W3.shape[1], W1.shape[1], W2.shape[1]))
        for g in range(h):  # one (c, d) product per gate and token: memory of Z plus one head block
            on = gate == g
            for k in range(W1.shape[1]):
                rows = on & (W1[:, k] != 0)  # attention rows are often vertices of the simplex
                Z[g, :, k] = W3[rows].T @ (W1[rows, k, None] * W2[rows])
        return Z

    @staticmethod
    def invert(problem, Z, form="balanced"):
        """The heads of Proposition 1 from coefficients Z (the program's shape)."""
        Proposition1.check_form(form)
        program = problem.program
        Z4 = np.asarray(Z, dtype=float).reshape(program.canonical_shape)
        h, c, n, d = Z4.shape
        norms = np.linalg.norm(Z4, axis=-1)
        j, l, k = np.nonzero(norms)
        z, r = Z4[j, l, k], norms[j, l, k]
        scale = np.sqrt(r) if form == "balanced" else r
        return AttentionHeads(W1=np.eye(n)[k], W2=z / scale[:, None], W3=np.eye(c)[l] * scale[:, None],
                              gate=j if program.mask is not None else None, form=form)

    @staticmethod
    def objective(problem, weights):
        """Objective (6)/(9) (or (11) with gates) of a network with the given heads.

        ``sum_i L(sum_j g_ij (w_1j^T X_i w_2j) w_3j, y_i) + penalty``, with ``g_ij = 1`` for (6)/(9)
        and ``g_ij = 1[u_1,gate(j)^T X_i u_2,gate(j) >= 0]`` for (11). The penalty of the balanced form
        is ``beta/2 sum_j (||w_2j||^2 + ||w_3j||_1^2)``. Lemma 1's penalty ``beta ||w_3j||_1`` holds for
        unit value vectors; other heads are first normalised (``w_2j / ||w_2j||``, ``w_3j ||w_2j||``:
        the same outputs, the smallest penalty the form allows), so it is ``beta sum_j ||w_2j|| ||w_3j||_1``.
        """
        Proposition1.check_form(weights.form, "weights.form")
        program, beta = problem.program, problem.beta
        Yhat = np.empty((program.N, weights.W3.shape[1]))
        step = max(1, 2**20 // max(1, program.X[:1].size + weights.W1.shape[0]))  # X may be a memory map
        for s in range(0, program.N, step):
            X = np.asarray(program.X[s:s + step], dtype=float)
            scores = _bilinear(weights.W1, X, weights.W2)
            if weights.gate is not None:
                U1, U2 = program.U1[weights.gate], program.U2[weights.gate]
                scores *= _bilinear(U1, X, U2) >= 0
            Yhat[s:s + step] = scores @ weights.W3
        if weights.form == "balanced":
            penalty = 0.5 * beta * float(np.sum(weights.W2 ** 2) + np.sum(np.abs(weights.W3).sum(axis=1) ** 2))
        else:
            penalty = beta * float(np.linalg.norm(weights.W2, axis=1) @ np.abs(weights.W3).sum(axis=1))
        return problem.loss.value(Yhat, problem.T) + penalty


def recover_weights(problem, Z, form="balanced"):
    """The nonconvex network's weights behind coefficients Z of ``problem`` (the program's shape):
    the inverse of the family's reduction (e.g. Proposition 1's heads for programs (8)/(10)/(12))."""
    return check_problem(problem).reduction.invert(problem, problem.program.check_Z(Z), form)


def nonconvex_objective(problem, weights):
    """The weight-decay objective of the network with ``weights`` on ``problem``'s data, in numpy."""
    reduction = check_problem(problem).reduction
    reduction.coefficients(problem, weights)  # checks the weights (their type and shapes) by name
    return reduction.objective(problem, weights)


ALL_LOSSES = ("squared", "logistic", "cross_entropy")
# cases: the (loss, target kind) pairs of cvxtransformer.testing.CASES
register(8, AttentionProgram, Proposition1, ("squared", "logistic"),
         cases=(("squared", "scalar"), ("logistic", "binary")))
register(10, AttentionProgram, Proposition1, ALL_LOSSES,
         cases=(("squared", "vector"), ("squared", "sequence"), ("cross_entropy", "classes"), ("logistic", "binary")))
register(12, AttentionProgram, Proposition1, ALL_LOSSES, ("U1", "U2", "gates", "gate_seed"),
         cases=(("squared", "vector"), ("cross_entropy", "classes"), ("logistic", "binary")))
