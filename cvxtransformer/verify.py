"""The verifier: certify any coefficients Z, whatever produced them, as tightly as the problem allows;
and any nonconvex network of a covered family through the coefficients it implements (:func:`certify_network`).

Everything is recomputed from Z (:mod:`cvxtransformer.core.certificate`). The dual point built
from Z alone, ``V = s (-grad L(yhat(Z)))``, is only first-order accurate: its gap is about the
square root of the true suboptimality. So the verifier also computes a dual point of its own: the
torch proximal-gradient solver, warm-started at Z, is run on the whole problem (bounded in time)
and its best dual point is a candidate. Any dual-feasible point gives a valid bound, and every
candidate is projected and scaled into the feasible set by the core before it is used, so the
refinement can only tighten the certificate, never make it lie.

Stopping rule of the refinement: with ``Z_r`` the refined iterate and ``g_r`` its own gap,
``D(V_r) >= p* - g_r``, so the certificate of Z is at most ``(P(Z) - P(Z_r)) + g_r``; refinement stops
once ``g_r <= max(1e-13 D(V_r), 0.1 (P(Z) - P(Z_r)))``, where the reported gap is within 10%
of ``P(Z) - P(Z_r) <= P(Z) - p*``, the true suboptimality (or at the floor, or at float64's rounding
floor of P, or at ``refine_time``).
"""
import math
import numbers
import time
from dataclasses import asdict, dataclass

import numpy as np

from cvxtransformer.solvers.proxgrad import ProxGrad

from .core.certificate import (assemble, beaten, best_dual, checked_dual, relative_gap, residual_of, rounding_floor,
                               verdict)
from .core.errors import InvalidInputError, SolverError, invalid
from .core.problem import check_problem
from .core.threads import limited
from .core.validation import check_positive, check_tol

REFINE_FLOOR = 1e-13  # relative gap of the refined point below which refinement stops


REFINE_PASSES = 3  # passes over the data a refinement needs besides its iterations: its first and last checks, L
LATE_PASSES = 1  # passes a time-limited loop may run past its limit (the iteration under way)


def refine_dual(problem, Z, time_limit=10.0, floor=REFINE_FLOOR, primal=None):
    """A dual point for ``Z`` computed by the verifier (see the module docstring).

    ``primal``: P(Z) when already computed (a pass over the data otherwise).
    Returns ``(V, seconds, status)``: V of shape (N, n_outputs) (not yet scaled: the certificate
    makes it feasible; None when the refinement failed), the wall time, and how the refinement ended.
    """
    start = time.perf_counter()
    P_Z = float(problem.primal_objective(Z) if primal is None else primal)

    def stop(primal, dual):
        return relative_gap(primal, dual) <= floor or primal - dual <= 0.1 * (P_Z - primal)

    try:
        out = ProxGrad().solve(problem, tol=floor, init=Z, time_limit=time_limit, max_iter=10**7, stop=stop,
                               screen_norms="auto")
    except SolverError as exc:  # e.g. float64 overflow: the certificate falls back on the other dual points
        return None, time.perf_counter() - start, f"failed: {exc}"
    return out.V, time.perf_counter() - start, out.status


def certify(problem, Z, V=None, tol=1e-6, refine=True, refine_time=10.0, atol=None, deadline=None, threads=None):
    """Certify coefficients ``Z`` of ``problem``, from any solver.

    Parameters
    ----------
    problem : ConvexProblem, from :func:`cvxtransformer.make_problem`
    Z : ndarray of the program's shape (``problem.program.shape``): (n, d) for (8), (c, n, d) for (10),
        (h, c, n, d) for (12); a nuclear-norm family's is one matrix, or a stack of them, one per gate (each
        family's module says: the modules of :data:`cvxtransformer.core.registry.MODULES`)
    V : optional candidate dual point (N, n_outputs) (or (N,) with one output), e.g. a solver's
        multipliers; it is made feasible here and used only if it gives a better bound
    tol : the relative gap ``(P(Z) - D(V)) / D(V)`` below which the solution is reported ``certified``
        (1e-15 <= tol < 1): then ``(P(Z) - p*) / p* <= relative_gap <= tol``, at every scale of the data
    refine : True: compute a refined dual point (see the module docstring), unless the gap is
        already at the floor 1e-13 (or at float64's rounding floor of P); "auto": only when the
        gap does not certify; False: never
    atol : None (default), or an absolute tolerance: the solution is also certified when
        ``P(Z) - D(V) <= atol`` (``certified_by`` says which test did). Near interpolation, where p*
        is so far below P(0) that float64 cannot reach ``tol`` relative to D, the certificate's
        ``note`` says so and names the atol that would accept the gap
    refine_time : seconds allowed to the refinement
    deadline : None, or a ``time.perf_counter()`` value by which the call should end (``solve``'s
        ``time_limit + refine_time``): the refinement is shortened to end by it, with the passes over
        the data that the certificate still needs (timed on the first one), or skipped (its status says
        so). The certificate itself is always computed, from Z
    threads : the most CPU threads the verification uses (torch and BLAS; None: torch's setting; small
        products run on one thread): :mod:`cvxtransformer.core.threads`

    Notes
    -----
    Passes over the data: two, the forward pass for P(Z) and the residual dual point and one adjoint for
    its feasibility, and one more adjoint for a candidate ``V`` only when it may beat the residual (a loss's
    ``scaled_dual_bound`` says when it cannot); the refinement, when it runs, comes on top. The recovered
    heads' objectives are computed when read (:class:`~cvxtransformer.core.certificate.RecoveredObjectives`).

    Returns
    -------
    Certificate, with ``relative_gap = (P(Z) - D(V)) / D(V)`` at the best dual point (+inf when
    ``D(V) <= 0 < P(Z)``, 0 when ``P(Z) = 0``), ``residual_relative_gap`` (from Z alone),
    ``refined_relative_gap``, ``dual_source``, ``certified_by`` and ``note``.

    Example
    -------
    >>> import numpy as np, cvxtransformer as ct
    >>> X = np.random.default_rng(0).standard_normal((30, 4, 3))
    >>> P = ct.make_problem(X, X[:, 1, 0], program=8, beta=1.0)
    >>> cert = ct.certify(P, np.zeros((4, 3)))
    >>> cert.certified, cert.dual_objective <= cert.primal_objective
    (False, True)
    """
    tol, atol = check_tol(tol), check_positive("atol", atol, none_ok=True)
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, numbers.Real)
                                 or math.isnan(deadline)):
        raise invalid("deadline", "None or a time.perf_counter() value", repr(deadline))
    Z = check_problem(problem).check_data().program.check_Z(Z)
    candidates = {}
    if V is not None:
        candidates["given"] = problem.program.check_V(V)
    if refine not in (True, False, "auto"):
        raise InvalidInputError(f"refine: expected True, False or 'auto', got {refine!r}")
    refine_time = check_positive("refine_time", refine_time)
    threads = check_positive("threads", threads, integer=True, none_ok=True)
    with limited(threads, problem.program.N * Z.size):
        return _certify(problem, Z, candidates, tol, refine, refine_time, atol, deadline, threads)


def _certify(problem, Z, candidates, tol, refine, refine_time, atol, deadline, threads):
    refinement = None
    start = time.perf_counter()
    residual = residual_of(problem, Z)  # two passes (forward and adjoint), shared with the certificate
    one_pass = time.perf_counter() - start
    if "given" in candidates and beaten(problem, candidates["given"], residual[3]):
        del candidates["given"]  # no scaling of it beats the residual: its adjoint is not computed
    checked = {source: checked_dual(problem, V) for source, V in candidates.items()}
    if refine:
        primal, _, dual = best_dual(problem, Z, candidates.get("given"), residual, checked.get("given"))
        auto = refine == "auto"
        allowed = refine_time if deadline is None else min(
            refine_time, deadline - time.perf_counter() - (LATE_PASSES + 1) * one_pass)  # + the refined point's pass
        if verdict(primal, dual, tol if auto else REFINE_FLOOR, atol if auto else None)[1] is not None:
            refinement = (0.0, "not needed: the gap is already at " + ("tol" if refine == "auto" else "the floor"))
        elif primal - dual <= rounding_floor(problem):
            refinement = (0.0, "not needed: the gap is at float64's rounding floor of P")
        elif deadline is not None and allowed < REFINE_PASSES * one_pass:
            refinement = (0.0, f"skipped: the time limit leaves {max(allowed, 0.0):.3g} s, less than the "
                               f"{REFINE_PASSES} passes over the data ({one_pass:.3g} s each) a refinement needs")
        else:
            V_ref, seconds, status = refine_dual(problem, Z, allowed, primal=primal)
            if V_ref is not None:
                candidates["refined"] = V_ref
            refinement = (seconds, status)
    return assemble(problem, Z, candidates, tol, refinement, atol, residual, checked, threads)


@dataclass
class NetworkCertificate:
    """How far a nonconvex network is from the global optimum of its family, certified.

    Attributes
    ----------
    network : the network's equation, as its family's reduction names it (``equations``): ``"(9)"``,
        ``"(11)"``, ``"(5)"``, ...
    program : the name of the convex program that bounds the family (8, 10, 12 or another registered
        family's name: :mod:`cvxtransformer.core.registry`)
    objective : the network's own objective ``sum_i L(yhat_i, y_i) + penalty``, evaluated on the network
        in float64 (attention rows projected onto the simplex where they were off it by rounding)
    lower_bound : D(V), a certified lower bound on the objective of every network of the family on this
        data and beta, whatever its number of heads (D(V) <= P(Z*) <= that objective)
    gap : ``objective - lower_bound >= objective - (global optimum)``
    relative_gap : ``gap / lower_bound`` (+inf when ``lower_bound <= 0 < objective``), a bound on the
        network's relative distance ``(objective - p*) / p*`` to the global optimum
    heads : the network's number of heads
    penalty : the penalty of the family's objective, in words (its reduction's ``penalty``): the objective
        certified is the loss plus this penalty, so a network trained with another penalty (e.g. ordinary
        weight decay, where the family squares an l1 norm) has another objective and another family
    Z : the coefficients the network implements (the program's shape), ``coefficients(problem, weights)``
    certificate : the verifier's :class:`~cvxtransformer.core.certificate.Certificate` at Z
        (``primal_objective`` is P(Z) <= objective; its dual point gives the bound)
    """

    network: str
    program: object
    objective: float
    lower_bound: float
    gap: float
    relative_gap: float
    heads: int
    penalty: str
    Z: np.ndarray
    certificate: object

    def to_dict(self):
        """JSON-ready dict (without Z), the certificate of Z under ``convex``."""
        out = {k: v for k, v in asdict(self).items() if k not in ("Z", "certificate")}
        out["convex"] = self.certificate.to_dict()
        return out


SOFTMAX = ("network: softmax attention (3) is not covered: its attention depends on the input, so no convex "
           "program bounds its objective; compare it with the convex optimum instead (cvxtransformer.compare)")


def _weights(network):
    """``(heads, module or None)`` from heads or a dict of their fields (:func:`~.core.reductions.heads_of`:
    tensors, float32 values and lists taken, in float64) or one of the package's nn modules (its
    ``to_weights()``, the same conversion)."""
    from .core.reductions import heads_of
    from .core.registry import families

    if isinstance(network, dict) and {"Wq", "Wk"} <= set(network):
        raise InvalidInputError(SOFTMAX)
    heads = heads_of(network, "network")
    if heads is not None:
        return heads, None
    if getattr(network, "name", None) == "softmax":
        raise InvalidInputError(SOFTMAX)
    if hasattr(network, "to_weights") and hasattr(network, "objective"):
        return heads_of(network.to_weights()), network
    kinds = dict.fromkeys(f.reduction.heads.__name__ for f in families().values())
    raise invalid("network", ", ".join(kinds) + ", a dict of their arrays, or a network of cvxtransformer.nn (one "
                  "with to_weights and objective)", type(network).__name__,
                  "map your own module's parameters to the heads (see certify_network)")


def _module_objective(module, problem, Z):
    """``(objective, eps)``: a module's own objective on the problem's data, evaluated in float64 on the CPU
    (a copy of the module; its masks, if any, computed in float64 as the program's are), and the machine
    epsilon of the module's own dtype. Its outputs must be the program's at Z to that dtype's rounding."""
    import copy

    import torch

    eps = torch.finfo(getattr(module, "dtype", torch.float64)).eps
    module = copy.deepcopy(module).to(device="cpu", dtype=torch.float64)
    module.dtype, module.device = torch.float64, torch.device("cpu")  # what encode_inputs reads
    inputs = module.encode_inputs(problem.program.X)
    with torch.no_grad():
        Yhat = module(*inputs)
        expected = problem.program.forward(Z)
        worst = float(np.max(np.abs(Yhat.numpy() - expected))) if tuple(Yhat.shape) == expected.shape else np.inf
        if not worst <= 1e3 * eps * max(1.0, float(np.max(np.abs(expected)))):
            raise invalid("network", f"outputs equal to those of {problem.program.label} at its coefficients",
                          f"outputs of shape {tuple(Yhat.shape)} that differ by {worst:.3g}",
                          "build the problem on the network's data, gates (U1, U2) and target layout (per token "
                          "or pooled)")
        T = torch.as_tensor(problem.T, dtype=torch.float64)
        return float(problem.loss.value(Yhat, T) + module.penalty(problem.beta)), eps


BOUND_ROUNDING = 1e-9  # relative excess of D(V) over the objective taken as rounding (both are sums over N)


def _checked_bound(dual, objective, penalty):
    """The certified lower bound ``D(V)``, which can never exceed the objective of a network of the family
    (``D(V) <= P(Z*) <= P(Z) <= objective``): an excess beyond rounding is an error, never a negative gap;
    within rounding the bound is the objective (a gap of 0). ``penalty``: the family's, in words."""
    excess = dual - objective
    if excess > BOUND_ROUNDING * max(abs(objective), abs(dual)):
        raise InvalidInputError(
            f"network: its objective {objective:.10g} is below the certified lower bound D(V) = {dual:.10g} of "
            "every network of the family, which is impossible for a network in it: its penalty is smaller than the "
            f"family's ({penalty}) or its outputs are not the program's at its coefficients; nothing is certified")
    return min(dual, objective)


def certify_network(problem, network, tol=1e-6, refine=True, refine_time=10.0):
    """Certify a nonconvex network trained anywhere: its objective, a certified lower bound on the global
    optimum of its family, and the gap between them.

    The network's coefficients ``Z = coefficients(problem, weights)`` (the reduction's forward map)
    give outputs equal to the network's, and the verifier certifies Z (:func:`certify`, with its
    refined dual point): its dual value D(V) is at most P(Z*), which is at most the objective of
    every network of the family (Proposition 1 of Ergen et al. for (9)/(11), Sahiner et al. for
    (5)), whatever its number of heads. So ``objective - D(V)`` is a certified bound on how far the
    network is from the global optimum.

    Parameters
    ----------
    problem : ConvexProblem whose program bounds the network's family: (8) or (10) for the alternative
        attention network (9), (12) for the gated-ReLU network (11) (on the network's gates U1, U2),
        another registered family's program for that family's networks (e.g. the nuclear-norm program
        (6) of Sahiner et al. for linear multi-head self-attention (5)); on the network's training
        data and beta
    network : :class:`~cvxtransformer.core.attention.AttentionHeads` (``W1`` (m, n) attention rows on
        the simplex, ``W2`` (m, d), ``W3`` (m, c), ``gate`` (m,) for (11)), a dict of those arrays,
        the heads of another registered family (its reduction's ``heads``, e.g. ``ct.MHSAHeads``:
        ``W1`` (m, d, d), ``W2`` (m, d, c); ``ct.GatedMHSAHeads``: also ``gate`` (m,); as
        ``recover_weights`` returns them) or their dict, or a network of :mod:`cvxtransformer.nn`. ``form``: "balanced" (every family) or "lemma1" (heads of
        (9)/(11), whose value vectors are normalised first: see ``Proposition1.objective``); any
        other is refused. Softmax attention (3) is refused:
        the bound does not cover it (its attention depends on the input). Arrays may be ndarrays,
        torch tensors (any device, any float dtype, requiring grad or not: taken by value) or nested
        lists (:func:`~cvxtransformer.core.reductions.heads_of`); everything is computed in float64.
        Attention rows within their precision's rounding of the simplex (float32 softmaxes sum to 1
        within about 1e-7) are projected onto it in float64 first: the network certified, whose
        objective is reported, is the one with the projected rows (its outputs differ from the given
        network's by that rounding).
    tol, refine, refine_time : as for :func:`certify`

    Returns
    -------
    NetworkCertificate
        Always ``lower_bound <= objective`` (a bound above it raises an InvalidInputError, explained).
        The objective is the network's weight-decay objective, the reduction's ``objective``
        (float64 numpy) at the weights certified; for a module, at its ``to_weights()``, once its own
        outputs (a float64 copy of it) are checked against the program's at Z, to its dtype's
        rounding; a module whose own objective is below the family's at its weights beyond that
        rounding (another penalty) and below the bound is refused, as any network below the bound.

    The penalty is the family's (``NetworkCertificate.penalty`` says it in words). Programs (10) and (12)
    assume ``beta/2 sum_j (||w_2j||^2 + ||w_3j||_1^2)``, an l1 norm squared on each head's output vector;
    a network trained with ordinary weight decay (AdamW, or ``weight_decay`` in any torch optimiser:
    ``beta/2 sum_j (||w_2j||^2 + ||w_3j||_2^2)``) is bounded by their weight-decay forms, a nuclear norm
    per token (registered by the attention family beside them; docs/conventions.md), not by (10)/(12).

    Your own torch module: map its parameters to the heads. Network (9) computes
    ``yhat_i = sum_j (w_1j^T X_i w_2j) w_3j``:
    stack each head's attention row (e.g. ``softmax(logits_j)``, on the simplex), value vector and
    output vector as the rows of ``W1``, ``W2``, ``W3``. Network (5) computes
    ``sum_j X_i W1j X_i^T X_i W2j`` with penalty ``beta/2 sum_j (||W1j||^2 + ||W2j||^2)``: a linear
    attention head (no softmax) ``(X Wq_j)(X Wk_j)^T (X Wv_j) Wo_j`` has ``W1j = Wq_j Wk_j^T`` and
    ``W2j = Wv_j Wo_j``. The objective certified is the family's, with that penalty, evaluated from
    the mapped weights; if your module's penalty differs, its objective differs too (the bound
    still holds for the family's objective).

    Example
    -------
    >>> import numpy as np, cvxtransformer as ct
    >>> from cvxtransformer.core.attention import AttentionHeads
    >>> X = np.random.default_rng(0).standard_normal((30, 4, 3))
    >>> P = ct.make_problem(X, X[:, 1, :2], program=10, beta=1.0)
    >>> heads = AttentionHeads(W1=np.full((2, 4), 0.25), W2=np.ones((2, 3)), W3=np.eye(2))
    >>> cert = ct.certify_network(P, heads)
    >>> cert.network, cert.gap >= cert.objective - ct.solve(P).certificate.primal_objective >= 0
    ('(9)', True)
    """
    reduction = check_problem(problem).reduction
    if not hasattr(reduction, "coefficients"):
        raise invalid("problem", "a program whose reduction maps weights to coefficients", problem.program.label)
    weights, module = _weights(network)
    Z = reduction.coefficients(problem, weights)
    own = None if module is None else _module_objective(module, problem, Z)  # (objective, eps of its dtype)
    objective = float(reduction.objective(problem, weights))  # in float64, from the weights certified
    cert = certify(problem, Z, tol=tol, refine=refine, refine_time=refine_time)
    if own is not None and own[0] < objective - 1e3 * own[1] * max(1.0, abs(objective)):
        _checked_bound(cert.dual_objective, own[0], reduction.penalty)  # its penalty is below the family's
    lower_bound = _checked_bound(cert.dual_objective, objective, reduction.penalty)
    gap = objective - lower_bound
    return NetworkCertificate(network=reduction.equations.get(problem.program.name, ""), program=problem.program.name,
                              objective=objective, lower_bound=lower_bound, gap=gap,
                              relative_gap=relative_gap(objective, lower_bound), heads=weights.heads,
                              penalty=reduction.penalty, Z=Z, certificate=cert)
