"""Certificate primitives (docs/conventions.md, Certificates): everything is recomputed from Z itself.

From any Z: ``P(Z)``; the dual point ``V = s (-grad L(yhat(Z)))`` scaled into the dual feasible set;
``D(V)``; the duality gap ``P(Z) - D(V) >= P(Z) - p* >= 0``; the KKT residuals; beta_max; and
the recovery of the nonconvex weights (a reduction's ``invert``) with the nonconvex objective at
them. A candidate dual point from elsewhere (a solver's multipliers, the verifier's refinement)
is projected onto the loss's dual domain and scaled the same way before it is used, so a
certificate never rests on a point it did not check. A solver's reported status never enters.

:func:`cvxtransformer.certify` (which adds the refined dual point) and the torch backend's
stopping rule are both built on :func:`scaled_residual` and :func:`dual_feasible_point`, and
both judge a gap with :func:`relative_gap` and :func:`verdict`.
"""
import math
import weakref
from dataclasses import dataclass, field, fields
from typing import Optional

import numpy as np

from .arrays import to_numpy


ROUNDING = 1e3 * np.finfo(float).eps  # a gap of at most this fraction of P(0) is at float64's rounding of P


def relative_gap(primal, dual):
    """The certified relative gap ``(P - D) / D`` of docs/conventions.md (Certificates), on floats.

    Since ``D <= p*`` it bounds the true relative suboptimality ``(P - p*) / p*`` at every scale of
    the data. Every loss is >= 0, so ``p* >= 0``: ``P == 0`` means Z is optimal (0), and
    ``D <= 0 < P`` bounds nothing relative to p* (+inf). The one formula for the verifier, the
    solvers' stopping rules and every report.
    """
    primal, dual = float(primal), float(dual)
    if primal == 0.0:
        return 0.0
    if not dual > 0.0:
        return math.inf
    return (primal - dual) / dual


def rounding_floor(problem):
    """The gap below which float64 cannot resolve P: ``ROUNDING * P(0)``, ``P(0) = L(0)`` the loss at
    Z = 0 (the scale of the sums whose cancellation rounds P and D)."""
    return ROUNDING * problem.loss_at_zero()


def verdict(primal, dual, tol, atol=None, floor=0.0):
    """How a gap is judged: ``(relative gap, certified_by, note)``.

    ``certified_by``: ``"relative"`` when ``relative_gap <= tol``, else ``"absolute"`` when ``atol``
    is given and ``P - D <= atol``, else None. ``note`` says why a gap did not certify: at or below
    ``floor`` (:func:`rounding_floor`) the gap is float64's rounding of P and tol relative to D cannot
    be reached (near interpolation, p* far below P(0)); it names the absolute tolerance that would.
    """
    rel, gap = relative_gap(primal, dual), float(primal) - float(dual)
    if rel <= tol:
        return rel, "relative", ""
    if atol is not None and gap <= atol:
        return rel, "absolute", ""
    if gap <= floor:
        return rel, None, (f"the gap {gap:.3g} is at float64's rounding floor of P ({floor:.3g} = 1e3 eps P(0)); "
                           f"tol {tol:g} relative to D = {float(dual):.3g} cannot be reached; pass an absolute "
                           f"tolerance (atol={max(gap, floor):.1e}) to accept it")
    above = "" if atol is None else f" and gap {gap:.3g} > atol {atol:g}"
    return rel, None, f"relative gap {rel:.3g} > tol {tol:g}" + above


def dual_feasible_point(problem, V, G=None):
    """A dual-feasible point from any candidate ``V`` of shape (N, n_outputs).

    ``V`` is projected onto the loss's dual domain, then scaled by ``min(1, beta / dual_norm(A^T V))``
    (scaling toward 0 stays in the domain of all three losses). ``G``: ``A^T V`` of a ``V`` already
    projected (:func:`checked_dual`), which is then only scaled. Returns ``(V_feasible, s)``.
    """
    if G is None:
        V = problem.loss.project_dual_domain(np.asarray(V, dtype=float), problem.T)
        G = problem.program.adjoint(V)
    worst = problem.regularizer.dual_norm(G)
    s = min(1.0, problem.beta / worst) if worst > 0 else 1.0
    return V * s, s


def scaled_residual(loss, regularizer, forward, adjoint, T, Z, Yhat=None):
    """P(Z), the scaled residual dual point and D at it, for numpy or torch faces.

    ``forward``/``adjoint`` are the program's map and adjoint (numpy) or a torch operator's; ``Yhat``
    is ``forward(Z)`` when already known. Returns ``(P, V, s, D, G)`` with ``V = -grad L`` unscaled,
    ``s = min(1, beta / dual_norm(A^T V))``, ``D = D(s V)`` and ``G = A^T V``.
    """
    if Yhat is None:
        Yhat = forward(Z)
    primal = loss.value(Yhat, T) + regularizer.value(Z)
    V = loss.dual_variable(Yhat, T)
    G = adjoint(V)
    worst = float(regularizer.dual_norm(G))
    s = regularizer.beta / worst if worst > regularizer.beta else 1.0
    return primal, V, s, loss.dual_objective(V, T, s), G


def kkt_residuals(problem, Z):
    """KKT residuals relative to beta (docs/conventions.md): (stationarity on the support, dual feasibility off it)."""
    G = problem.program.adjoint(problem.residual_dual(Z))
    return problem.regularizer.kkt_residuals(np.asarray(Z, dtype=float), G)


def gap_safe_screen(problem, V, gap, G=None):
    """Blocks proved zero at every optimum by the gap-safe sphere test at a feasible point ``V``.

    The dual optimum lies within ``r = sqrt(2 gap / mu)`` of ``V`` (``mu``: strong concavity of D);
    the regulariser turns that into its blocks proved zero: groups (boolean array of the groups'
    shape) for the group lasso, singular directions for the nuclear norm (a proved rank bound).
    ``G``: ``A^T V`` when already computed (a pass over the data otherwise).
    """
    radius = np.sqrt(2.0 * max(gap, 0.0) / problem.loss.strong_concavity)
    G = problem.program.adjoint(V) if G is None else G
    return problem.regularizer.screen(G, radius, problem.program.block_norms())


_LAST = weakref.WeakKeyDictionary()  # problem -> (Z, residual_of(problem, Z)) of the last Z checked


def residual_of(problem, Z):
    """:func:`scaled_residual` of ``Z`` on the problem's numpy faces: ``(P, V, s, D, G)`` (read-only arrays),
    a forward pass and an adjoint over the data.

    The last Z of each problem is remembered with its exact values: a second call with the same values
    reads no data. The torch backend's certified checks on the CPU in float64 call this function (its
    stopping rule is this certificate), so ``cvxtransformer.solve``'s verification of the point the backend
    checked last is this computation, made once, by this function, from Z alone.
    """
    Z = np.asarray(Z, dtype=float)
    last = _LAST.get(problem)
    if last is not None and last[0].shape == Z.shape and np.array_equal(last[0], Z):
        return last[1]
    out = scaled_residual(problem.loss, problem.regularizer, problem.program.forward, problem.program.adjoint,
                          problem.T, Z)
    for a in out:
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    _LAST[problem] = (np.array(Z), out)
    return out


def checked_dual(problem, V):
    """``(V_feasible, D(V_feasible), A^T V_feasible)``: a candidate made feasible (:func:`dual_feasible_point`),
    its value and its scores (one adjoint pass over the data)."""
    V = problem.loss.project_dual_domain(np.asarray(V, dtype=float), problem.T)
    G = problem.program.adjoint(V)
    V, s = dual_feasible_point(problem, V, G)
    return V, problem.dual_objective(V), G * s


def best_dual(problem, Z, V=None, residual=None, checked=None):
    """P(Z) and the better of the scaled residual of Z and a candidate ``V``: ``(P, V_best, D(V_best))``.
    ``residual``: :func:`residual_of` Z and ``checked``: :func:`checked_dual` of V, when already computed."""
    primal, R, s, dual, _ = residual_of(problem, Z) if residual is None else residual
    best = R * s
    if V is not None:
        other, value, _ = checked_dual(problem, V) if checked is None else checked
        if value > dual:
            best, dual = other, value
    return primal, best, dual


def beaten(problem, V, dual):
    """Whether the candidate ``V`` cannot give a dual value above ``dual`` (the scaled residual's), whatever
    scaling ``0 < s <= 1`` makes it feasible: the loss's ``scaled_dual_bound`` of ``V`` projected onto its
    dual domain (no pass over the data) is at most ``dual``. Then its adjoint need not be computed. False
    where the loss offers no such bound."""
    bound = getattr(problem.loss, "scaled_dual_bound", None)
    if bound is None:
        return False
    value = bound(problem.loss.project_dual_domain(np.asarray(V, dtype=float), problem.T), problem.T)
    return value is not None and float(value) <= float(dual)


def screen_solution(problem, Z, V=None):
    """``(Z, mask)``: ``Z`` with the blocks that the gap-safe test proves zero set to zero
    (interior-point and splitting solvers return tiny nonzero values there), tested at the
    better of the scaled residual and ``V``; ``mask`` marks those blocks."""
    primal, best, dual = best_dual(problem, Z, V)
    mask = gap_safe_screen(problem, best, primal - dual)
    return problem.regularizer.zero_blocks(np.asarray(Z, dtype=float), mask), mask


class RecoveredObjectives:
    """The nonconvex objectives at the heads the family's reduction recovers from Z (``invert``), in each
    form it offers, computed when first read: each is a pass over X that the certificate's own two
    passes do not need (``reduction.objective``, from the heads, independent of the program's map), so
    :func:`cvxtransformer.solve` does not pay for them unless they are read. Pickled with every form
    computed (no reference to the problem is kept then). A problem sharded over processes computes them at
    once: their sums over samples are collectives that every process must join."""

    def __init__(self, problem, Z, threads=None):
        self.problem, self.Z, self.threads, self.values = problem, Z, threads, {}
        self.forms = problem.reduction.forms
        if problem.program.shards is not None:  # its sums take every process: computed by each, now
            for form in self.forms:
                self(form)

    def __call__(self, form):
        if form not in self.forms:
            return None
        if form not in self.values:
            from .threads import limited

            problem, reduction = self.problem, self.problem.reduction
            with limited(self.threads):
                self.values[form] = float(reduction.objective(problem, reduction.invert(problem, self.Z, form)))
            if len(self.values) == len(self.forms):
                self.problem = self.Z = None
        return self.values[form]

    def __getstate__(self):
        for form in self.forms:
            self(form)
        return {"problem": None, "Z": None, "threads": None, "values": self.values, "forms": self.forms}


@dataclass
class Certificate:
    """What the verifier recomputed from a solution (see :func:`cvxtransformer.certify`).

    ``dual_objective`` and ``relative_gap`` are those of the best dual point (``dual_source``:
    ``"residual"``, the scaled residual of Z; ``"given"``, a candidate passed in (a solver's
    multipliers); ``"refined"``, the verifier's own refinement). ``residual_relative_gap`` is the
    gap from Z alone without refinement; ``refined_relative_gap`` the gap at the refined point
    (None when refinement was off or not needed), ``refine_seconds`` its cost. ``support_size``:
    nonzero groups (group lasso) or rank (nuclear norm). Every relative gap is :func:`relative_gap`,
    ``(P - D) / D``. ``certified_by``: ``"relative"`` (``relative_gap <= tol``), ``"absolute"``
    (``duality_gap <= atol``, only when an ``atol`` was given) or None; ``note``: why it is not
    certified (e.g. a gap at float64's rounding floor of P, near interpolation), "" when it is.
    ``recovered_objective`` and ``recovered_objective_lemma1`` (None for a family without that form):
    the nonconvex objective at the ``heads_recovered`` heads, computed when first read (a pass over X
    each: :class:`RecoveredObjectives`), and always in :meth:`to_dict`.
    """

    primal_objective: float
    dual_objective: float
    duality_gap: float
    relative_gap: float
    dual_source: str
    residual_relative_gap: float
    refined_relative_gap: float
    refine_seconds: float
    refine_status: str
    kkt_stationarity: float
    kkt_dual_feasibility: float
    beta: float
    beta_max: float
    support_size: int
    heads_recovered: int
    tol: float
    certified: bool
    V: np.ndarray = field(repr=False)
    atol: Optional[float] = None
    certified_by: Optional[str] = None
    note: str = ""
    G: Optional[np.ndarray] = field(default=None, repr=False)  # A^T V at V, the gap-safe tests' scores
    recovered: Optional[RecoveredObjectives] = field(default=None, repr=False, compare=False)

    @property
    def recovered_objective(self):
        """The nonconvex objective at the recovered heads, balanced form (computed when first read)."""
        return None if self.recovered is None else self.recovered("balanced")

    @property
    def recovered_objective_lemma1(self):
        """The nonconvex objective at the recovered heads, Lemma-1 form (None where the family has no such
        form; computed when first read)."""
        return None if self.recovered is None else self.recovered("lemma1")

    def to_dict(self):
        """The fields as plain values (without V and G), the recovered objectives computed."""
        out = {}
        for f in fields(self):
            if f.name in ("V", "G", "recovered"):
                continue
            out[f.name] = getattr(self, f.name)
            if f.name == "heads_recovered":
                out.update(recovered_objective=self.recovered_objective,
                           recovered_objective_lemma1=self.recovered_objective_lemma1)
        return out


def assemble(problem, Z, candidates, tol, refinement=None, atol=None, residual=None, checked=None, threads=None):
    """The :class:`Certificate` of ``Z`` with the best of the dual ``candidates``; certified by
    :func:`verdict` (``relative_gap <= tol``, or ``gap <= atol`` when ``atol`` is given).

    ``candidates``: dict source -> dual point (N, n_outputs); each is made feasible here.
    ``refinement``: ``(seconds, status)`` of the refinement that produced the ``"refined"`` candidate.
    ``residual``: :func:`residual_of` Z, and ``checked``: dict source -> :func:`checked_dual` of that
    candidate, when the caller computed them from the same Z and candidates (each is a pass over the data).
    No other pass over the data is made here: the recovered heads' objectives are computed when read
    (:class:`RecoveredObjectives`, on ``threads``).
    """
    reg = problem.regularizer
    primal, R, s, residual_dual, G = residual_of(problem, Z) if residual is None else residual
    best = ("residual", R * s, residual_dual, G * s)
    gaps, checked = {}, checked or {}
    for source, V in candidates.items():
        V, value, scores = checked[source] if source in checked else checked_dual(problem, V)
        gaps[source] = relative_gap(primal, value)
        if value > best[2]:
            best = (source, V, value, scores)
    source, V, dual, scores = best
    gap = primal - dual
    stationarity, feasibility = reg.kkt_residuals(Z, G)
    relative, by, note = verdict(primal, dual, tol, atol, rounding_floor(problem))
    return Certificate(
        primal_objective=primal, dual_objective=dual, duality_gap=gap, relative_gap=relative,
        dual_source=source, residual_relative_gap=relative_gap(primal, residual_dual),
        refined_relative_gap=gaps.get("refined"), refine_seconds=0.0 if refinement is None else refinement[0],
        refine_status="off" if refinement is None else refinement[1],
        kkt_stationarity=stationarity, kkt_dual_feasibility=feasibility, beta=problem.beta,
        beta_max=float(problem.beta_max()), support_size=reg.support_size(Z),
        heads_recovered=problem.reduction.invert(problem, Z, "balanced").heads,
        tol=tol, certified=by is not None, V=to_numpy(V), atol=atol, certified_by=by, note=note,
        G=to_numpy(scores), recovered=RecoveredObjectives(problem, np.array(Z, dtype=float), threads))
