"""Time to a certified relative gap of 1e-6: the torch backend against its peers (issues 3 and 24).

The same instances for every solver: ``cvxtransformer.solvers.proxgrad.ProxGrad`` (ours), skglm's GroupBCD and
(logistic) GroupProxNewton, celer's GroupLasso (squared loss), CVXPY+Clarabel and CVXPY+SCS. Every solution is
certified by our verifier (docs/conventions.md, relative gap <= 1e-6); peers with their own tolerance are
swept (see ``benchmarks/fista_peers.py``). Also: a warm-started beta path with gap-safe screening, the
per-iteration cost of the data path against the two products it must do, and float32.

The run is split into parts (``--part``; each a few to twenty minutes, so that each can run alone on a
shared machine); each part stores its results in ``--store`` (JSON), and every call rewrites
``docs/benchmark_fista.md`` and ``docs/fista_time_to_gap.png`` from all the parts stored (``--report``:
only that). See :mod:`fista_report`.

    python benchmarks/bench_fista.py --part squared        # then squared_large, extras, logistic, ...
    python benchmarks/bench_fista.py --report              # the page from the stored parts
    python benchmarks/bench_fista.py --quick               # every part on small instances, about 3 minutes
    python benchmarks/bench_fista.py --part adelie         # ours against adelie (benchmarks/setup_adelie.sh first)
    python benchmarks/bench_fista.py --part adelie_large   # the same at N = 10^6 (about 8 GB of memory)
    python benchmarks/bench_fista.py --part gpu            # on a machine with a CUDA GPU (not in the default run):
                                                           # CPU (every core) against the GPU, float64 and float32
    python benchmarks/bench_fista.py --part solve          # the headline: ct.solve (what a user calls, verification
                                                           # included) against adelie, skglm and celer, interleaved
    python benchmarks/bench_fista.py --part solve_large    # the same at N = 10^6 (about 6 GB of memory)
    python benchmarks/bench_fista.py --part solve --seed 7 # other instances of the same kinds (seed of the data)
    python benchmarks/bench_fista.py --part weight_decay   # program 10wd (ordinary weight decay) against (10)
"""
import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

if "gpu" not in sys.argv:  # every solver on one thread, numpy's BLAS (skglm, celer, the CVXPY solvers) too
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fista_peers as peers  # noqa: E402
import fista_report  # noqa: E402
from fista_report import fmt_time, ratio  # noqa: E402
from common import DOCS, ROOT, commit, load, machine  # noqa: E402

import cvxtransformer as ct  # noqa: E402


@dataclass
class Instance:
    program: int
    loss: str
    N: int
    n: int
    d: int
    rho: float  # correlation of the tokens of a sequence (a shared component)
    frac: float = 0.1  # beta / beta_max
    heads: int = None
    classes: int = 4  # cross-entropy's classes (program (10) with the squared loss: 3 outputs, the teacher's)
    peers: tuple = ("skglm", "celer", "clarabel", "scs")

    @property
    def label(self):
        return fista_report.label(asdict(self))


def make(inst, seed=0):
    """Tokens ``x_ik = sqrt(1-rho) e_ik + sqrt(rho) s_i`` (e, s i.i.d. N(0, I_d)); a planted
    attention-only teacher on 3 tokens; noisy targets."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((inst.N, inst.n, inst.d))
    if inst.rho:
        X *= np.sqrt(1 - inst.rho)
        X += np.sqrt(inst.rho) * rng.standard_normal((inst.N, 1, inst.d))
    multi = inst.loss == "squared" and inst.program in (10, "10wd")  # c outputs, one teacher head each
    heads = max(3, inst.classes) if multi else 3
    W = np.zeros((heads, inst.n, inst.d))
    for l in range(heads):
        W[l, rng.choice(inst.n, 3, replace=False)] = rng.standard_normal((3, inst.d)) / np.sqrt(inst.d)
    S = np.einsum("ikd,lkd->il", X, W) + 0.5 * rng.standard_normal((inst.N, heads))
    y = {"squared": S if multi else S[:, 0], "logistic": np.where(S[:, 0] >= 0, 1.0, -1.0),
         "cross_entropy": np.argmax(np.c_[S, np.zeros(inst.N)][:, :inst.classes], axis=1)}[inst.loss]
    problem = ct.make_problem(X, y, program=inst.program, loss=inst.loss, beta=1.0, gates=inst.heads,
                              n_classes=inst.classes if inst.loss == "cross_entropy" else None)
    return problem.with_beta(inst.frac * problem.beta_max())


FRACTIONS = (0.1, 0.01, 0.001)  # beta / beta_max of the logistic and cross-entropy rows


def _over_betas(make_instance, fractions=FRACTIONS):
    return [make_instance(f) for f in fractions]


def instances(part, quick):
    """The instances of one part of the run."""
    # adelie on the rows with N >= 10^4 (issue #34's range; below it every solve is a few milliseconds)
    P8, big = ("skglm", "celer", "adelie", "clarabel", "scs"), ("skglm", "celer", "adelie")
    logistic, small = ("skglm", "skglm_pn", "adelie", "clarabel"), ("skglm", "skglm_pn", "adelie")
    P8_small, logistic_small = ("skglm", "celer", "clarabel", "scs"), ("skglm", "skglm_pn", "clarabel")
    if quick:
        return {"squared": [Instance(8, "squared", 1000, 8, 16, 0.0), Instance(8, "squared", 1000, 8, 16, 0.8),
                            Instance(8, "squared", 5000, 16, 32, 0.8)],
                "squared_large": [Instance(12, "squared", 2000, 8, 16, 0.8, heads=16,
                                           peers=("skglm", "celer", "adelie"))],
                "logistic": _over_betas(lambda f: Instance(8, "logistic", 2000, 8, 16, 0.8, f, peers=logistic)),
                "logistic_large": _over_betas(lambda f: Instance(12, "logistic", 2000, 4, 8, 0.8, f, heads=4,
                                                                 peers=small), (0.1, 0.001)),
                "cross_entropy": _over_betas(lambda f: Instance(10, "cross_entropy", 1000, 8, 16, 0.8, f, classes=5,
                                                                peers=("clarabel",))),
                "adelie": [Instance(8, "squared", 5000, 16, 32, 0.8, f, peers=("adelie",)) for f in FRACTIONS]
                + [Instance(8, "logistic", 2000, 8, 16, 0.8, f, peers=("adelie",)) for f in (0.1, 0.001)]
                + [Instance(10, "squared", 2000, 8, 16, 0.8, 0.01, classes=3, peers=("adelie",))],
                "adelie_large": [Instance(8, "squared", 20_000, 8, 16, 0.8, peers=("adelie",))]}.get(part, [])
    return {"squared": [Instance(8, "squared", 1000, 8, 16, 0.0, peers=P8_small),
                        Instance(8, "squared", 1000, 8, 16, 0.8, peers=P8_small),
                        Instance(8, "squared", 1000, 32, 64, 0.8, 0.05, peers=P8_small),
                        Instance(8, "squared", 10_000, 16, 32, 0.0, peers=P8),
                        Instance(8, "squared", 10_000, 16, 32, 0.8, peers=P8),
                        Instance(8, "squared", 20_000, 16, 32, 0.0, peers=P8),
                        Instance(8, "squared", 20_000, 16, 32, 0.8, peers=P8)],
            "squared_large": [Instance(8, "squared", 100_000, 8, 16, 0.8, peers=big),
                              Instance(8, "squared", 100_000, 16, 32, 0.0, peers=big),
                              Instance(8, "squared", 100_000, 16, 32, 0.8, peers=big),
                              Instance(8, "squared", 100_000, 32, 64, 0.8, 0.05, peers=big),
                              Instance(12, "squared", 10_000, 8, 16, 0.8, heads=16,
                                       peers=("skglm", "celer", "adelie", "clarabel")),
                              Instance(12, "squared", 100_000, 8, 16, 0.0, heads=16, peers=big)],
            "logistic": (_over_betas(lambda f: Instance(8, "logistic", 4000, 16, 16, 0.8, f, peers=logistic_small))
                         + _over_betas(lambda f: Instance(8, "logistic", 10_000, 16, 32, 0.8, f, peers=logistic))),
            "logistic_large": (_over_betas(lambda f: Instance(8, "logistic", 15_000, 8, 32, 0.0, f, peers=logistic))
                               + _over_betas(lambda f: Instance(12, "logistic", 10_000, 8, 16, 0.8, f, heads=16,
                                                                peers=small))),
            "cross_entropy": (_over_betas(lambda f: Instance(10, "cross_entropy", 2000, 8, 16, 0.8, f, classes=5,
                                                             peers=("clarabel",)))
                              + _over_betas(lambda f: Instance(10, "cross_entropy", 5000, 8, 16, 0.8, f,
                                                               peers=("clarabel",)))),
            "adelie": adelie_instances(),
            "adelie_large": [Instance(8, loss, 1_000_000, 8, 16, 0.8, f, peers=("adelie",))
                             for loss in ("squared", "logistic") for f in (0.1, 0.01)]}.get(part, [])


def adelie_instances():
    """The part ``adelie``: ours against adelie alone on the rows of programs (8), (10) and (12), squared and
    logistic, at 0.1, 0.01 and 0.001 beta_max, that the other parts (where adelie is a peer beside skglm and
    celer) do not have. Program (10)'s groups are one output's coefficients of a token: with the squared loss
    it is c group lassos on one design, which adelie solves one after the other (its multi-response groups
    would hold every output's coefficients, another penalty); the logistic loss has one output (program (8));
    cross-entropy (adelie's multinomial groups are again every class's coefficients) is compared with
    Clarabel in the part ``cross_entropy``."""
    only = ("adelie",)
    return ([Instance(8, "squared", 10_000, 16, 32, 0.8, f, peers=only) for f in (0.01, 0.001)]
            + [Instance(8, loss, 10_000, 8, 16, 0.8, 0.1, peers=only) for loss in ("squared", "logistic")]
            + [Instance(8, "squared", 50_000, 8, 16, 0.8, 0.05, peers=only)]
            + _over_betas(lambda f: Instance(8, "squared", 100_000, 8, 16, 0.8, f, peers=only))
            + _over_betas(lambda f: Instance(10, "squared", 10_000, 8, 16, 0.8, f, classes=3, peers=only))
            + [Instance(12, "squared", 10_000, 8, 16, 0.8, f, heads=16, peers=only) for f in (0.01, 0.001)])


def solve_instances(part, quick):
    """The instances of the parts ``solve`` and ``solve_large``: the kinds of issue #42's table, (8), (10) and (12)
    with the squared and logistic losses, at large and small beta, against adelie; and a small one against skglm
    and celer (below N = 10^4 adelie's fixed costs make it a peer of no interest: every solve takes milliseconds)."""
    A, small = ("adelie",), ("skglm", "celer")
    if quick:
        return {"solve": [Instance(8, "squared", 20_000, 8, 16, 0.5, 0.1, peers=A),
                          Instance(8, "logistic", 10_000, 8, 16, 0.5, 0.01, peers=A),
                          Instance(8, "squared", 1_000, 8, 16, 0.8, 0.1, peers=small)],
                "solve_large": [Instance(8, "squared", 100_000, 8, 16, 0.5, 0.1, peers=A)]}.get(part, [])
    return {"solve": [Instance(8, "squared", 200_000, 8, 16, 0.5, 0.1, peers=A),
                      Instance(8, "squared", 50_000, 8, 16, 0.5, 0.05, peers=A),
                      Instance(10, "squared", 30_000, 8, 16, 0.5, 0.1, classes=3, peers=A),
                      Instance(12, "squared", 20_000, 8, 16, 0.5, 0.1, heads=8, peers=A),
                      Instance(8, "squared", 20_000, 16, 32, 0.8, 0.1, peers=A),
                      Instance(8, "squared", 1_000, 8, 16, 0.8, 0.1, peers=small),
                      Instance(8, "squared", 200_000, 8, 16, 0.5, 0.01, peers=A),
                      Instance(8, "squared", 200_000, 8, 16, 0.5, 0.001, peers=A),
                      Instance(10, "squared", 30_000, 8, 16, 0.5, 0.001, classes=3, peers=A),
                      Instance(12, "squared", 20_000, 8, 16, 0.5, 0.01, heads=8, peers=A)]
            + _over_betas(lambda f: Instance(8, "logistic", 50_000, 8, 16, 0.5, f, peers=A))
            + [Instance(12, "logistic", 20_000, 8, 16, 0.5, 0.1, heads=8, peers=A)],
            "solve_large": [Instance(8, "squared", 1_000_000, 8, 16, 0.5, f, peers=A) for f in (0.1, 0.01)]
            + [Instance(8, "logistic", 1_000_000, 8, 16, 0.5, 0.1, peers=A)]}.get(part, [])


def solve_row(inst, seed, repeats):
    """One row of the part ``solve``: ``ct.solve`` and the backend alone on one thread, the peer at its
    fastest setting that our verifier certifies (found by a sweep first), all timed ``repeats`` times in turn
    (best of each); the passes over X of one ``ct.solve`` (counted), and one pass's time."""
    problem = make(inst, seed)
    D = peers.design(problem)
    timers = peers.our_timers(problem)
    settings, sweeps, server = {}, {}, None
    try:
        for name in inst.peers:
            if name == "adelie":
                if not peers.ADELIE_PYTHON.exists():
                    sweeps[name] = peers.Run(note="adelie not installed: run benchmarks/setup_adelie.sh")
                    continue
                server = peers.AdelieServer(problem, D)
                settings[name], sweeps[name] = peers.adelie_setting(server, problem, repeats)
                if settings[name] is not None:
                    timers[name] = (lambda s: lambda: server.fit(*s))(settings[name])
            else:
                fit = (peers.skglm_fit if name == "skglm" else peers.celer_fit)(problem, D)
                fit(1e-4)  # compile (numba) outside the timing
                tol = peers.swept_tol(fit, problem, peers.SKGLM_TOLS if name == "skglm" else peers.CELER_TOLS)
                sweeps[name] = peers.Run(note="not certified" if tol is None else f"tol={tol:g}")
                if tol is not None:
                    settings[name] = tol
                    timers[name] = (lambda f, t: peers.timed_once(lambda: f(t)))(fit, tol)
        best = peers.interleaved(timers, repeats)
    finally:
        if server is not None:
            server.close()
    runs = {}
    for name, (seconds, cpu, out) in best.items():
        if name == "ct.solve":
            gap = out.certificate.relative_gap
            runs[name] = peers.Run(seconds if gap <= peers.TARGET else None, gap, note=out.status, cpu=cpu,
                                   iterations=out.iterations,
                                   methods=",".join(sorted({h.method for h in out.history if h.method})))
        elif name == "backend":
            runs[name] = peers.Run(seconds, note=out.status, cpu=cpu, iterations=out.iterations)
        else:
            gap = peers.gap_of(problem, out)
            runs[name] = peers.Run(seconds if gap <= peers.TARGET else None, gap, note=sweeps[name].note, cpu=cpu)
    for name, sweep in sweeps.items():
        runs.setdefault(name, sweep)
    passes, _ = peers.passes_of(lambda: ct.solve(peers.fresh(problem), "fista", threads=1), problem.program.X)
    V = torch.from_numpy(problem.T.copy())
    op = problem.program.operator()
    one_pass = min(peers.timed_once(lambda: op.adjoint(V))()[0] for _ in range(repeats))
    return runs, passes, one_pass


PARTS = ("squared", "squared_large", "extras", "logistic", "logistic_large", "cross_entropy", "adelie", "adelie_large",
         "weight_decay", "gpu", "solve", "solve_large")
SOLVE_REPEATS = 5  # runs of each solver in turn, best of them


def weight_decay_rows(quick, repeats=SOLVE_REPEATS):
    """The part ``weight_decay`` (issue #41): ``ct.solve(problem, "fista")`` on program 10wd (ordinary weight
    decay: a nuclear norm per token) against program (10) (a group norm per token and output) on the same data
    and at the same fraction of each program's own beta_max, the two timed in turn (best of ``repeats``)."""
    N = 10_000 if quick else 100_000
    rows = []
    for frac in (0.1, 0.01):
        inst = Instance("10wd", "squared", N, 16, 32, 0.8, frac, classes=4, peers=())
        problems = {program: make(replace(inst, program=program)) for program in (10, "10wd")}
        best = peers.interleaved({program: peers.timed_once(lambda p=p: ct.solve(peers.fresh(p), "fista", threads=1))
                                  for program, p in problems.items()}, repeats)
        row = {"instance": asdict(inst),
               "runs": {str(program): {"seconds": seconds, "cpu": cpu, "gap": out.certificate.relative_gap,
                                       "certified": bool(out.certificate.relative_gap <= peers.TARGET),
                                       "iterations": out.iterations, "beta": problems[program].beta}
                        for program, (seconds, cpu, out) in best.items()}}
        rows.append(row)
        print(fista_report.label(row["instance"]),
              {k: f"{r['seconds']:.3g} s, gap {r['gap']:.1e}" for k, r in row["runs"].items()}, flush=True)
    return {"rows": rows, "repeats": repeats}


def run_instance(inst, caps):
    problem = make(inst)
    runs = {"ct.solve": peers.run_fista(problem, solve=True), "fista": peers.run_fista(problem)}
    D = peers.design(problem) if {"skglm", "skglm_pn", "celer", "adelie"} & set(inst.peers) else None
    for name in inst.peers:
        if name in ("skglm", "skglm_pn"):
            runs[name] = peers.run_skglm(problem, D, time_cap=caps["sweep"],
                                         solver="prox_newton" if name == "skglm_pn" else "bcd")
        elif name == "adelie":
            runs[name] = peers.run_adelie(problem, D, time_cap=caps["sweep"])
        elif name == "celer" and problem.loss.name == "squared":
            runs[name] = peers.run_celer(problem, D, time_cap=caps["sweep"])
        elif name in ("clarabel", "scs"):
            runs[name] = peers.run_cvxpy(problem, name, time_cap=caps[name])
    peers.retime(problem, D, runs)
    del D
    return runs


# --- the beta path ---------------------------------------------------------------------------

def bench_path(inst, n_betas):
    problem = make(inst)
    t = time.perf_counter()
    path = ct.solve_path(problem, n_betas=n_betas, ratio=0.01, tol=peers.TARGET)
    fista_total = time.perf_counter() - t
    betas = [p.beta for p in path]
    D = peers.design(problem)
    results = {}
    for name in ("skglm", "celer"):
        for tol in ((1e-6, 1e-8, 1e-10) if name == "skglm" else (1e-8, 1e-10, 1e-12)):
            total, gaps, w = 0.0, [], None
            for beta in betas:
                sub = problem.with_beta(beta)
                if beta >= problem.beta_max():
                    w = np.zeros(D.shape[1])
                    gaps.append(peers.gap_of(sub, w))
                    continue
                t = time.perf_counter()
                w = _fit_warm(name, sub, D, tol, w)
                total += time.perf_counter() - t
                gaps.append(peers.gap_of(sub, w))
            results[name] = (total, gaps, tol)
            if max(gaps) <= peers.TARGET:
                break
    return path, fista_total, results


def _fit_warm(name, problem, D, tol, w0):
    N = D.shape[0]
    y = problem.T[:, 0]
    if name == "skglm":
        from skglm.datafits import QuadraticGroup
        from skglm.penalties import WeightedGroupL2
        from skglm.solvers import GroupBCD
        from skglm.utils.data import grp_converter

        gi, gp = grp_converter(problem.program.d, D.shape[1])
        solver = GroupBCD(max_iter=50, max_epochs=50_000, tol=tol, fit_intercept=False)
        w0 = None if w0 is None else w0.copy()
        penalty = WeightedGroupL2(problem.beta / N, np.ones(len(gp) - 1), gp, gi)
        return solver.solve(D, y, QuadraticGroup(gp, gi), penalty, w0, None if w0 is None else D @ w0)[0]
    from celer import GroupLasso
    model = GroupLasso(groups=problem.program.d, alpha=problem.beta / N, tol=tol, fit_intercept=False,
                       warm_start=True)
    if w0 is not None:
        model.coef_ = w0.copy()
    return model.fit(D, y).coef_


# --- per-iteration cost ----------------------------------------------------------------------

def bench_iteration(inst, dtype, iters=60):
    """Seconds per proximal-gradient iteration on the data path (whole problem, gap checks
    every 10 iterations included) against one forward and one adjoint product of the same op."""
    from cvxtransformer.solvers.proxgrad.fista import Budget, fista
    from cvxtransformer.solvers.proxgrad.smooth import DataSmooth

    problem = make(inst)
    p = problem.program
    dt = {"float64": torch.float64, "float32": torch.float32}[dtype]
    op = p.operator("cpu", dt)
    T = torch.from_numpy(problem.T).to(dt)
    sm = DataSmooth(op, problem.loss, T)
    x = torch.zeros(op.shape, dtype=dt)
    L = sm.lipschitz_guess(sm.grad(x, sm.image(x))[0])
    fista(sm, x, problem.regularizer, L, 0.0, Budget(5, None))  # warm caches
    budget = Budget(iters, None)
    t = time.perf_counter()
    fista(sm, x, problem.regularizer, L, 0.0, budget, check_every=10)
    per_iter = (time.perf_counter() - t) / budget.iterations
    Z = torch.randn(op.shape, dtype=dt) * 0.01
    V = torch.randn(p.N, p.c, dtype=dt)
    op.forward(Z), op.adjoint(V)
    best = np.inf
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(10):
            op.forward(Z)
            op.adjoint(V)
        best = min(best, (time.perf_counter() - t) / 10)
    return per_iter, best


def bench_float32(quick):
    cases = [Instance(8, "squared", 5000 if quick else 100_000, 16, 32, 0.8),
             Instance(12, "squared", 5000 if quick else 100_000, 8, 16, 0.0, heads=16),
             Instance(8, "logistic", 5000 if quick else 100_000, 16, 32, 0.8)]
    from cvxtransformer.solvers.proxgrad import ProxGrad

    out = []
    for inst in cases:
        problem = make(inst)
        for tol in (1e-4, 1e-6):
            t = time.perf_counter()
            res = ProxGrad().solve(problem, tol=tol, dtype="float32", time_limit=120)
            sec = time.perf_counter() - t
            out.append((inst, tol, peers.gap_of(problem, res.Z, res.V), sec, res.status))
    return out


# --- the GPU ----------------------------------------------------------------------------------

def gpu_instances(quick):
    """Instances of the part ``gpu``: the large rows of the CPU parts, where a GPU pays."""
    if quick:
        return [Instance(8, "squared", 20_000, 16, 32, 0.8, peers=()),
                Instance(12, "logistic", 2000, 4, 8, 0.8, 0.001, heads=4, peers=())]
    return [Instance(8, "squared", 100_000, 16, 32, 0.8, peers=()),
            Instance(8, "squared", 100_000, 32, 64, 0.8, 0.05, peers=()),
            Instance(12, "squared", 100_000, 8, 16, 0.0, heads=16, peers=()),
            Instance(8, "logistic", 100_000, 16, 32, 0.8, 0.01, peers=()),
            Instance(12, "logistic", 10_000, 8, 16, 0.8, 0.1, heads=16, peers=()),
            Instance(12, "logistic", 10_000, 8, 16, 0.8, 0.001, heads=16, peers=()),
            Instance(10, "cross_entropy", 50_000, 8, 16, 0.8, 0.01, classes=5, peers=()),
            Instance(12, "squared", 10_000_000, 8, 16, 0.5, 0.1, heads=8, peers=())]  # 10 GB of X: issue #42


def bench_gpu(quick):
    """Each instance solved to a certified 1e-6 by the same backend on the CPU of the machine (every
    core) and on its GPU (float64; float32 iterations with float64 certificates, to 1e-6 where
    float32 gets there, else the gap it reached), each the best of up to 3 runs."""
    if not torch.cuda.is_available():
        raise SystemExit("--part gpu needs a CUDA GPU (torch.cuda.is_available() is False on this machine)")
    threads = os.cpu_count()
    peers.run_fista(make(gpu_instances(True)[0]), repeats=1, device="cuda")  # CUDA context, kernels
    rows = []
    for inst in gpu_instances(quick):
        problem = make(inst)
        runs = {"cpu": peers.run_fista(problem, solve=True, threads=threads),
                "cuda": peers.run_fista(problem, solve=True, device="cuda"),
                "cuda_float32": peers.run_fista(problem, solve=True, device="cuda", dtype="float32", time_limit=60)}
        rows.append({"instance": asdict(inst), "runs": {k: asdict(r) for k, r in runs.items()}})
        print(inst.label, "|", " | ".join(f"{k} {fmt_time(r)} ({ratio(runs['cpu'], r)}x)" for k, r in runs.items()),
              flush=True)
    return {"rows": rows, "cpu_threads": threads}


# --- the parts, stored, and the page --------------------------------------------------------

SPAN_REPEATS = 5  # runs of each of the two solves of a beta span, in alternation


def beta_span(inst, repeats=SPAN_REPEATS):
    """Seconds to a certified 1e-6 of ``inst`` at 0.1 and at 0.001 beta_max, the two solves timed in
    alternation, best of ``repeats`` each: their ratio under the same load (rows timed minutes apart
    on a shared machine differ by 20-50%, and a row over 2 s is timed once)."""
    problems = [make(replace(inst, frac=frac)) for frac in (0.1, 0.001)]
    best = [np.inf, np.inf]
    for _ in range(repeats):
        for i, problem in enumerate(problems):
            seconds = peers.run_fista(problem, repeats=1, solve=True).seconds
            best[i] = min(best[i], np.inf if seconds is None else seconds)
    return best


def run_part(part, quick, caps, seed=0):
    """Every measurement of one part, as plain data (JSON)."""
    if part == "gpu":
        return bench_gpu(quick)
    if part == "weight_decay":
        return weight_decay_rows(quick)
    if part in ("solve", "solve_large"):
        out = {"rows": [], "seed": seed, "repeats": SOLVE_REPEATS}
        for inst in solve_instances(part, quick):
            load0 = os.getloadavg()[0]
            runs, passes, one_pass = solve_row(inst, seed, SOLVE_REPEATS)
            out["rows"].append({"instance": asdict(inst), "runs": {k: asdict(r) for k, r in runs.items()},
                                "passes": passes, "one_pass": one_pass, "load": [load0, os.getloadavg()[0]]})
            cells = (f"{k} {fmt_time(r)} ({ratio(r, runs['ct.solve'])}x)" for k, r in runs.items())
            print(inst.label, f"| passes {passes:.2f} | one pass {one_pass:.3g} s |", " | ".join(cells), flush=True)
        return out
    out = {"rows": []}
    for inst in instances(part, quick):
        load0 = os.getloadavg()[0]
        runs = run_instance(inst, caps)
        out["rows"].append({"instance": asdict(inst), "runs": {k: asdict(r) for k, r in runs.items()},
                            "load": [load0, os.getloadavg()[0]]})
        cells = (f"{k} {fmt_time(r)} ({ratio(r, runs['ct.solve'])}x)" for k, r in runs.items())
        print(inst.label, "|", " | ".join(cells), flush=True)
    if part in ("logistic", "logistic_large", "cross_entropy"):
        out["spans"] = []
        for inst in instances(part, quick):
            if inst.frac == 0.001:
                high, low = beta_span(inst)
                out["spans"].append({"instance": asdict(inst), "high": high, "low": low, "repeats": SPAN_REPEATS})
                print(f"span {inst.label}: {low:.3g} s / {high:.3g} s = {low / high:.2f}x", flush=True)
    if part == "extras":
        path_inst = Instance(8, "squared", 2000 if quick else 10_000, 16, 32, 0.8)
        points, total, results = bench_path(path_inst, 6 if quick else 10)
        out["path"] = {"instance": asdict(path_inst), "points": [p.summary() for p in points],
                       "beta_max": points[0].beta, "total": total,
                       "peers": {k: list(v) for k, v in results.items()}}
        print("path done", flush=True)
        big = 20_000 if quick else 100_000
        it_cases = [(Instance(8, "logistic", big, 16, 32, 0.8), "float64"),
                    (Instance(8, "logistic", big, 16, 32, 0.8), "float32"),
                    (Instance(12, "squared", 10_000 if quick else 100_000, 8, 16, 0.0, heads=16), "float64"),
                    (Instance(10, "cross_entropy", big, 16, 32, 0.8), "float64")]
        out["iterations"] = [{"instance": asdict(inst), "dtype": dt, "per_iter": a, "products": b}
                             for inst, dt in it_cases for a, b in [bench_iteration(inst, dt)]]
        out["float32"] = [{"instance": asdict(inst), "tol": tol, "gap": gap, "seconds": sec, "status": status}
                          for inst, tol, gap, sec, status in bench_float32(quick)]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", choices=PARTS, help="run this part (repeatable; default: all)")
    parser.add_argument("--report", action="store_true", help="only write the page from the stored parts")
    parser.add_argument("--quick", action="store_true", help="small instances (about 3 minutes for every part)")
    parser.add_argument("--store", default=None, help="folder of the parts' results (default out/bench_fista, "
                                                      "out/bench_fista_quick with --quick)")
    parser.add_argument("--out", default=str(DOCS / "benchmark_fista.md"))
    parser.add_argument("--figure", default=str(DOCS / "fista_time_to_gap.png"))
    parser.add_argument("--seed", type=int, default=0, help="seed of the data of the parts solve and solve_large "
                        "(other instances of the same kinds; stored as solve_seedS.json when not 0)")
    args = parser.parse_args()
    store = Path(args.store or ROOT / "out" / ("bench_fista_quick" if args.quick else "bench_fista"))
    store.mkdir(parents=True, exist_ok=True)
    caps = dict(clarabel=30.0 if args.quick else 100.0, scs=30.0, sweep=30.0 if args.quick else 90.0)
    torch.set_num_threads(1)  # every solver single-threaded: like for like, and the machine is shared
    if "gpu" not in (args.part or ()):
        threadpool_limits(1)  # numpy's BLAS too (skglm, celer, the CVXPY solvers); adelie: n_threads=1
    default = [p for p in PARTS if p not in ("gpu", "solve_large")]  # the part gpu (and N = 10^6) only when asked for
    for part in ([] if args.report else args.part or default):
        started, load0, t = time.strftime("%Y-%m-%d %H:%M"), load(), time.perf_counter()
        if part != "gpu":  # the peers (skglm, celer, adelie) run on the CPU parts only
            peers.warm_up()
        out = run_part(part, args.quick, caps, args.seed)
        cmd = (f"python benchmarks/bench_fista.py --part {part}" + (" --quick" if args.quick else "")
               + (f" --seed {args.seed}" if args.seed and part.startswith("solve") else ""))
        out.update(part=part, command=cmd, started=started, load0=load0, load1=load(), caps=caps, commit=commit(),
                   minutes=(time.perf_counter() - t) / 60,
                   machine=machine(threads=out.get("cpu_threads"), packages=("skglm", "celer"))
                   + peers.adelie_version())
        name = part + (f"_seed{args.seed}" if args.seed and part.startswith("solve") else "")
        with open(store / f"{name}.json", "w") as f:
            json.dump(out, f)
        print(f"part {part}: {out['minutes']:.1f} min", flush=True)
    names = [p for p in PARTS if (store / f"{p}.json").exists()]
    names += sorted(p.stem for p in store.glob("solve*_seed*.json"))
    parts = {name: json.load(open(store / f"{name}.json")) for name in names}
    fista_report.write(parts, Path(args.out), Path(args.figure), quick=args.quick)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
