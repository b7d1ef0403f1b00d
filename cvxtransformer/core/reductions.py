"""Reductions between the nonconvex networks and the convex programs, as CVXPY pairs them:
``apply`` (network and data -> convex problem), ``invert`` (solution Z -> network weights) and
``coefficients`` (network weights -> the Z the network implements, the other direction).

* :class:`Proposition1` (Ergen et al.): the alternative attention network (6)/(9) <-> program (8)
  or (10), the gated-ReLU network (11) <-> program (12). Every nonzero group ``z = Z[j, l, k]``
  becomes one head with attention row ``w_1 = e_k`` (a vertex of the simplex), value vector
  ``w_2`` and output vector ``w_3``: balanced form ``w_2 = z / sqrt(||z||)``,
  ``w_3 = sqrt(||z||) e_l`` (penalty ``beta/2 (||w_2||^2 + ||w_3||_1^2)``), or Lemma-1 form
  ``w_2 = z / ||z||``, ``w_3 = ||z|| e_l`` (penalty ``beta ||w_3||_1``).
* :class:`LinearMHSAReduction` (Sahiner et al.): the linear multi-head self-attention network (5)
  <-> program (6). From the SVD ``Z = sum_j s_j u_j v_j^T``, head j is
  ``W1j[a, k] = sqrt(s_j) u_j[k*d + a]``, ``W2j[l, b] = sqrt(s_j) v_j[l*c + b]``.
* :class:`GatedMHSAReduction` (Sahiner et al.): the gated-ReLU multi-head self-attention network
  ``sum_j (D_g(j)(X) * (X W1j X^T)) X W2j`` <-> the gated program: the heads of each ``Z_g``, as
  above, on gate g.

This module also registers the program families (:mod:`.registry`): each program with its
reduction, the losses it allows and the options of ``make_problem`` it takes.

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
from .gated_mhsa import GatedMHSAProgram, attention_masks
from .mhsa import LinearMHSAProgram
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


@dataclass
class MHSAHeads:
    """Heads of the linear multi-head self-attention network (5).

    W1 : ndarray of shape (m, d, d); W2 : ndarray of shape (m, d, c).
    ``f(X_i) = sum_j X_i W1j X_i^T X_i W2j`` (n x c), mean-pooled over tokens for one target per sequence.
    """

    W1: np.ndarray
    W2: np.ndarray
    form: str = "balanced"

    @property
    def heads(self):
        return self.W1.shape[0]


@dataclass
class GatedMHSAHeads:
    """Heads of the gated-ReLU multi-head self-attention network.

    W1 : ndarray of shape (m, d, d); W2 : ndarray of shape (m, d, c); gate : ndarray (m,) of ints,
    each head's gate (an index into the program's ``H``).
    ``f(X_i) = sum_j (D_gate(j)(X_i) * (X_i W1j X_i^T)) X_i W2j`` (n x c), mean-pooled over tokens for
    one target per sequence.
    """

    W1: np.ndarray
    W2: np.ndarray
    gate: np.ndarray
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
    function ``(problem, heads, sequence, seed) -> network``, imported when called), ``heads`` (how
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


class LinearMHSAReduction(Reduction):
    """Sahiner et al.'s theorem: the linear MHSA network (5) <-> program (6)."""
    heads = MHSAHeads

    networks = {"linear_mhsa": "mhsa"}
    equations = {"mhsa": "(5)"}
    models = {"linear_mhsa": dict(equation="(5)", build="cvxtransformer.nn.networks:linear_mhsa_model",
                                  heads="around_rank", default=True, colour="tab:blue"),
              "softmax": {}}

    @staticmethod
    def coefficients(problem, heads):
        """The coefficients Z (d^2, d c) of program (6) that network (5) with ``heads`` implements:
        ``Z[(k,a), (l,b)] = sum_j W1j[a, k] W2j[l, b]``, i.e. ``Z = sum_j u_j v_j^T`` with
        ``u_j[k*d + a] = W1j[a, k]``, ``v_j[l*c + b] = W2j[l, b]``. The network's output is the program's
        ``forward(Z)`` and ``beta ||Z||_* <= beta sum_j ||W1j|| ||W2j|| <=`` its penalty."""
        p = problem.program
        if not isinstance(heads, MHSAHeads):
            raise invalid("weights", f"MHSAHeads (W1, W2), the heads of network (5), for {p.label}", type(heads).__name__)
        LinearMHSAReduction.check_form(heads.form, "weights.form")
        W1, W2 = _mhsa_weights(p, heads)
        return LinearMHSAReduction.sum_heads(W1, W2)

    @staticmethod
    def sum_heads(W1, W2):
        """``Z[(k,a), (l,b)] = sum_j W1j[a, k] W2j[l, b]`` of shape (d^2, d c), unchecked: the one-gate
        case of :meth:`GatedMHSAReduction.sum_heads` (behind ``LinearMHSA.effective_coefficients``)."""
        return GatedMHSAReduction.sum_heads(W1, W2, np.zeros(len(W1), dtype=int), 1)[0]

    @staticmethod
    def invert(problem, Z, form="balanced"):
        """``m = rank(Z)`` heads (W1j, W2j) from the SVD of Z, balanced: ``beta/2 (||W1j||^2 + ||W2j||^2) = beta s_j``."""
        LinearMHSAReduction.check_form(form)
        p = problem.program
        return MHSAHeads(*_svd_heads(Z, problem.regularizer.rank(Z), p.d, p.c))

    @staticmethod
    def predict(X, heads, pooled, chunk=4096):
        """Outputs of network (5): (N, n*c) per token, or (N, c) mean-pooled; in float64, by chunks of
        samples (``X`` may be a memory map larger than memory)."""
        N, n, _ = X.shape
        c = heads.W2.shape[2]
        out = np.empty((N, c) if pooled else (N, n * c))
        for s in range(0, N, chunk):
            Xc = np.asarray(X[s:s + chunk], dtype=float)
            G = np.einsum("ita,itb->iab", Xc, Xc)
            Y = np.einsum("ita,jak,ikb,jbc->itc", Xc, heads.W1, G, heads.W2, optimize=True)
            out[s:s + chunk] = Y.mean(axis=1) if pooled else Y.reshape(len(Xc), n * c)
        return out

    @staticmethod
    def objective(problem, heads):
        """``sum_i L(sum_j X_i W1j X_i^T X_i W2j, Y_i) + beta/2 sum_j (||W1j||_F^2 + ||W2j||_F^2)``."""
        p = problem.program
        return _weight_decay_objective(problem, LinearMHSAReduction.predict(p.X, heads, p.pooled), heads)


def _mhsa_weights(program, heads):
    """``(W1 (m, d, d), W2 (m, d, c))`` of MHSA heads as finite float arrays of the program's d and c;
    errors name the weights."""
    p = program
    W1, W2 = np.asarray(heads.W1), np.asarray(heads.W2)
    m = W1.shape[0] if W1.ndim == 3 else -1
    if W1.shape != (m, p.d, p.d) or W2.shape != (m, p.d, p.c):
        raise invalid("weights", f"W1, W2 of shapes (m, {p.d}, {p.d}) and (m, {p.d}, {p.c}) for {p.label}",
                      f"{W1.shape} and {W2.shape}")
    W1, W2 = W1.astype(float), W2.astype(float)
    if not (np.all(np.isfinite(W1)) and np.all(np.isfinite(W2))):
        raise invalid("weights", "finite values", "NaN/Inf entries")
    return W1, W2


def _weight_decay_objective(problem, Yhat, heads):
    """``sum_i L(Yhat_i, Y_i) + beta/2 sum_j (||W1j||_F^2 + ||W2j||_F^2)`` of MHSA heads (balanced: their one form)."""
    Reduction.check_form(heads.form, "weights.form")
    penalty = 0.5 * problem.beta * float(np.sum(heads.W1 ** 2) + np.sum(heads.W2 ** 2))
    return problem.loss.value(Yhat, problem.T) + penalty


def _svd_heads(Z, m, d, c):
    """The heads ``(W1 (m, d, d), W2 (m, d, c))`` of the m largest singular triplets of Z (d^2, dc):
    ``W1j[a, k] = sqrt(s_j) u_j[k*d + a]``, ``W2j[l, b] = sqrt(s_j) v_j[l*c + b]``."""
    U, s, Wh = np.linalg.svd(np.asarray(Z, dtype=float), full_matrices=False)
    root = np.sqrt(s[:m])
    W1 = (U[:, :m] * root).T.reshape(m, d, d).transpose(0, 2, 1)  # W1j[a, k] = u_j[k*d + a]
    W2 = (Wh[:m] * root[:, None]).reshape(m, d, c)                # W2j[l, b] = v_j[l*c + b]
    return W1, W2


class GatedMHSAReduction(Reduction):
    """Sahiner et al.'s gated-ReLU theorem: the gated MHSA network <-> the gated program, gate by gate.

    For any heads, ``Z_g = sum_{j: gate(j) = g} u_j v_j^T`` (:meth:`coefficients`) gives the same outputs
    and ``||Z_g||_* <= sum_j ||W1j|| ||W2j|| <= sum_j (||W1j||^2 + ||W2j||^2) / 2``; the SVD of each
    ``Z_g`` gives heads that attain it (:meth:`invert`). So P(Z*) is the optimum of the network with
    these gates once each gate g holds ``rank(Z*_g)`` heads (``sum_g rank(Z*_g)`` in all), and a lower
    bound for any number of heads.
    """
    heads = GatedMHSAHeads

    networks = {"gated_mhsa": "gated_mhsa"}
    equations = {"gated_mhsa": "(gated MHSA)"}
    models = {
        "gated_mhsa": dict(equation="(gated MHSA)", build="cvxtransformer.nn.networks:gated_mhsa_model",
                           heads="per_gate_ranks", default=True, colour="tab:blue"),
        "relu_mhsa": dict(equation="(ReLU MHSA)", build="cvxtransformer.nn.networks:relu_mhsa_model",
                          heads="around_rank", bounded=False, default=True, colour="tab:brown",
                          note="the ReLU network has the gated network's heads and weight decay, but masks that "
                               "move with W1: the gated program's optimum is no bound for it, and objective - "
                               "convex optimum < 0 means it does better than any network on these fixed gates"),
    }

    @staticmethod
    def invert(problem, Z, form="balanced"):
        """``rank(Z_g)`` heads on each gate g from the SVD of ``Z_g``, balanced as for program (6)."""
        GatedMHSAReduction.check_form(form)
        p = problem.program
        Z = np.asarray(Z, dtype=float)
        ranks = problem.regularizer.ranks(Z)
        heads = [_svd_heads(Z[g], int(r), p.d, p.c) for g, r in enumerate(ranks)]
        return GatedMHSAHeads(W1=np.concatenate([h[0] for h in heads]), W2=np.concatenate([h[1] for h in heads]),
                              gate=np.repeat(np.arange(len(ranks)), ranks))

    @staticmethod
    def coefficients(problem, heads):
        """The coefficients Z (P, d^2, d c) that the network with ``heads`` implements on the program's
        gates: ``Z_g[(k,a), (l,b)] = sum_{j: gate(j) = g} W1j[a, k] W2j[l, b]``. The network's output is
        the program's ``forward(Z)`` and ``beta sum_g ||Z_g||_* <=`` its penalty."""
        p = problem.program
        if not isinstance(heads, GatedMHSAHeads):
            raise invalid("weights", f"GatedMHSAHeads (W1, W2, gate), the heads of the gated MHSA network, for "
                          f"{p.label}", type(heads).__name__)
        GatedMHSAReduction.check_form(heads.form, "weights.form")
        W1, W2 = _mhsa_weights(p, heads)
        m, gate = len(W1), np.asarray(heads.gate)
        if gate.shape != (m,) or (m and (gate.dtype.kind not in "iu" or gate.min() < 0 or gate.max() >= p.gates)):
            raise invalid("weights.gate", f"{m} integers in [0, {p.gates}) (one gate of H per head)",
                          f"shape {gate.shape}, dtype {gate.dtype}")
        return GatedMHSAReduction.sum_heads(W1, W2, gate, p.gates)

    @staticmethod
    def sum_heads(W1, W2, gate, gates):
        """``Z_g[(k,a), (l,b)] = sum_{j: gate(j) = g} W1j[a, k] W2j[l, b]`` of shape (gates, d^2, d c),
        unchecked: the one implementation behind :meth:`coefficients` and ``GatedMHSA.effective_coefficients``."""
        m, d, c = W2.shape
        A, B = W1.transpose(0, 2, 1).reshape(m, d * d), W2.reshape(m, d * c)  # rows vec(W1j^T), vec(W2j)
        Z = np.zeros((gates, d * d, d * c))
        for g in range(gates):  # a sum of outer products as one product: no (m, d^2, d c) array
            on = gate == g
            Z[g] = A[on].T @ B[on]
        return Z

    @staticmethod
    def predict(X, heads, H, pooled, chunk=1024):
        """Outputs of the gated network, ``sum_j (D_gate(j)(X_i) * (X_i W1j X_i^T)) X_i W2j``: (N, n*c) per
        token, or (N, c) mean-pooled; float64, by chunks of samples (``X`` may be a memory map)."""
        N, n, _ = X.shape
        c = heads.W2.shape[2]
        out = np.empty((N, c) if pooled else (N, n * c))
        for s in range(0, N, chunk):
            Xc = np.asarray(X[s:s + chunk], dtype=float)
            D = attention_masks(Xc, H)[:, :, heads.gate, :]                        # (r, t, j, s)
            scores = np.einsum("ita,jak,isk->itjs", Xc, heads.W1, Xc, optimize=True) * D
            Y = np.einsum("itjs,isl,jlb->itb", scores, Xc, heads.W2, optimize=True)
            out[s:s + chunk] = Y.mean(axis=1) if pooled else Y.reshape(len(Xc), n * c)
        return out

    @staticmethod
    def objective(problem, heads):
        """``sum_i L(f(X_i), Y_i) + beta/2 sum_j (||W1j||_F^2 + ||W2j||_F^2)`` with the program's gates."""
        p = problem.program
        return _weight_decay_objective(problem, GatedMHSAReduction.predict(p.X, heads, p.H, p.pooled), heads)


def recover_weights(problem, Z, form="balanced"):
    """The nonconvex network's weights behind coefficients Z of ``problem`` (the program's shape):
    Proposition 1's heads for programs (8)/(10)/(12), Sahiner et al.'s for program (6) and the gated
    program."""
    return check_problem(problem).reduction.invert(problem, problem.program.check_Z(Z), form)


def nonconvex_objective(problem, weights):
    """The weight-decay objective of the network with ``weights`` on ``problem``'s data, in numpy."""
    reduction = check_problem(problem).reduction
    reduction.coefficients(problem, weights)  # checks the weights (their type and shapes) by name
    return reduction.objective(problem, weights)


ALL_LOSSES = ("squared", "logistic", "cross_entropy")
# cases: the (loss, target kind) pairs of cvxtransformer.testing.CASES (for "gated_mhsa" each loss once, to keep
# the grids fast: its pooled squared case is in tests/test_gated_mhsa.py)
register(8, AttentionProgram, Proposition1, ("squared", "logistic"),
         cases=(("squared", "scalar"), ("logistic", "binary")))
register(10, AttentionProgram, Proposition1, ALL_LOSSES,
         cases=(("squared", "vector"), ("squared", "sequence"), ("cross_entropy", "classes"), ("logistic", "binary")))
register(12, AttentionProgram, Proposition1, ALL_LOSSES, ("U1", "U2", "gates", "gate_seed"),
         cases=(("squared", "vector"), ("cross_entropy", "classes"), ("logistic", "binary")))
register("mhsa", LinearMHSAProgram, LinearMHSAReduction, ALL_LOSSES,
         cases=(("squared", "sequence"), ("squared", "vector"), ("cross_entropy", "classes"), ("logistic", "binary")))
register("gated_mhsa", GatedMHSAProgram, GatedMHSAReduction, ALL_LOSSES, ("H", "gates", "gate_seed"),
         cases=(("squared", "sequence"), ("cross_entropy", "classes"), ("logistic", "binary")))
