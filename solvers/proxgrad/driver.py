"""Proximal-gradient backend in torch (``solver="fista"``): every program, loss and regulariser,
CPU or CUDA, float64 or float32.

Celer-style outer loop around FISTA (:mod:`.fista`):

1. certify the current point in float64 on the whole problem (:mod:`.certifier`, the verifier's
   own function) and stop as soon as the relative gap of docs/conventions.md, ``(P - D) / D``, is
   <= ``tol`` (or the gap is <= ``atol``, when one is given); a gap at float64's rounding floor of P
   (near interpolation) that tol relative to D needs more than float64 resolves ends the solve
   with a status that says so, and names the atol that would accept it;
2. screen: blocks that the gap-safe test proves zero (groups; for the nuclear norm, a proved
   rank bound);
3. pick a working set (:mod:`.working_sets`): for the group lasso, the support and the worst KKT
   violations among (gate, token) blocks, doubling each round;
4. solve the restricted problem with FISTA, from the data in chunks of samples or, for a
   quadratic loss when it is cheaper, from the Gram matrix of the restricted program (iterations
   independent of N), with a Newton polish on a stable support; for the logistic and
   cross-entropy losses, by proximal Newton (:mod:`.prox_newton`: a Newton model of the loss in
   Gram form, solved like a squared loss, and a line search on the true objective) when a cost
   model says it pays, after as many first-order iterations as the Newton steps would cost when
   it is not clear that it does; back to 1.

The stopping rule is the certificate, never an iteration count: when ``max_iter`` or
``time_limit`` runs out first, the status says so and the verifier reports ``certified: false``.

A sharded problem (:mod:`cvxtransformer.solvers.distributed`) is solved the same way on every process: the
operators and the loss sum over the shards, every decision (step sizes, restarts, working sets,
screening, Gram or data path, budgets) is taken from numbers that are the same on every process,
and the replicated iterate is checked to be identical at every certified check.
"""
import math
import sys
import time
from dataclasses import replace

import numpy as np
import torch

from cvxtransformer.core.arrays import F64, device_budget, resolve_device, resolve_dtype
from cvxtransformer.core.certificate import relative_gap, rounding_floor, verdict
from cvxtransformer.core.contracts import NEWTON_FACES, TORCH_BACKEND
from cvxtransformer.core.errors import SolverError, invalid
from cvxtransformer.core.problem import ConvexProblem
from cvxtransformer.core.result import BackendOutput, Check
from cvxtransformer.core.threads import limited
from cvxtransformer.core.validation import check_bool, check_choice, check_positive, check_tol

from ..base import Solver
from .certifier import Certifier
from .fista import Budget, fista, overflow
from .newton import SMALL_SUPPORT, Polisher
from .prox_newton import prox_newton
from .smooth import DataSmooth, GramSmooth
from .working_sets import working_set_for

METHODS = ("auto", "gram", "data")
GRAM_BYTES = 2 * 2**30  # largest Gram matrix formed on the CPU
GEMM_SPEEDUP = {"cpu": 8.0, "cuda": 32.0}  # GEMM vs matrix-vector multiply-adds per second
NEWTON_FEATURES = 4096  # largest Newton model, c F features (the smooth non-quadratic losses)
NEWTON_STEPS, MODEL_ITERS = 10, 50  # typical Newton steps per subproblem, and iterations per model
FIRST_ORDER_MIN = 200  # first-order iterations a subproblem takes at least (the Newton model's cost model)
# Whether a working set not yet known to be settled is solved to tol (its Gram form) or loosely: a certified check
# reads the data twice (about PASS_RATE multiply-adds per second: the products stream X from memory, one CPU
# thread), SETTLE_ITERS more iterations on the Gram form take about ITER_SECONDS each (Python-level torch calls)
# plus their F^2 c multiply-adds at GEMM speed (GEMM_SPEEDUP times PASS_RATE). From a tenth of the gap, about ten
# iterations and a Newton polish reach tol ((8) squared, N=10,000, n=8, d=16, rho=0.8, 0.1 beta_max: a second
# check saved, 15.1 -> 10.7 ms of CPU).
PASS_RATE, ITER_SECONDS, SETTLE_ITERS = 1e9, 1e-4, 10
# An ungated Gram matrix, N F^2 / 2 multiply-adds of block-triangular GEMMs, costs this fraction of them at the
# model's GEMM rate: measured with one CPU thread, 13 G multiply-adds/s at N = 1,000 (F = 832) and 9 to 15 G at
# N = 10^4 to 10^5, against 1 to 1.7 G for a product that streams the data (it was 2.0: the Gram form was priced
# 3x too high, and a working set of 13 tokens of 64 at N = 1,000 stayed on the data path, 86 -> 64 ms a solve)
UNGATED_GRAM = 0.7
# A first-order run on a Gram form checks its gap once after this many iterations, besides every check_every / 2:
# a check there reads no data, and a small support is polished from it (the measurements: newton.SMALL_POLISH_GAP)
GRAM_FIRST_CHECK = 2


class ProxGrad(Solver):
    """Accelerated proximal gradient in torch with a certified stop (see the module docstring).

    Options
    -------
    device : "cpu" or "cuda" (or "cuda:i")
    dtype : "float64" or "float32", the working precision of the iterations (certificates are
        always float64; in float32 relative gaps below about 1e-6 may not be reachable, and the
        status then says "stalled"; a gap above a million roundings of the working dtype that
        decreases slowly is never called stalled, and runs on to the budget)
    max_iter : int, budget of proximal-gradient iterations over all working sets, a Newton step
        counting as one (default 20000)
    time_limit : seconds, or None
    progress : print the certified gap and objective as the solve goes (stderr)
    chunk_size : samples per chunk of data products (None: automatic)
    init : warm start, coefficients in the program's shape
    screen : gap-safe screening of blocks proved zero
    screen_norms : "exact" computes the operator norm of every group once per program (cached,
        e.g. along a path); "auto" uses it when cached and the bound ``||A_g||_F`` otherwise
    working_set : solve growing working sets of blocks (False: always the whole problem)
    method : "auto" (cost models), "gram" or "data": a quadratic loss from the Gram matrix of the
        working set or from the data; the logistic and cross-entropy losses by proximal Newton (its
        model in Gram form, wherever the operator offers one) or by first order only
    check_every : iterations between gap checks of the inner solver
    p0 : blocks in the first working set
    threads : CPU threads for torch and BLAS during the solve (None: torch's setting; small products
        always run on one thread: :mod:`cvxtransformer.core.threads`)
    stop : callable(primal, dual) -> bool, checked at every certified check: stop early when true
        (the verifier's refinement uses it)
    features : "auto" (default): solve on fewer coordinates per token where the program offers it and it
        pays (``program.on_features``: fewer samples than coordinates; the same optimum, outputs and dual
        points, Z mapped back), or False
    residual_dual : return the best dual point V even when it is the scaled residual of the returned Z
        (False: V is then None, since the verifier recomputes that point from Z itself, and only a better
        one from an earlier iterate is returned: :func:`cvxtransformer.solve` passes False)
    """

    name = "fista"
    forms = ("primal",)
    requires = TORCH_BACKEND
    options = ("device", "dtype", "max_iter", "time_limit", "progress", "chunk_size", "init", "screen",
               "working_set", "method", "check_every", "p0", "screen_norms", "threads", "stop", "features",
               "residual_dual")
    defaults = dict(device="cpu", dtype="float64", max_iter=20_000, time_limit=None, progress=False,
                    chunk_size=None, init=None, screen=True, working_set=True, method="auto", check_every=10,
                    p0=10, screen_norms="auto", threads=None, stop=None, features="auto", residual_dual=True)

    def validate(self, problem, form, options):
        super().validate(problem, form, options)
        if not problem.loss.quadratic and options.get("method") != "data":  # proximal Newton's model
            self.check_requires(problem, NEWTON_FACES, 'pass method="data" (first order only) or another solver')
        self.checked_options(problem, options)

    def checked_options(self, problem, options):
        """The options with defaults, validated; errors name the option."""
        o = dict(self.defaults, **options)
        o["device"], o["dtype"] = resolve_device(o["device"]), resolve_dtype(o["dtype"])
        o["max_iter"] = check_positive("max_iter", o["max_iter"], integer=True)
        o["time_limit"] = check_positive("time_limit", o["time_limit"], none_ok=True)
        o["chunk_size"] = check_positive("chunk_size", o["chunk_size"], integer=True, none_ok=True)
        o["check_every"] = check_positive("check_every", o["check_every"], integer=True)
        o["p0"] = check_positive("p0", o["p0"], integer=True)
        o["threads"] = check_positive("threads", o["threads"], integer=True, none_ok=True)
        for flag in ("progress", "screen", "working_set"):
            o[flag] = check_bool(flag, o[flag])
        check_choice("screen_norms", o["screen_norms"], ("auto", "exact"))
        check_choice("method", o["method"], METHODS)
        layout = problem.regularizer.gram_layout
        if o["method"] == "gram" and (layout is None or (layout == "canonical" and not problem.loss.quadratic)):
            raise invalid("method", '"auto" or "data" here', '"gram"',
                          "the Gram representation (squared loss) needs a regulariser with a Gram layout, and the "
                          "Newton model in Gram form (other losses) one with a block per output (the group lasso)")
        if o["init"] is not None:
            o["init"] = problem.program.check_Z(o["init"], "init")
        if o["stop"] is not None and not callable(o["stop"]):
            raise invalid("stop", "a callable(primal, dual) -> bool or None", repr(o["stop"]))
        if not (o["features"] is False or o["features"] == "auto"):
            raise invalid("features", "'auto' or False", repr(o["features"]))
        if not isinstance(o["residual_dual"], bool):
            raise invalid("residual_dual", "True or False", repr(o["residual_dual"]))
        return o

    def solve(self, problem, form="primal", tol=1e-6, verbose=False, atol=None, **options):
        """Solve to a certified relative gap ``tol`` (or an absolute gap ``atol``, when given); returns a
        :class:`BackendOutput` with Z in the program's shape, the best dual point V, the screened
        blocks and the history of checks."""
        if form != "primal":
            raise invalid("form", '"primal" for solver fista', repr(form))
        tol, atol = check_tol(tol), check_positive("atol", atol, none_ok=True)
        o = self.checked_options(problem, options)
        on_features = o["features"] and getattr(problem.program, "on_features", None)
        reduced = on_features() if on_features else None
        if reduced is not None:
            return self._solve_on_features(problem, reduced, tol, verbose, atol, dict(options, init=o["init"]))
        t_start = time.perf_counter()
        shards = problem.program.shards
        budget = Budget(o["max_iter"], o["time_limit"], shards)
        N = problem.program.N if shards is None else shards.total
        work = N * int(np.prod(problem.program.canonical_shape))
        with limited(o["threads"], work, o["device"]):
            run = _Run(problem, o, o["progress"] or verbose, t_start)
            status = run.loop(tol, budget, o, atol)
        t_end = time.perf_counter()
        own = run.cert.best_is_last  # V_best is the scaled residual of the returned point
        V = None if run.cert.V_best is None or (own and not o["residual_dual"]) else run.cert.V_best.cpu().numpy()
        return BackendOutput(Z=run.x.cpu().numpy().reshape(problem.program.shape), V=V,
                             status=status, build_seconds=run.build_seconds,
                             solve_seconds=t_end - t_start - run.build_seconds, iterations=budget.iterations,
                             history=run.history, screened=run.ws.screened_mask())


    def _solve_on_features(self, problem, reduced, tol, verbose, atol, options):
        """Solve the program on fewer coordinates per token (``program.on_features``) and map the solution
        back: the same objective, outputs and dual point. Directions of a nuclear norm beyond the fewer
        coordinates are zero at every optimum (screened)."""
        Q, small = reduced
        program = problem.program
        options["features"] = False
        if options["init"] is not None:
            options["init"] = program.restrict(options["init"].reshape(program.canonical_shape), Q).reshape(small.shape)
        sub = ConvexProblem(small, problem.loss, problem.T, problem.regularizer, problem.classes)
        out = self.solve(sub, "primal", tol, verbose, atol, **options)
        screened = out.screened
        if screened is not None and hasattr(problem.regularizer, "matrices"):
            _, p, q = problem.regularizer.matrices(program.shape)
            fill = np.ones(screened.shape[:-1] + (min(p, q) - screened.shape[-1],), dtype=bool)
            screened = np.concatenate([screened, fill], axis=-1)
        Z = program.lift(out.Z.reshape(small.canonical_shape), Q).reshape(program.shape)
        return replace(out, Z=Z, screened=screened)


class _Run:
    """State of one solve: data on the device, the certifier, the iterate, the history."""

    def __init__(self, problem, o, progress, t_start):
        p = problem.program
        device, dtype, chunk = o["device"], o["dtype"], o["chunk_size"]
        self.problem, self.device, self.dtype, self.chunk = problem, device, dtype, chunk
        self.shards = p.shards  # None, or the data shards of a distributed solve
        progress = progress and (self.shards is None or self.shards.rank == 0)
        self.progress, self.t_start, self.history = progress, t_start, []
        self.op64 = p.operator(device, F64, chunk)
        self.T64 = torch.from_numpy(np.ascontiguousarray(problem.T, dtype=float)).to(device)
        self.cert = Certifier(problem, self.op64, self.T64)
        self.rounding = rounding_floor(problem)  # float64's rounding floor of P (the certificate's)
        # a gap (absolute) at P's rounding in the working precision, whatever the relative gap (near interpolation)
        self.rounding_w = self.rounding * torch.finfo(dtype).eps / torch.finfo(F64).eps
        self.ws = working_set_for(problem, self.op64, o["screen_norms"])
        self.opw = self.op64 if dtype == F64 else p.operator(device, dtype, chunk)
        self.Tw = self.T64 if dtype == F64 else self.T64.to(dtype)
        self.x = torch.zeros(p.canonical_shape, dtype=F64, device=device)
        if o["init"] is not None:
            self.x = torch.from_numpy(np.ascontiguousarray(o["init"])).reshape(p.canonical_shape).to(device)
        self.cache, self.last_iters, self.newton_needed = {}, None, False
        newton = not problem.loss.quadratic and self.ws.polishable and hasattr(self.opw, "weighted_gram")
        self.newton_first = newton and o["method"] != "data" and (o["method"] == "gram" or
                                                                  self._newton_warmup(self.opw) == 0)
        self.build_seconds = time.perf_counter() - t_start

    def log(self, kind, iteration, primal, dual, screened=None, ws=None, method=None):
        gap = primal - dual
        entry = Check(kind=kind, iteration=iteration, seconds=time.perf_counter() - self.t_start, primal=primal,
                      dual=dual, gap=gap, relative_gap=relative_gap(primal, dual), screened=screened,
                      working_set=ws, method=method)
        self.history.append(entry)
        if self.progress:
            extra = "" if kind != "certified" else f"  screened {screened}  working set {ws}"
            print(f"fista {kind:9s} it {iteration:6d}  {entry.seconds:8.2f}s  P {primal:.10g}  "
                  f"rel gap {entry.relative_gap:.3e}{extra}", file=sys.stderr, flush=True)

    def loop(self, tol, budget, o, atol=None):
        ws_size, method_used, floor_hits, best_rel, Yhat, n_screened = 0, None, 0, np.inf, None, 0
        # A settled working set is solved to tol itself the first time (float64: its gap is the
        # certificate's but for the dual scaling over the blocks outside it), to half of it after that.
        margin = 1.0 if self.dtype == F64 else 0.5
        floor = 1e6 * torch.finfo(self.dtype).eps  # gaps above a million roundings are not a precision floor
        zero = self._scores_at_zero(o)  # the first check at x = 0 without a pass over the data, where known
        while True:
            if zero is None and Yhat is None and self.ws.restricts_forward and not getattr(self.op64, "streams", False):
                Yhat = self.ws.forward(self.x)  # the gates where x is nonzero only (the program's map reads every gate)
            chk = self.cert.check(self.x, Yhat, zero)
            zero = None
            budget.reserve = chk.seconds  # the iterations leave time for the last check within the time limit
            for what, value in (("the objective at the iterate", chk.primal), ("the dual objective", chk.dual)):
                if not math.isfinite(value):
                    raise overflow(what, value)
            if self.shards is not None and not self.shards.same(self.x):
                raise SolverError("distributed: the processes' iterates differ (their replicated arithmetic is not "
                                  "identical: run every process with the same torch build, device type and threads)")
            _, by, note = verdict(chk.primal, chk.dual, tol, atol, self.rounding)
            done = by is not None
            if o["screen"] and chk.relative_gap < 1e-2 and (not done or self.ws.norms_known()):
                n_screened = self.ws.screen(self.cert.G_best, self.cert.radius(chk.gap))
            self.log("certified", budget.iterations, chk.primal, chk.dual, n_screened, ws_size, method_used)
            if done:
                return (f"certified: relative gap {chk.relative_gap:.2e} <= tol" if by == "relative"
                        else f"certified: gap {chk.gap:.2e} <= atol {atol:g}")
            if o["stop"] is not None and o["stop"](chk.primal, chk.dual):
                return f"stopped by the caller: relative gap {chk.relative_gap:.2e}"
            reason = budget.spent()
            if reason:
                return f"{reason} reached: relative gap {chk.relative_gap:.2e} > tol {tol:g}"
            grow = o["working_set"] and not self.newton_first  # Newton keeps its own active blocks: take every violator
            key, settled, ws_size = self.ws.next(chk, self.x, grow, o["p0"])
            at_rounding = chk.gap <= self.rounding  # float64's own floor: whether or not the working set settled
            low = (settled and floor > chk.relative_gap) or at_rounding
            floor_hits = floor_hits + 1 if low and chk.relative_gap > 0.5 * best_rel else 0
            best_rel = min(best_rel, chk.relative_gap)
            if floor_hits >= 3 and at_rounding:
                return f"floor: {note}"
            if floor_hits >= 3:
                precision = str(self.dtype).replace("torch.", "")
                return (f"stalled at relative gap {chk.relative_gap:.2e} > tol {tol:g}: the {precision} "
                        "working precision cannot certify less")
            sm, op, method_used = self.subproblem(key, o["method"])
            # an unsettled set is solved loosely (a tenth of the way), unless a check costs more than solving it
            # to tol (the Gram form, whose iterations do not read the data, on many samples), or than its polish (a
            # Newton system of at most SMALL_SUPPORT features: polished at the first check, at any gap, which a loose
            # tolerance could stop before, and a second round would follow: 2 of 6 seeds of (8) squared, N=1,000,
            # n=8, d=16, rho=0, 3 tokens held: 2.5-2.6 -> 1.9 ms of CPU)
            on_gram = method_used == "gram"
            costly_check = on_gram and self._check_seconds() > SETTLE_ITERS * self._gram_seconds(op)
            full = settled or costly_check or (on_gram and self.ws.polishable and op.hJ * op.F <= SMALL_SUPPORT)
            inner_tol = margin * tol if full else max(0.5 * tol, 0.3 * min(chk.relative_gap, 1.0))
            if atol is not None and chk.dual > 0:  # the relative gap that atol stands for here
                inner_tol = max(inner_tol, margin * atol / chk.dual)
            margin = 0.5 if settled else margin
            x = sm.from_canonical(self.ws.extract(self.x, key).to(self.dtype))
            slack = 1e-9 if self.dtype == F64 else 1e-4
            polish = None
            if self.ws.polishable and sm.quadratic:
                # where a check costs about a gap of the Gram form, a small support's polish is returned unchecked, to
                # that check (:class:`Polisher`), and one Polisher serves the working set, so that a support is
                # polished once ((8) squared, N=1,000, n=8, d=16, 0.1 beta_max, six seeds at rho 0 and 0.8: 0.1 ms of
                # CPU less, 1.9 -> 1.8 and 2.45 -> 2.35 ms)
                unchecked = on_gram and not costly_check
                polish = self.cache.get("polisher") if unchecked else None
                if polish is None:
                    polish = Polisher(unchecked=unchecked)
                    if unchecked:
                        self.cache["polisher"] = polish
                polish.deadline = budget.local_deadline()
            it0 = budget.iterations

            def on_check(k, primal, dual):
                self.log("inner", k, primal, dual)

            size = int(np.prod(op.shape))
            work = size * (size // self.problem.program.n_outputs if method_used == "gram" else op.N_total)
            with limited(None, work, self.device):
                reason = None
                if method_used == "newton" and self.cache["warmup"] and not self.newton_needed:
                    x, ix, reason = self.first_order(sm, x, inner_tol, budget, o, on_check, slack, polish, floor,
                                                     self.cache["warmup"])  # first order while it is the better bet
                    self.newton_needed = reason != "converged"  # a hard problem: later subproblems start with Newton
                if method_used == "newton" and reason != "converged":
                    x, ix, reason = prox_newton(sm, x, self.problem.regularizer, inner_tol, budget, o["check_every"],
                                                on_check, floor, self._hessian_op(key), self.rounding_w,
                                                self._reuse_pays(sm.op))
                # no Newton step: first order finishes; but not where float32's rounding stopped the Newton steps
                # ("floor"): first order only stalls there too, and the driver declares the stall 3 checks later
                if method_used != "newton" or reason == "stalled" or reason == "floor" and self.dtype == F64:
                    rent = self._rent(op, o["method"]) if method_used == "data" else None
                    x, ix, reason = self.first_order(sm, x, inner_tol, budget, o, on_check, slack, polish, floor, rent)
                    if reason == "limit":  # the data path has cost as much as the Gram form: form it and go on
                        gram, op, method_used = self.subproblem(key, "gram")
                        x = gram.from_canonical(sm.to_canonical(x))
                        x, ix, reason = self.first_order(gram, x, inner_tol, budget, o, on_check, slack, polish, floor)
                        sm = gram
            self.last_iters = budget.iterations - it0
            block = sm.to_canonical(x).to(F64)
            self.x = self.ws.embed(block, key)
            # A x in float64 is at hand: the check reuses it (one pass, the adjoint), unless the check should end the
            # solve (a settled set solved to tol) and can be the verifier's own (residual_of, two passes), which
            # cvxtransformer.solve's certificate reads back: with A x reused, the certificate read the data twice more
            last = settled and reason == "converged" and self.cert.verifier
            Yhat = ix if self.dtype == F64 and method_used != "gram" and not last else None

    def _scores_at_zero(self, o):
        """``A^T (-grad L(0))`` (canonical, float64, on the device) when the solve starts at 0 and
        ``problem.beta_max()`` computed it already (as ``cvxtransformer.solve`` does), else None."""
        scores = self.problem.scores_at_zero()
        if scores is None or o["init"] is not None or self.shards is not None:
            return None
        return torch.from_numpy(np.ascontiguousarray(scores)).reshape(self.x.shape).to(self.device)

    def first_order(self, sm, x, tol, budget, o, on_check, slack, polish, floor, limit=None):
        """FISTA on ``sm`` (at most ``limit`` iterations: then reason ``"limit"``), from a Lipschitz estimate kept
        per working set. Its gap is checked every ``check_every`` iterations, twice as often on a Gram form (a
        check reads no data there, and the Newton polish waits for a support stable across two checks), and there
        once after ``GRAM_FIRST_CHECK`` iterations: a small support is polished from there (:mod:`.newton`)."""
        ix = None
        if "L" not in self.cache:  # refined by backtracking
            ix = None if isinstance(sm, GramSmooth) else sm.image(x)  # shared with fista's start
            self.cache["L"] = sm.lipschitz_guess(None if ix is None else sm.grad(x, ix)[0])
        cap, start = budget.max_iter, budget.iterations
        if limit is not None:
            budget.max_iter = min(cap, budget.iterations + limit)
        try:
            gram = isinstance(sm, GramSmooth)
            every = max(1, o["check_every"] // 2) if gram else o["check_every"]
            x, ix, self.cache["L"], reason = fista(sm, x, self.problem.regularizer, self.cache["L"], tol, budget,
                                                   every, on_check, slack, polish=polish, floor=floor,
                                                   rounding=self.rounding_w, ix=ix,
                                                   first_check=GRAM_FIRST_CHECK if gram else None)
        finally:
            budget.max_iter = cap
        self.cache["spent"] = self.cache.get("spent", 0) + budget.iterations - start  # on this working set
        return x, ix, "limit" if reason == "max_iter" and budget.iterations < cap else reason

    def subproblem(self, key, method):
        """The smooth part of the program restricted to the working set ``key``, how it is evaluated,
        and its operator. The Gram matrix, or the data path's smooth part (which reads the working set's
        tokens in place), is kept while the working set does not change."""
        cache_key = None if key is None else tuple(tuple(k.tolist()) for k in key)
        if self.cache.get("key", "none") != cache_key:
            grown = (self.cache["key"], self.cache["op"], self.cache["gram"]) if "gram" in self.cache else None
            self.cache = {"key": cache_key, "op": self.ws.restrict(self.opw, key), "grown": grown}
        op = self.cache["op"]
        quadratic = self.problem.loss.quadratic
        use_gram = hasattr(op, "gram") and quadratic and (method == "gram" or (method == "auto" and self._gram_pays(op)))
        if not use_gram:
            if "data" not in self.cache:
                work = 100.0 * GEMM_SPEEDUP[self.device.type] * op.N_total * int(np.prod(op.shape))  # polish's Gram
                self.cache["data"] = DataSmooth(op, self.problem.loss, self.Tw, work)
            sm = self.cache["data"]
            if "warmup" not in self.cache:
                usable = not quadratic and self.ws.polishable and hasattr(sm.op, "weighted_gram")
                self.cache["warmup"] = None if not usable or method == "data" else (
                    0 if method == "gram" else self._newton_warmup(sm.op))
            return sm, sm.op, "data" if self.cache["warmup"] is None else "newton"
        if "gram" not in self.cache:
            H, B = self._grown_gram(op, cache_key) or op.gram(self.Tw)
            tt = float(torch.sum(self.T64 * self.T64))
            tt = tt if self.shards is None else self.shards.sum_value(tt)
            self.cache["gram"] = GramSmooth(H, B, tt, op.hJ, op.nK, op.d,
                                            canonical=self.problem.regularizer.gram_layout == "canonical")
        return self.cache["gram"], op, "gram"

    def _grown_gram(self, op, key):
        """(H, B) of the working set ``key`` from the Gram form of the previous one when it only gained
        tokens (same gates, ungated op): only the columns of the new tokens are summed, ``N F_old F_new +
        N F_new^2 / 2`` multiply-adds instead of ``N F^2 / 2`` (a set grown from 4 to 14 to 16 blocks sums
        each column once); None where that does not apply."""
        grown, self.cache["grown"] = self.cache.get("grown"), None
        if grown is None or key is None or not hasattr(op, "cross_gram") or op.mask is not None:
            return None
        (J_old, K_old), op_old, gram_old = grown
        (J, K), d = key, op.d
        pos = {k: i for i, k in enumerate(K)}
        if J_old != J or not set(K_old) <= set(K) or gram_old.coupled:
            return None
        feats = lambda ks: (torch.tensor([pos[k] for k in ks])[:, None] * d + torch.arange(d)).reshape(-1)  # noqa: E731
        added = [k for k in K if k not in set(K_old)]
        io, ia = feats(K_old).to(op.device), feats(added).to(op.device)
        op_add = self.ws.restrict(self.opw, (torch.tensor(J), torch.tensor(added)))
        H_add, B_add = op_add.gram(self.Tw)
        C = op_old.cross_gram(op_add)
        F = len(K) * d
        H = torch.empty(F, F, dtype=H_add.dtype, device=op.device)
        H[io[:, None], io[None, :]] = gram_old.H
        H[ia[:, None], ia[None, :]] = H_add
        H[io[:, None], ia[None, :]] = C
        H[ia[:, None], io[None, :]] = C.T
        B = torch.empty(B_add.shape[0], F, dtype=B_add.dtype, device=op.device)
        B[:, io], B[:, ia] = gram_old.B, B_add
        return H, B

    def _hessian_op(self, key):
        """The working set's operator in float32, the precision of the Newton model's Hessian (None: the
        working precision is float32 already); it reads the working set's tokens of the float32 data."""
        if self.dtype == torch.float32:
            return None
        if "op32" not in self.cache:
            self.cache["op32"] = self.ws.restrict(self.problem.program.operator(self.device, torch.float32, self.chunk),
                                                  key)
        return self.cache["op32"]

    def _hessian_work(self, op):
        """A Newton Hessian of ``op`` in multiply-adds of a product that streams its matrix once (float32 GEMMs,
        about ``1.5 GEMM_SPEEDUP`` times faster per multiply-add; ``c (c + 1) / 2`` weighted Gram matrices)."""
        c = self.problem.program.n_outputs
        return c * (c + 1) / 2 * op.weighted_gram_cost() / (1.5 * GEMM_SPEEDUP[self.device.type])

    def _reuse_pays(self, op):
        """For :func:`.prox_newton.prox_newton`: whether a Hessian of the active blocks (an operator) costs more
        than the rest of a Newton step on the working set ``op``, its gradient and line search (two passes)."""
        step = 2.0 * op.N_total * int(np.prod(op.shape))
        return lambda active: self._hessian_work(active) > step

    def _newton_warmup(self, op):
        """Ski rental between first order and the Newton model (:mod:`.prox_newton`) on this working set:
        None when the model does not fit (``c F > NEWTON_FEATURES``), else the first-order iterations to
        run before it: 0 when ``NEWTON_STEPS`` Newton steps cost no more than ``FIRST_ORDER_MIN``
        iterations, else as many iterations as they cost, so that a subproblem never costs much more
        than twice the better of the two. Costs in multiply-adds of products that stream a matrix
        once: an iteration ``2 N F c``; a Newton step ``c(c+1)/2 op.weighted_gram_cost()`` for the
        Hessian (``N F^2 / 2`` per pair of outputs, less on gated programs; float32 GEMMs, about
        ``1.5 GEMM_SPEEDUP`` times faster per multiply-add than a float64 product that streams the
        data; an upper bound, as the model keeps the active blocks only) and ``MODEL_ITERS``
        iterations of ``(cF)^2`` on the model. Once a subproblem needed Newton steps, the later
        ones of the solve start with them."""
        c, F, N = self.problem.program.n_outputs, op.hJ * op.F, op.N_total
        if c * F > NEWTON_FEATURES:
            return None
        step = self._hessian_work(op) + MODEL_ITERS * (c * F) ** 2
        k = NEWTON_STEPS * step / (2.0 * N * F * c)
        return 0 if k <= FIRST_ORDER_MIN else int(k)

    def _rent(self, op, method):
        """Ski rental between the data path and the Gram form of a quadratic loss: the data-path iterations
        left on this working set before they have cost as much as forming its Gram matrix (``_gram_pays``'s
        costs), after which it is formed (None: it cannot or may not be). At most twice the cost of the
        better of the two, whatever the number of iterations the set needs (the cost model's guess of 100
        can be far off: (12) squared, N=10,000, 16 gates, 0.01 beta_max needs 650 on the data path)."""
        if method != "auto" or not self.problem.loss.quadratic or not hasattr(op, "gram") or not self._gram_fits(op):
            return None
        t_data, t_build, _ = self._costs(op)
        return max(1, int(t_build / t_data) - self.cache.get("spent", 0))

    def _gram_fits(self, op):
        """Whether the Gram matrix of ``op`` fits (``GRAM_BYTES`` on the CPU, half the device's free memory)."""
        F = op.hJ * op.F
        room = device_budget(self.device)
        if self.shards is not None:  # the smallest device decides, for every process
            room = -float(self.shards.max_(torch.tensor([-room], dtype=F64))[0])
        return F * F * op.X.element_size() <= min(GRAM_BYTES, room)

    def _check_seconds(self):
        """About what a certified check costs: two passes over the data (forward and adjoint)."""
        N = self.problem.program.N if self.shards is None else self.shards.total
        return 2.0 * N * int(np.prod(self.problem.program.canonical_shape)) / PASS_RATE

    def _gram_seconds(self, op):
        """About what an iteration on the Gram form of ``op`` costs."""
        F = op.hJ * op.F
        return ITER_SECONDS + F * F * self.problem.program.n_outputs / (GEMM_SPEEDUP[self.device.type] * PASS_RATE)

    def _gram_pays(self, op):
        """Cost model: forming H (N F^2 multiply-adds ungated, at GEMM speed) and iterations of F^2 c,
        against iterations that stream the N x F data twice. A GEMM runs about ``GEMM_SPEEDUP``
        times faster per multiply-add than a product that streams its matrix once."""
        if "gram" in self.cache:  # formed already for this working set
            return True
        if not self._gram_fits(op):
            return False
        t_data, t_build, t_gram_iter = self._costs(op)
        k = 100 if self.last_iters is None else max(50, 1.5 * self.last_iters)
        return t_build + k * t_gram_iter < k * t_data

    def _costs(self, op):
        """Costs in multiply-adds of a product that streams its matrix once: an iteration on the data (its two
        products; gated, twice that: the gates' weights and sums cost about as much again), forming H (at
        GEMM speed: ungated ``UNGATED_GRAM N F^2 / 2`` for the block-triangular sums over block rows, gated the exact
        ``weighted_gram_cost`` of its pairs of gates) and an iteration on H. Measured on (12) squared,
        N=10,000, 16 gates, 128 features a gate, one CPU thread: a data iteration 6 ms, H 0.46 s."""
        F = op.hJ * op.F
        r = GEMM_SPEEDUP[self.device.type]
        c = self.problem.program.n_outputs
        gated = op.mask is not None and op.hJ > 1
        t_data = 2.0 * op.N_total * op.F * max(1.0, op.hJ * c / r) * (2.0 if gated else 1.0)
        t_build = ((1.0 if gated else UNGATED_GRAM) * op.weighted_gram_cost() + op.N_total * F * c) / r
        return t_data, t_build, F * F * max(1.0, c / r)
