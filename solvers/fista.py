"""Proximal-gradient backend in torch: programs (8), (10), (12), every loss, CPU or CUDA.

Celer-style outer loop around an accelerated proximal gradient (:mod:`solvers.apg`):

1. certify the current point in float64 on the whole problem (:mod:`solvers.torch_certify`)
   and stop as soon as the relative gap of SPEC.md is <= ``tol``;
2. discard the groups that gap-safe screening proves zero;
3. pick a working set of (gate, token) blocks: the support and the worst KKT violations,
   doubling each round;
4. solve the program restricted to those gates J and tokens K with FISTA, from the data in
   chunks of samples or, for the squared loss when it is cheaper, from the Gram matrix of the
   restricted program (iterations independent of N); back to 1.

The stopping rule is the certificate, never an iteration count: when ``max_iter`` or
``time_limit`` runs out first, the status says so and the verifier reports ``certified: false``.
"""
import contextlib
import sys
import time

import numpy as np
import torch

from cvxtransformer.errors import invalid

from . import BackendOutput
from .apg import Budget, apg
from .smooth import DataSmooth, GramSmooth
from .torch_certify import Certifier
from .torch_losses import torch_loss
from .torch_ops import device_budget, make_data_op, resolve_device, resolve_dtype, to_storage

METHODS = ("auto", "gram", "data")
GRAM_BYTES = 2 * 2**30  # largest Gram matrix formed on the CPU
GEMM_SPEEDUP = {"cpu": 8.0, "cuda": 32.0}  # GEMM vs matrix-vector multiply-adds per second
SMALL_WORK = 2e6  # multiply-adds per product below which CPU products run on one thread


@contextlib.contextmanager
def cpu_threads(device, work, threads=None):
    """``threads`` CPU threads (one while products are small: splitting them costs more than it
    saves, and on a loaded machine every parallel region waits for a descheduled thread)."""
    want = 1 if work < SMALL_WORK else threads
    if device.type != "cpu" or want is None or want == torch.get_num_threads():
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(want)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _positive(name, value, integer=False, none_ok=False):
    if value is None and none_ok:
        return None
    kind = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0 or not np.isfinite(value):
        what = "an integer >= 1" if integer else "a number > 0"
        raise invalid(name, what + (" or None" if none_ok else ""), repr(value))
    return int(value) if integer else float(value)


def solve_fista(problem, form="primal", tol=1e-6, verbose=False, device="cpu", dtype="float64",
                max_iter=20_000, time_limit=None, progress=False, chunk_size=None, init=None,
                screen=True, working_set=True, method="auto", check_every=10, p0=10,
                screen_norms="auto", threads=None):
    """Solve program (8), (10) or (12) by accelerated proximal gradient, to a certified gap.

    Parameters
    ----------
    problem : ConvexProblem
    form : "primal" only
    tol : float, relative duality gap (SPEC.md) at which to stop, checked in float64
    device : "cpu" or "cuda" (or "cuda:i")
    dtype : "float64" or "float32", the working precision of the iterations (certificates are
        always float64; in float32 relative gaps below about 1e-6 may not be reachable, and the
        status then says "stalled")
    max_iter : int, budget of proximal-gradient iterations over all working sets
    time_limit : seconds, or None
    progress, verbose : print the certified gap and objective as the solve goes (stderr)
    chunk_size : samples per chunk of data products (None: automatic)
    init : warm start, coefficients in the program's shape or canonical (h, c, n, d)
    screen : gap-safe screening of groups proved zero
    screen_norms : "exact" computes the operator norm of every group once per program (cached,
        e.g. along a path); "auto" uses it when cached and the bound ``||A_g||_F`` otherwise
    working_set : solve growing working sets of blocks (False: always the whole problem)
    method : "auto" (cost model), "gram" or "data": how the squared loss is evaluated
    check_every : iterations between gap checks of the inner solver
    p0 : blocks in the first working set
    threads : CPU threads for torch during the solve (None: torch's setting; small products
        always run on one thread)

    Returns
    -------
    BackendOutput with Z4 (h, c, n, d) float64, the best dual point V (N, c), the status, the
    iteration count and the history (one dict per gap check).
    """
    if form != "primal":
        raise invalid("form", '"primal" for solver fista', repr(form))
    tol = _positive("tol", tol)
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    max_iter = _positive("max_iter", max_iter, integer=True)
    time_limit = _positive("time_limit", time_limit, none_ok=True)
    chunk_size = _positive("chunk_size", chunk_size, integer=True, none_ok=True)
    check_every = _positive("check_every", check_every, integer=True)
    p0 = _positive("p0", p0, integer=True)
    threads = _positive("threads", threads, integer=True, none_ok=True)
    if screen_norms not in ("auto", "exact"):
        raise invalid("screen_norms", '"auto" or "exact"', repr(screen_norms))
    if method not in METHODS:
        raise invalid("method", f"one of {METHODS}", repr(method))
    if method == "gram" and problem.loss.name != "squared":
        raise invalid("method", '"auto" or "data" for the ' + problem.loss.name + " loss",
                      '"gram"', "the Gram representation needs the squared loss")
    t_start = time.perf_counter()
    budget = Budget(max_iter, time_limit)
    h, c, n, d = problem.program.canonical_shape
    with cpu_threads(dev, problem.program.N * h * c * n * d, threads):
        run = _Run(problem, dev, dt, chunk_size, init, progress or verbose, t_start, screen_norms)
        status = run.loop(tol, budget, screen, working_set, method, check_every, p0)
    run.history[-1]["screened_mask"] = run.cert.screened.cpu().numpy()
    t_end = time.perf_counter()
    return BackendOutput(Z4=run.x4.cpu().numpy(), V=run.cert.V_best.cpu().numpy(), status=status,
                         build_seconds=run.build_seconds, solve_seconds=t_end - t_start - run.build_seconds,
                         iterations=budget.iterations, history=run.history)


class _Run:
    """State of one solve: data on the device, the certifier, the iterate, the history."""

    def __init__(self, problem, device, dtype, chunk, init, progress, t_start, norms):
        p = problem.program
        self.problem, self.device, self.dtype, self.chunk = problem, device, dtype, chunk
        self.progress, self.t_start, self.history = progress, t_start, []
        self.h, self.c, self.n, self.d = p.canonical_shape
        self.X64 = to_storage(p.X, device, torch.float64)
        self.mask64 = None if p.mask is None else torch.from_numpy(p.mask).to(device)
        self.T64 = torch.from_numpy(np.ascontiguousarray(problem.T, dtype=float)).to(device)
        op64 = make_data_op(self.X64, self.mask64, self.c, range(self.h), range(self.n), device,
                            torch.float64, chunk)
        self.cert = Certifier(problem, op64, self.T64, norms)
        if dtype == torch.float64:
            self.Xw, self.maskw, self.Tw = self.X64, self.mask64, self.T64
        else:
            self.Xw = to_storage(self.X64, device, dtype)
            self.maskw = None if self.mask64 is None else self.mask64.to(dtype)
            self.Tw = self.T64.to(dtype)
        self.tloss = torch_loss(problem.loss)
        self.x4 = torch.zeros(p.canonical_shape, dtype=torch.float64, device=device)
        if init is not None:
            Z0 = np.asarray(init, dtype=float)
            Z0 = Z0 if Z0.shape == p.canonical_shape else p.to_canonical(Z0)
            self.x4 = torch.from_numpy(np.ascontiguousarray(Z0)).to(device)
        self.L, self.cache, self.last_iters, self.ws = None, {}, None, None
        self.build_seconds = time.perf_counter() - t_start

    def log(self, kind, iteration, primal, dual, screened=None, ws=None, method=None):
        gap = primal - dual
        entry = dict(kind=kind, iteration=iteration, seconds=time.perf_counter() - self.t_start,
                     primal=primal, dual=dual, gap=gap, relative_gap=gap / max(1.0, abs(primal)))
        if kind == "certified":
            entry.update(screened=screened, working_set=ws, method=method)
        self.history.append(entry)
        if self.progress:
            extra = "" if kind != "certified" else f"  screened {screened}  working set {ws} groups"
            print(f"fista {kind:9s} it {iteration:6d}  {entry['seconds']:8.2f}s  P {primal:.10g}  "
                  f"rel gap {entry['relative_gap']:.3e}{extra}", file=sys.stderr, flush=True)

    def loop(self, tol, budget, screen, working_set, method, check_every, p0):
        ws_blocks, method_used, floor_hits, best_rel, Yhat = 0, None, 0, np.inf, None
        n_screened = 0
        while True:
            chk = self.cert.check(self.x4, Yhat)
            done = chk.relative_gap <= tol
            if screen and chk.relative_gap < 1e-2 and (not done or self.cert.norms_known()):
                n_screened = self.cert.screen(chk.gap)
            self.log("certified", budget.iterations, chk.primal, chk.dual, n_screened,
                     ws_blocks * self.c, method_used)
            if done:
                return f"certified: relative gap {chk.relative_gap:.2e} <= tol"
            reason = budget.spent()
            if reason:
                return f"{reason} reached: relative gap {chk.relative_gap:.2e} > tol {tol:g}"
            J, K, settled = self.working_set(chk, working_set, p0)
            ws_blocks = len(J) * len(K)
            floor_hits = floor_hits + 1 if settled and chk.relative_gap > 0.5 * best_rel else 0
            best_rel = min(best_rel, chk.relative_gap)
            if floor_hits >= 3:
                precision = str(self.dtype).replace("torch.", "")
                return (f"stalled at relative gap {chk.relative_gap:.2e} > tol {tol:g}: the {precision} "
                        "working precision cannot certify less")
            inner_tol = 0.5 * tol if settled else max(0.5 * tol, 0.3 * chk.relative_gap)
            sm, op, method_used = self.subproblem(J, K, method)
            x = sm.from_canonical(self.x4.index_select(0, J).index_select(2, K).to(self.dtype))
            slack = 1e-9 if self.dtype == torch.float64 else 1e-4
            it0 = budget.iterations

            def on_check(k, primal, dual):
                self.log("inner", k, primal, dual)

            work = op.hJ * op.F * (op.hJ * op.F if method_used == "gram" else op.N) * self.c
            with cpu_threads(self.device, work):
                if method_used == "gram":
                    if "L" not in self.cache:
                        self.cache["L"] = sm.lipschitz_guess(None)
                    L0 = self.cache["L"]
                else:
                    L0 = self.L if self.L is not None else sm.lipschitz_guess(sm.grad(x, sm.image(x))[0])
                x, ix, L, _ = apg(sm, x, self.problem.beta, L0, inner_tol, budget, check_every, on_check,
                                  slack)
            if method_used == "data":
                self.L = L
            else:
                self.cache["L"] = L
            self.last_iters = budget.iterations - it0
            block = sm.to_canonical(x).to(torch.float64)
            blockJ = torch.zeros(self.h, self.c, len(K), self.d, dtype=torch.float64, device=self.device)
            blockJ.index_copy_(0, J, block)
            self.x4 = torch.zeros_like(self.x4).index_copy_(2, K, blockJ)
            Yhat = None
            if self.dtype == torch.float64:  # A x in float64 is at hand: reuse it for the check
                Yhat = ix if method_used == "data" else op.forward(block.contiguous())

    def working_set(self, chk, enabled, p0):
        """Gates J and tokens K of the next subproblem, and whether it is settled.

        The working set only grows: it keeps its blocks (gate j, token k) and adds the worst KKT
        violators outside it (``max_l ||(A^T V)_{j,l,k}|| > beta``), at most as many as it holds
        (at least ``p0``). It is *settled* when no block outside it violates the KKT conditions
        (or it holds every unscreened block): its solution is then the full solution.
        """
        blocks_open = ~self.cert.screened.all(dim=1)  # (h, n)
        if self.ws is None:
            self.ws = torch.zeros_like(blocks_open)
        support = (torch.linalg.vector_norm(self.x4, dim=-1) > 0).any(dim=1)
        self.ws |= support
        score = torch.amax(chk.grad_norms, dim=1) / self.problem.beta
        candidates = blocks_open & ~self.ws & (score > 1.0)
        n_cand = int(candidates.sum())
        if n_cand:
            take = n_cand if not enabled else min(n_cand, max(p0, int(self.ws.sum())))
            score = torch.where(candidates, score, torch.full_like(score, -np.inf))
            add = torch.zeros(self.h * self.n, dtype=torch.bool, device=self.device)
            add[torch.topk(score.flatten(), take).indices] = True
            self.ws |= add.view(self.h, self.n)
        if not self.ws.any():  # nothing violates at x: keep the best-scored open block
            self.ws.view(-1)[int(torch.argmax(torch.where(blocks_open, score, -np.inf)))] = True
        J = torch.nonzero(self.ws.any(dim=1)).flatten()
        K = torch.nonzero(self.ws.any(dim=0)).flatten()
        self.ws[J[:, None], K[None, :]] = True
        return J, K, n_cand == 0 or bool((self.ws | ~blocks_open).all())

    def subproblem(self, J, K, method):
        """The smooth part of the program restricted to gates J and tokens K, how it is evaluated,
        and its DataOp. The Gram matrix, or the data path's copy of the tokens K, is kept while
        the working set does not change."""
        key = (tuple(J.tolist()), tuple(K.tolist()))
        if self.cache.get("key") != key:
            op = make_data_op(self.Xw, self.maskw, self.c, J, K, self.device, self.dtype, self.chunk)
            self.cache = {"key": key, "op": op}
        op = self.cache["op"]
        use_gram = method == "gram" or (method == "auto" and self.problem.loss.name == "squared"
                                        and self._gram_pays(op))
        if not use_gram:
            if "data" not in self.cache:
                mat = op.materialize()  # polish may form a support Gram worth ~50 iterations
                work = 100.0 * GEMM_SPEEDUP[self.device.type] * mat.N * mat.F * mat.hJ * self.c
                self.cache["data"] = DataSmooth(mat, self.tloss, self.Tw, work)
            sm = self.cache["data"]
            return sm, sm.op, "data"
        if "gram" not in self.cache:
            H, B = op.gram(self.Tw)
            tt = float(torch.sum(self.T64 * self.T64))
            self.cache["gram"] = GramSmooth(H, B, tt, op.hJ, op.nK, op.d)
        return self.cache["gram"], op, "gram"

    def _gram_pays(self, op):
        """Cost model: forming H (N F^2 multiply-adds, at GEMM speed) and iterations of F^2 c,
        against iterations that stream the N x F data twice. A GEMM runs about ``GEMM_SPEEDUP``
        times faster per multiply-add than a product that streams its matrix once."""
        F = op.hJ * op.F
        if F * F * op.X.element_size() > min(GRAM_BYTES, device_budget(self.device)):
            return False
        r = GEMM_SPEEDUP[self.device.type]
        t_data = 2.0 * op.N * op.F * max(1.0, op.hJ * self.c / r)
        t_gram_iter = F * F * max(1.0, self.c / r)
        t_build = op.N * F * (F + self.c) / r
        k = 100 if self.last_iters is None else max(50, 1.5 * self.last_iters)
        return t_build + k * t_gram_iter < k * t_data
