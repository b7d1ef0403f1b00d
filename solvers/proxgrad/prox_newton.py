"""Proximal Newton on a working set, for the losses that are smooth but not quadratic (logistic,
cross-entropy), on operators that offer ``weighted_gram`` (programs (8), (10), (12) on dense tokens).

At ``x`` the smooth part ``f(x) = sum_i L(A_i x)`` of the restricted program is replaced by its
Newton model

    q(x') = f(x) + <g, x' - x> + 1/2 (x' - x)^T H (x' - x),     g = grad f(x),   H = A^T W A,

with ``W_i`` the Hessian of L at ``yhat_i`` (``loss.hessian``). ``H`` is summed from the data by
chunks of samples (``op.weighted_gram``: one Gram matrix per pair of outputs, summed over the
shards), in float32 (a GEMM at twice the speed or more; the Hessian only shapes the step, while
the gradient, the line search and every gap keep the working precision and the certificate
float64), and only over the *active* blocks: those nonzero at x and the worst violators of
``||g_g|| <= beta`` (at most as many as are nonzero, at least ``ACTIVE_MIN``); the other blocks of
the working set stay at zero for this step, and the next step's gradient brings in any that
should move. So a Newton step costs ``N (c F_a)^2 / 2`` multiply-adds at GEMM speed, ``F_a`` the
active features (on gated programs, each block of gates ``(j, j')`` over the samples where both are
on only: ``op.weighted_gram_cost``), and an iteration on the model ``(c F_a)^2``, independent of N.
The step's image ``A d`` is computed once, and ``A x`` follows the steps (recomputed on return).

A convex quadratic is a squared loss: ``q = 1/2 ||R x' - t||^2 + const`` with ``R = W^(1/2) A`` and
``t = R x - W^(-1/2) grad L``, so ``||t||^2 = x^T H x - 2 <x, g> + sum_i grad L_i^T W_i^+ grad L_i``
(``loss.gradient_metric``). The model plus the group lasso is therefore solved by the squared
loss's own machinery, to a duality gap of the model of ``MODEL_GAP`` times the working set's: where
no violator was let in (the model's blocks are x's nonzero ones, and the support of x may well be
the model's optimal one: small beta, where nearly every block is active, and the last steps of any
solve), by Newton on that support (:func:`.newton.polish`, stopped once its decrement is below the
target: one Cholesky factorisation of the ``c F_a`` features per step, or a few, where FISTA spends
hundreds of products with H; in float32, the precision of H, with one step of refinement; measured
on the logistic program (12), N = 10,000, 2,048 active features at 0.001 beta_max: 7.0 s -> 3.4 s,
and float32 factors 3.4 s -> 2.5 s), and otherwise, or where that support is not the model's
optimal one (its gap says so), FISTA on its Gram form (:class:`.smooth.GramSmooth`) with the Newton
polish on a stable support (:mod:`.newton`). A line search on the true objective gives the step:
Armijo backtracking on ``P(x + s d)``, and a unit step that P shows too short (P fell by more than
0.55 of its first-order decrease; on a quadratic model it falls by 1/2) is doubled while P keeps
falling (far from the optimum, at small beta, the loss is flatter along d than its model); ``A x``
and ``A d`` are combined, so a trial costs no product. Once the support is stable, a step is a Newton step on
the support: the gap falls quadratically where first-order methods crawl
(small beta, near-separable classes, correlated tokens).

Lazy Hessians: on many active blocks the Hessian is most of a step's cost (``N (c F_a)^2 / 2``
against ``(c F_a)^2`` per model iteration). A step whose active blocks are those of the last step,
and whose predecessor divided the gap by ``1 / LAZY_RATIO`` (10) or more, keeps the last Hessian
(up to ``LAZY_STEPS`` times in a row): the model is then ``f(x) + <g, x' - x> + 1/2 (x' - x)^T H_0 (x' - x)``
with the gradient at x and ``H_0`` taken at the earlier prediction ``yhat_0``, a convex quadratic
all the same (its constant is ``sum_i grad L_i^T W_i(yhat_0)^+ grad L_i``, ``loss.gradient_metric``
with ``at``), and the line search keeps every step a descent step. The rate near the optimum
becomes fast-linear instead of quadratic, at a fraction of the cost per step (measured on the
logistic program (12), N = 10,000, up to 2,048 active features, a certified 1e-6 at 0.01 beta_max:
7 Hessians for 8 steps instead of 8 for 8; at 0.001 beta_max, 8 (5 of 2,048 features) for 10). Only
where the Hessian costs more than the rest of a step (``reuse``, the driver's cost model: its sums against
the step's two passes over the working set's data): on a few active blocks a fresh Hessian costs less than
the extra step a stale one may take, and the gap is a coarse judge of a lazy step (it falls with the
stationarity on the support, which a stale Hessian corrects more slowly). Measured on the logistic program
(8), N = 10,000, 3 active tokens of 8 at 0.1 beta_max: a Hessian is 1.7 ms, a step about 5 ms, and the lazy
steps each divided the gap by 1.3 and 1.2: 5 steps, 30 -> 25 ms.

Light samples left out: the samples of least curvature (``tr W_i ||a_i||^2``, well-classified ones:
``W_i`` falls like ``e^-margin``), as many as together carry at most ``HESSIAN_MASS`` (1e-4) of the
trace of H (whole binary orders of magnitude of it, lightest first: no sort), are left out of its sums (``op.weighted_gram`` skips samples of zero weight; not on
streamed data, where the samples' norms would cost one more pass over it). The model's
curvature is then H less a positive semidefinite part of trace 1e-4 tr H at most: the steps are the
same to about that, and the line search keeps them descent steps; the gradient, the gaps and the
certificate see every sample. Near the optimum of a nearly separable program most samples are light:
measured on the logistic program (12), N = 10,000, 2,048 active features, 0.001 beta_max, 20% of the
samples left out of the first Hessian and 56% of the last: 1.90 s -> 1.67 s, the same 10 steps (a
share of 1e-3 left out 70% and took an extra step; 1e-2, 7 extra steps); the other instances level
(measured when a sort chose the samples; whole orders of magnitude may leave fewer out).

Loose models in the Hessian's precision: a model of ``LOW_MODEL_FEATURES`` (1,024) features or more
solved to a relative gap of ``LOW_MODEL_GAP`` (1e-3) or looser (the first steps, where the working
set's gap is above about 1e-2) is built, solved and started by Newton in float32, the precision H
was summed in: an iteration on it is a product with H, memory-bound, so float32 halves it (a smaller
H stays in cache and costs the same in float64). The model's value at x (``metric``, from the
loss) and the line search on P stay float64; a float32 model whose point gives no descent step is
built again in the working precision, for the same step. Measured on the logistic program (12),
N = 10,000, 2,048 active features: 2.3 s -> 1.9 s at 0.001 beta_max, 2.1 s -> 1.7 s at 0.01.

The model's gap is an inner criterion only: whether the working set is solved is decided by its
own duality gap at every step, and whether the program is solved by the driver's float64
certificate. In a distributed solve ``H`` and the line search's sums are sums over the shards and
the active blocks come from the replicated iterate and the summed gradient, so every process
builds the same model and takes the same step.
"""
import math
import time

import torch

from cvxtransformer.core.certificate import relative_gap

from .fista import Budget, _dot, fista, gap_at, gap_terms
from .newton import Polisher, polish
from .smooth import GramSmooth

MODEL_GAP = 0.1  # the model is solved to this fraction of the working set's duality gap
MODEL_ITER = 5000  # iterations of FISTA on one model (cheap: (c F)^2 each)
ARMIJO = 1e-4  # sufficient decrease of the line search
BACKTRACKS = 30  # halvings of the step before the direction is given up
LONGEST = 16.0  # a unit step that decreases P is doubled while P keeps decreasing, up to this,
FLATTER = 0.55  # when P fell by more than this fraction of its first-order decrease (a quadratic: 1/2)
ACTIVE_MIN = 3  # violating blocks let into the model even when few are nonzero
LAZY_STEPS = 8  # steps a Hessian may serve after the one it was computed for (same active blocks),
LAZY_RATIO = 0.1  # while each of them divides the gap by 1 / LAZY_RATIO at least
LOW_MODEL_GAP = 1e-3  # a model solved to this relative gap or a looser one, of LOW_MODEL_FEATURES or more,
LOW_MODEL_FEATURES = 1024  # is built and solved in the Hessian's precision (products with H are memory-bound:
#                            float32 halves them; a smaller H stays in cache and costs the same in float64)
STALL_STEPS = 3  # steps in a row that leave a gap below the floor (``floor``) where it was: "floor"
HESSIAN_MASS = 1e-4  # share of the Hessian's trace that its lightest samples may carry and be left out
START_FEATURES = 3072  # largest model started by Newton on its support (a Cholesky of 3,072 features
#                        costs about 100 products with H on one CPU thread; FISTA spends 200-400 on a model)
START_ITERATIONS = 6  # Newton iterations of that start at most (1 to 4 seen; each one a Cholesky)


def newton_hessian(op, loss, Yhat, T, norms=None):
    """``H = A^T W A`` of the operator ``op`` at ``Yhat = A x`` (in ``op``'s dtype): (F, F) for one
    output, (cF, cF) for c outputs (features ordered (output, gate, token, coordinate), the layout
    of :class:`.smooth.GramSmooth`). One weighted Gram matrix per pair of outputs ``l <= m``.
    ``norms``: ``op.sample_norms()`` when known (a pass over the data otherwise)."""
    W = loss.hessian(Yhat.to(op.dtype), T.to(op.dtype))  # (N, c, c)
    if not op.streams:  # the samples' norms of streamed data would cost a pass over it
        W = light_samples_dropped(W, op.sample_norms() if norms is None else norms)
    c = W.shape[1]
    if c == 1:
        return op.weighted_gram(W[:, :, 0])[0]
    iu = torch.triu_indices(c, c, device=W.device)
    G = op.weighted_gram(W[:, iu[0], iu[1]].contiguous())  # (pairs, F, F)
    F = G.shape[1]
    H = torch.empty(c, F, c, F, dtype=G.dtype, device=G.device)
    for k, (l, m) in enumerate(zip(*iu.tolist())):
        H[l, :, m] = G[k]
        if l != m:
            H[m, :, l] = G[k].T
    return H.view(c * F, c * F)


def light_samples_dropped(W, norms):
    """The per-sample Hessians ``W`` (N, c, c) with the samples of least curvature set to zero: whole binary
    orders of magnitude of ``tr(W_i) ||a_i||^2`` (``norms``: the ``||a_i||^2``), lightest first, for as long as
    together they carry at most ``HESSIAN_MASS`` of ``tr H = sum_i tr(W_i) ||a_i||^2``. Orders of magnitude,
    not a sort: the same guarantee at one pass over the masses (a sort of 50,000 masses took 4.7 ms, more than
    the Hessian of 3 tokens of 16 it trimmed); whole orders may leave out fewer samples than a sort would.
    The weighted Gram matrices skip them (on a shard: of its own samples' trace)."""
    mass = torch.diagonal(W, dim1=1, dim2=2).sum(dim=1).to(torch.float64) * norms.to(torch.float64)
    if not len(mass):
        return W
    order = torch.frexp(mass).exponent  # mass in [2^(e-1), 2^e), or 0 (with the lightest)
    order = torch.where(mass > 0, order, order.min())
    order = (order - order.min()).long()
    carried = torch.cumsum(torch.bincount(order, weights=mass), 0)  # by order of magnitude, lightest first
    orders = int((carried <= HESSIAN_MASS * mass.sum()).sum())  # carried is nondecreasing
    return W.masked_fill((order < orders)[:, None, None], 0.0) if orders else W


def newton_model(H, x, g, metric):
    """The Newton model at ``x`` (layout (|J|, c, |K|, d)) with the Hessian ``H`` restricted to these
    coefficients, ``g`` the gradient on them (both in H's dtype) and ``metric`` the loss's
    ``gradient_metric`` at x (at the prediction where H was taken): a :class:`.smooth.GramSmooth`
    (layout (c, |J|, |K|, d)), whose value at x is ``1/2 ||t||^2 - <B, x> + 1/2 x^T H x = 1/2 metric``."""
    hJ, c, nK, d = x.shape
    xm, gm = x.transpose(0, 1).reshape(c, -1), g.transpose(0, 1).reshape(c, -1)
    Hx = (xm.reshape(-1, H.shape[0]) @ H).view(c, -1)
    return GramSmooth(H, Hx - gm, _dot(xm, Hx) - 2.0 * _dot(xm, gm) + metric, hJ, nK, d)


def active_blocks(x, g, beta):
    """The (gate, token) blocks of the model, as local indices ``(J, K)`` (None: every block): those
    nonzero in ``x`` and the worst violators of ``||g_g|| <= beta`` (by ``max_l ||g_{j,l,k}|| / beta``),
    at most as many as are nonzero and at least ``ACTIVE_MIN``."""
    nonzero = (torch.linalg.vector_norm(x, dim=-1) > 0).any(dim=1)  # (|J|, |K|)
    score = torch.amax(torch.linalg.vector_norm(g, dim=-1), dim=1) / beta
    violators = (score > 1.0) & ~nonzero
    take = min(int(violators.sum()), max(ACTIVE_MIN, int(nonzero.sum())))
    blocks = nonzero.clone()
    if take:
        blocks.view(-1)[torch.topk(torch.where(violators, score, -math.inf).flatten(), take).indices] = True
    J, K = torch.nonzero(blocks.any(dim=1)).flatten(), torch.nonzero(blocks.any(dim=0)).flatten()
    if len(J) == 0 or len(J) * len(K) == blocks.numel():
        return None
    return J, K


def _take(x, JK):
    return x if JK is None else x.index_select(0, JK[0]).index_select(2, JK[1])


def _put(block, JK, shape):
    if JK is None:
        return block
    J, K = JK
    rows = torch.zeros((shape[0],) + tuple(block.shape[1:]), dtype=block.dtype, device=block.device)
    return torch.zeros(shape, dtype=block.dtype, device=block.device).index_copy_(2, K, rows.index_copy_(0, J, block))


def _newton_start(model, xm, gm, reg, target, scale, deadline, work=torch.float64):
    """Where no group that is zero in the model's start ``xm`` violates ``||gm_g|| <= beta`` (``gm``: the
    gradient there, in the model's layout; no violator let in: the support of x may well be the
    model's), Newton on that support (:func:`.newton.polish`) until its decrement is below the target
    gap; the model's gap then says whether the support was the right one. ``work``: the precision of
    that Newton iteration (the model's own where it is in the Hessian's precision). Returns the point
    to go on from, and whether the model's relative gap there is <= ``target``."""
    zero = torch.linalg.vector_norm(xm, dim=-1) == 0
    if bool(zero.all()):
        return xm, False
    if bool((torch.linalg.vector_norm(gm, dim=-1)[zero] > reg.beta).any()):
        return xm, False
    z = polish(model, xm, reg.beta, stop=target * scale, max_features=START_FEATURES, iterations=START_ITERATIONS,
               deadline=deadline, factor=torch.float32, work=work)  # the Hessian's own precision
    if z is None:
        return xm, False
    _, primal, dual = gap_at(model, reg, z)
    return z, relative_gap(primal, dual) <= target


def _line_search(sm, reg, x, ix, g, d, primal, slack):
    """The step along ``d`` (Armijo backtracking on ``P(x + s d)``, a unit step that P shows too short
    doubled while P keeps falling) and ``A d``; None where d is no descent direction at this precision
    (``slack``: P's rounding)."""
    Ad = sm.op.forward(d)  # the working set's tokens are contiguous: no gather of the active ones
    decrease = _dot(g, d) + float(reg.value(x + d)) - float(reg.value(x))  # < 0: the model's minimum is below q(x)
    if not decrease < 0.0:
        return None
    step = 1.0
    for _ in range(BACKTRACKS):
        trial = float(sm.loss.value(torch.add(ix, Ad, alpha=step), sm.T)) + float(reg.value(x + step * d))
        if trial <= primal + ARMIJO * step * decrease + slack:
            break
        step *= 0.5
    else:
        return None
    flatter = step == 1.0 and primal - trial > max(-FLATTER * decrease, 1e3 * slack)  # than the model
    while flatter and step < LONGEST:
        longer = float(sm.loss.value(torch.add(ix, Ad, alpha=2 * step), sm.T)) + float(reg.value(x + 2 * step * d))
        if not longer < trial:
            break
        step, trial = 2 * step, longer
    return step, Ad


def prox_newton(sm, x, reg, tol, budget, check_every=10, on_check=None, floor=math.inf, hessian_op=None, rounding=0.0,
                reuse=None):
    """Proximal Newton on ``sm`` + ``reg`` from ``x`` until the subproblem's relative gap is <= ``tol``.

    Parameters as :func:`.fista.fista` (``sm``: a :class:`.smooth.DataSmooth` whose op offers
    ``weighted_gram``); ``hessian_op``: the same operator in the precision of the Hessian (default
    ``sm.op``). ``budget.iterations`` counts Newton steps; the model's own iterations run under a
    budget of their own with the same deadline. ``floor``: relative gap below which ``STALL_STEPS`` steps
    in a row that do not lower it (by 1%), or a model that gives no descent step, end the subproblem as
    ``"floor"`` (the working precision's rounding: a float32 solve at small beta, where the line search
    accepts steps within rounding); ``rounding``: a gap (absolute) at P's rounding, treated alike
    whatever its relative gap (near interpolation); ``reuse(op)``: whether a Hessian of the active blocks'
    operator ``op`` costs more than the rest of a step, so that a lazy step may keep the last one (None: it may).

    Returns
    -------
    x, its image ``A x``, reason: ``"converged"``, ``"stalled"`` (no model, or no step that
    decreases P at this precision: the caller falls back to first order), ``"floor"`` (see ``floor``)
    or the budget that ran out.
    """
    hessian_op = sm.op if hessian_op is None else hessian_op
    slack = 64.0 * torch.finfo(x.dtype).eps  # P's rounding, relative
    ix = sm.image(x)
    restricted = {}  # active blocks -> (their operator in the Hessian's precision, its samples' norms, reuse(op))
    kept, served, last_gap = None, 0, math.inf  # last Hessian (active blocks, prediction, H by dtype), its reuses
    lipschitz = None  # the Lipschitz constant of the kept Hessian's model
    stepped = False  # ix is then updated from the steps, and A x recomputed once on return
    best, stale = math.inf, 0  # the best relative gap, and the steps since it last fell below the floor

    def fresh(x, ix):
        return sm.image(x) if stepped else ix

    while True:
        reason = budget.spent()
        if reason:
            return x, fresh(x, ix), reason
        g, V = sm.grad(x, ix)
        primal, dual = gap_terms(sm, reg, x, ix, float(sm.value(x, ix)), g, V)
        if on_check is not None:
            on_check(budget.iterations, primal, dual)
        rel = relative_gap(primal, dual)
        if rel <= tol:
            return x, fresh(x, ix), "converged"
        at_floor = floor > rel or primal - dual <= rounding
        stale = stale + 1 if at_floor and rel > 0.99 * best else 0  # below the precision's floor,
        best = min(best, rel)  # steps that no longer lower the gap: rounding decides
        if stale >= STALL_STEPS:
            return x, fresh(x, ix), "floor"
        JK = active_blocks(x, g, reg.beta)
        key = None if JK is None else (tuple(JK[0].tolist()), tuple(JK[1].tolist()))
        lazy = (kept is not None and kept[0] == key and served < LAZY_STEPS and restricted[key][2]
                and primal - dual <= LAZY_RATIO * last_gap)
        last_gap = primal - dual
        if lazy:
            served += 1
        else:
            if key not in restricted:  # the operator of these blocks and its samples' norms, kept for the next Hessians
                hop = hessian_op if JK is None else hessian_op.restrict(*JK)
                restricted[key] = hop, None if hop.streams else hop.sample_norms(), reuse is None or reuse(hop)
            hop, norms, _ = restricted[key]
            H = newton_hessian(hop, sm.loss, ix, sm.T, norms)
            kept, served, lipschitz = (key, ix, {H.dtype: H}), 0, None
        xa, ga = _take(x, JK), _take(g, JK)
        metric = float(sm.loss.gradient_metric(ix, sm.T, kept[1] if lazy else None))
        if not math.isfinite(metric):  # ||t|| overflows: an iterate far from any optimum (a sample's loss > ~700)
            return x, fresh(x, ix), "stalled"
        q_scale = max(abs(0.5 * metric + float(reg.value(xa))), 1e-300)  # the model's P at x, >= its optimum
        target = max(MODEL_GAP * (primal - dual), 0.5 * tol * dual, rounding) / q_scale  # a model gap <= the numerator
        Hs = kept[2]  # by dtype, the Hessian's own precision first
        low = next(iter(Hs))  # the model's too, where it is large and its target loose
        low = low if target >= LOW_MODEL_GAP and Hs[low].shape[0] >= LOW_MODEL_FEATURES else x.dtype
        for dtype in dict.fromkeys((low, x.dtype)):  # a model in low precision that gives no step: again in x's
            if dtype not in Hs:
                Hs[dtype] = next(iter(Hs.values())).to(dtype)
            xd, gd = xa.to(dtype), ga.to(dtype)
            model = newton_model(Hs[dtype], xd, gd, metric)
            xm, solved = _newton_start(model, model.from_canonical(xd), model.from_canonical(gd),
                                       reg, target, q_scale, budget.local_deadline(),
                                       dtype if dtype != x.dtype else torch.float64)
            if not solved:
                left = None if budget.deadline is None else max(0.0, budget.deadline - time.perf_counter())
                lipschitz = model.lipschitz_guess(None) if lipschitz is None else lipschitz  # the Hessian's, when kept
                eps = torch.finfo(dtype).eps
                xm, _, _, inner = fista(model, xm, reg, lipschitz, target, Budget(MODEL_ITER, left, budget.shards),
                                        check_every, None, 64.0 * eps, polish=Polisher(budget.local_deadline()),
                                        floor=max(floor, 1e6 * eps))
                if inner == "time_limit":
                    return x, fresh(x, ix), inner
            d = _put(model.to_canonical(xm).to(x.dtype) - xa, JK, x.shape)
            found = _line_search(sm, reg, x, ix, g, d, primal, slack * max(1.0, abs(primal)))
            if found is not None:
                break
        else:  # no descent step: at a gap below the floor, the precision's rounding
            return x, fresh(x, ix), "floor" if at_floor else "stalled"
        step, Ad = found
        x = torch.add(x, d, alpha=step)
        ix = torch.add(ix, Ad, alpha=step)  # A x without a pass over the data (rounding only; fresh on return)
        stepped = True
        budget.iterations += 1
