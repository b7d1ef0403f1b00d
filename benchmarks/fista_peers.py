"""Peers of the torch backend, each timed to a relative gap certified by *our* verifier.

Every runner returns a :class:`Run`: the wall time of the fastest run whose solution the
verifier certifies at ``TARGET`` (None if none did), and every (time, certified gap) pair seen,
for the time-to-gap plot. Solvers with their own tolerance (skglm, celer) are swept over
tolerances from loose to tight and credited with the *loosest* tolerance that certifies, as if
it had been known in advance: this favours the peers.

adelie (``grpnet``, C++) runs in a venv of its own (it needs numpy < 2): ``benchmarks/setup_adelie.sh``
creates it, :func:`run_adelie` hands it the design through a file (``benchmarks/adelie_runner.py``).

skglm and celer minimise ``1/(2N) ||y - Xw||^2 + alpha sum_g ||w_g||`` (and the logistic loss
averaged over samples): ``alpha = beta / N`` gives the same minimiser as our summed loss.
"""
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import cvxtransformer as ct

TARGET = 1e-6


@dataclass
class Run:
    seconds: float = None  # time to a certified relative gap <= TARGET (None: not reached)
    gap: float = None  # certified relative gap of that run (or of the best run)
    points: list = field(default_factory=list)  # (seconds, certified relative gap) of every run
    note: str = ""
    iterations: int = None  # fista: iterations (a Newton step counts as one)
    methods: str = ""  # fista: how its subproblems were solved (gram, data, newton)
    cpu: float = None  # CPU seconds (this process's, or adelie's subprocess's) of the run timed in ``seconds``:
    # on a shared machine, less sensitive to the load than wall time
    setting: float = None  # a swept peer: the tol it is credited at


def timed(f, repeats, cpu=None):
    """(best wall time over ``repeats`` runs, last output); one run when the first is slow. ``cpu``: a list
    that gets the process's CPU time of the best run."""
    best, out = np.inf, None
    for i in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        out = f()
        wall, c = time.perf_counter() - t, time.process_time() - c
        if wall < best and cpu is not None:
            cpu[:] = [c]
        best = min(best, wall)
        if best > 2.0:
            break
    return best, out


def gap_of(problem, Z, V=None):
    """The verifier's certified relative gap of Z (the program's shape) with the candidate V, as
    ``ct.certify`` reports it for any solution (refined dual point included: its time is not counted)."""
    return ct.certify(problem, np.asarray(Z).reshape(problem.program.shape), V, tol=TARGET).relative_gap


def fresh(problem):
    """The same problem as a new object: the verifier remembers the last Z it certified per problem object, and
    each timed solve must start from nothing (the program, its operators and beta_max are shared, as for a
    user's problem built by make_problem)."""
    return problem.with_beta(problem.beta)


def run_fista(problem, repeats=3, solve=False, **options):
    """Ours on one CPU thread, like every peer (skglm, celer, Clarabel, SCS are single-threaded): the torch
    backend alone (``ProxGrad.solve``), or with ``solve`` what a user calls, ``ct.solve(problem, "fista")``
    (the backend, then the verifier's certificate of its Z); each run on a :func:`fresh` problem."""
    from cvxtransformer.solvers.proxgrad import ProxGrad

    options.setdefault("threads", 1)
    cpu = []
    if solve:
        seconds, out = timed(lambda: ct.solve(fresh(problem), "fista", tol=TARGET, **options), repeats, cpu)
        gap = out.certificate.relative_gap
    else:
        seconds, out = timed(lambda: ProxGrad().solve(fresh(problem), tol=TARGET, **options), repeats, cpu)
        gap = gap_of(problem, out.Z, out.V)
    methods = ",".join(sorted({h.method for h in out.history if h.method}))
    run = Run(seconds if gap <= TARGET else None, gap, note=out.status, iterations=out.iterations, methods=methods,
              cpu=cpu[0])
    scale = seconds / max(out.history[-1].seconds, 1e-12) if out.history else 1.0  # best run vs the recorded one
    run.points = [(h.seconds * scale, h.relative_gap) for h in out.history if h.kind == "certified"]
    return run


def run_cvxpy(problem, solver, time_cap=None, repeats=1):
    from cvxtransformer.solvers import get_solver

    options = {} if time_cap is None else {"time_limit": time_cap}
    backend = get_solver(solver)
    try:
        seconds, out = timed(lambda: backend.solve(problem, tol=TARGET, **options), repeats)
    except Exception as exc:  # a failing peer is reported, not fatal
        return Run(note=f"failed: {type(exc).__name__}")
    gap = gap_of(problem, out.Z, out.V)
    return Run(seconds if gap <= TARGET else None, gap, [(seconds, gap)], note=str(out.status))


def _sweep(fit, problem, tols, repeats, time_cap):
    """Fit at each tolerance (loose to tight) until the verifier certifies TARGET."""
    run = Run()
    for tol in tols:
        seconds, w = timed(lambda: fit(tol), repeats)
        gap = gap_of(problem, w)
        run.points.append((seconds, gap))
        run.gap = gap if run.gap is None else min(run.gap, gap)
        if gap <= TARGET:
            run.seconds, run.gap, run.note, run.setting = seconds, gap, f"tol={tol:g}", tol
            return run
        if seconds > time_cap:
            run.note = f"stopped sweep at tol={tol:g} ({seconds:.0f} s)"
            return run
    run.note = f"not certified down to tol={tols[-1]:g}"
    return run


def design(problem):
    """The (N, h*n*d) design the peers need (materialised for them only), Fortran-ordered."""
    return np.asfortranarray(problem.program.design())


def skglm_fit(problem, D, w_init=None, solver="bcd"):
    """``fit(tol)``: skglm's GroupBCD (working sets + Anderson acceleration; squared or logistic loss) or, with
    ``solver="prox_newton"``, its GroupProxNewton (working sets, a Newton model solved by block coordinate
    descent, backtracking; logistic loss), with the defaults of its estimators; coefficients in the design's
    layout."""
    from skglm.datafits import LogisticGroup, QuadraticGroup
    from skglm.penalties import WeightedGroupL2
    from skglm.solvers import GroupBCD, GroupProxNewton
    from skglm.utils.data import grp_converter

    N, p = D.shape
    d = problem.program.d
    y = problem.T[:, 0].copy()
    grp_indices, grp_ptr = grp_converter(d, p)
    weights = np.ones(len(grp_ptr) - 1)

    def fit(tol):
        datafit = (QuadraticGroup if problem.loss.name == "squared" else LogisticGroup)(grp_ptr, grp_indices)
        penalty = WeightedGroupL2(problem.beta / N, weights, grp_ptr, grp_indices)
        if solver == "prox_newton":
            method = GroupProxNewton(tol=tol, fit_intercept=False)
        else:  # the defaults of skglm's GroupLasso estimator
            method = GroupBCD(max_iter=50, max_epochs=50_000, tol=tol, fit_intercept=False)
        w0 = None if w_init is None else w_init.copy()
        Xw0 = None if w_init is None else D @ w0
        return method.solve(D, y, datafit, penalty, w0, Xw0)[0]

    return fit


SKGLM_TOLS = (1e-5, 1e-6, 1e-7, 1e-8, 1e-10)
CELER_TOLS = (1e-6, 1e-7, 1e-8, 1e-10, 1e-12)


def run_skglm(problem, D, repeats=3, time_cap=120.0, w_init=None, solver="bcd"):
    """:func:`skglm_fit` swept over its tolerance (:func:`_sweep`)."""
    return _sweep(skglm_fit(problem, D, w_init, solver), problem, SKGLM_TOLS, repeats, time_cap)


def celer_fit(problem, D):
    """``fit(tol)``: celer's GroupLasso (dual extrapolation, working sets); squared loss only."""
    from celer import GroupLasso

    N = D.shape[0]
    y = problem.T[:, 0]

    def fit(tol):
        model = GroupLasso(groups=problem.program.d, alpha=problem.beta / N, tol=tol, fit_intercept=False)
        return model.fit(D, y).coef_

    return fit


def run_celer(problem, D, repeats=3, time_cap=120.0):
    """:func:`celer_fit` swept over its tolerance (:func:`_sweep`)."""
    return _sweep(celer_fit(problem, D), problem, CELER_TOLS, repeats, time_cap)


ADELIE_PYTHON = Path(__file__).resolve().parent / ".adelie-venv" / "bin" / "python"
ADELIE_TOLS = (1e-7, 1e-8, 1e-9, 1e-10, 1e-12)


def run_adelie(problem, D, repeats=3, time_cap=120.0, modes=("single", "path")):
    """adelie's ``grpnet`` (screening, block coordinate descent on the screened groups; IRLS / proximal
    Newton for the logistic loss) on one thread, at ``lambda = beta / N`` (its losses are averaged), swept
    over its tolerance (``tol`` = ``irls_tol``, 1e-7 ... 1e-12) and two modes (``single``: the one lambda;
    ``path``: its geometric path of 20 lambdas down to it): credited with its *fastest* run that our
    verifier certifies (favours adelie). Only ``grpnet`` is timed (in the subprocess), not the transfer."""
    if not ADELIE_PYTHON.exists():
        return Run(note="adelie not installed: run benchmarks/setup_adelie.sh")
    N = D.shape[0]
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.npz", Path(tmp) / "out.npz"
        np.savez(job, D=D, y=problem.T, loss=problem.loss.name, beta=problem.beta,
                 d=problem.program.d, tols=np.array(ADELIE_TOLS), modes=np.array(modes), repeats=repeats,
                 time_cap=time_cap)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH="")
        proc = subprocess.run([str(ADELIE_PYTHON), str(Path(__file__).resolve().parent / "adelie_runner.py"),
                               str(job), str(out)], capture_output=True, text=True, env=env)
        if proc.returncode:
            return Run(note="failed: " + ((proc.stderr.strip().splitlines() or ["no output"])[-1])[:120])
        res = np.load(out)
        keys, seconds, cpus, W = list(res["keys"]), res["seconds"], res["cpu"], res["W"]
    run = Run()
    for key, sec, cpu, w in zip(keys, seconds, cpus, W):
        gap = gap_of(problem, problem.program.from_cvxpy(w.reshape(D.shape[1], -1)))
        run.points.append((float(sec), gap))
        run.gap = gap if run.gap is None else min(run.gap, gap)
        if gap <= TARGET and (run.seconds is None or sec < run.seconds):
            run.seconds, run.gap, run.note, run.cpu = float(sec), gap, key.replace(" ", " tol="), float(cpu)
    if run.seconds is None:
        run.note = f"not certified down to tol={ADELIE_TOLS[-1]:g} (N={N})"
    return run


def adelie_version():
    """``, adelie X (own venv)`` for the machine line, or that it is not installed."""
    if not ADELIE_PYTHON.exists():
        return ", adelie not installed"
    out = subprocess.run([str(ADELIE_PYTHON), "-c", "import adelie; print(adelie.__version__)"], capture_output=True,
                         text=True)
    return f", adelie {out.stdout.strip() or 'failed to import'} (own venv, numpy < 2)"


def warm_up():
    """Compile the peers' JIT code (numba, torch kernels) before any timing."""
    import cvxtransformer as ct

    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 4, 4))
    for loss, y in (("squared", X[:, 0, 0]), ("logistic", np.sign(X[:, 0, 0] + 0.1))):
        problem = ct.make_problem(X, y, program=8, loss=loss, beta=1.0)
        problem = problem.with_beta(0.3 * problem.beta_max())
        run_fista(problem, repeats=1)
        run_skglm(problem, design(problem), repeats=1)
        if loss == "squared":
            run_celer(problem, design(problem), repeats=1)
        else:
            run_skglm(problem, design(problem), repeats=1, solver="prox_newton")


# --- ct.solve against its peers, interleaved (bench_fista.py, part "solve") -------------------------------------

class AdelieServer:
    """adelie's ``grpnet`` in its own venv, with the design loaded once (``adelie_runner.py --serve``): ``fit(tol,
    mode)`` fits at the problem's beta and returns ``(seconds, cpu seconds, coefficients in Z's shape)``, only
    ``grpnet`` timed (in the subprocess), so that its fits can be interleaved with ours."""

    def __init__(self, problem, D):
        self.problem, self.d = problem, D.shape[1]
        self.tmp = tempfile.TemporaryDirectory()
        job = Path(self.tmp.name) / "job.npz"
        np.savez(job, D=D, y=problem.T, loss=problem.loss.name, beta=problem.beta, d=problem.program.d)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH="")
        self.proc = subprocess.Popen([str(ADELIE_PYTHON), str(Path(__file__).resolve().parent / "adelie_runner.py"),
                                      "--serve", str(job)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self._read()

    def _read(self):
        import json

        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"adelie_runner --serve ended (exit code {self.proc.wait()})")
        return json.loads(line)

    def fit(self, tol, mode):
        import json

        out = Path(self.tmp.name) / "W.npy"
        self.proc.stdin.write(json.dumps({"tol": tol, "mode": mode, "out": str(out)}) + "\n")
        self.proc.stdin.flush()
        timing = self._read()
        W = np.load(out).reshape(self.d, -1)
        return timing["seconds"], timing["cpu"], self.problem.program.from_cvxpy(W)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()
        self.tmp.cleanup()


def adelie_setting(server, problem, repeats=3, time_cap=60.0, modes=("single", "path")):
    """adelie's fastest fit that our verifier certifies at ``TARGET``, swept over ``ADELIE_TOLS`` and ``modes``
    (each setting the best of ``repeats``, one fit past 2 s; a mode's sweep stops at a fit over ``time_cap``):
    ``(setting (tol, mode) or None, Run of the sweep)``."""
    run, best = Run(), None
    for mode in modes:
        for tol in ADELIE_TOLS:
            times = []
            for _ in range(repeats):
                seconds, cpu, Z = server.fit(tol, mode)
                times.append(seconds)
                if seconds > 2.0:
                    break
            gap = gap_of(problem, Z)
            run.points.append((min(times), gap))
            run.gap = gap if run.gap is None else min(run.gap, gap)
            if gap <= TARGET and (best is None or min(times) < best[0]):
                best = (min(times), (tol, mode))
            if min(times) > time_cap:
                break
    if best is None:
        run.note = f"not certified down to tol={ADELIE_TOLS[-1]:g}"
        return None, run
    run.note = f"{best[1][1]} tol={best[1][0]:g}"
    return best[1], run


ROUND_SECONDS, MAX_ROUNDS = 0.2, 30  # interleaved: more rounds for a fast row, until each solver's runs take this long
FAST_RUN = 0.05  # seconds: a row whose runs all take less ends its rounds with a whole cycle of the square


def balanced_orders(n):
    """The orders of ``n`` solvers, one per round, in which each solver runs right after each other one equally
    often (Williams' balanced Latin square: ``n`` rows for an even ``n``, these and their reverses for an odd one;
    ordered so that no round starts with the solver that ended the one before; two solvers simply alternate)."""
    if n <= 2:
        return [list(range(n))]
    base, low, high = [0], 1, n - 1
    for i in range(1, n):
        if i % 2:
            base.append(low)
            low += 1
        else:
            base.append(high)
            high -= 1
    rows = [[(b + r) % n for b in base] for r in range(n)]
    rows += [row[::-1] for row in rows] if n % 2 else []
    order = [rows.pop(0)]
    while rows:
        row = next((row for row in rows if row[0] != order[-1][-1]), rows[0])
        rows.remove(row)
        order.append(row)
    return order


def interleaved(timers, repeats=5):
    """Each of ``timers`` (name -> callable returning ``(seconds, cpu seconds, output)``) run in turn, one round after
    another (the same load for each), in the orders of :func:`balanced_orders`: the run after another solver's
    finds the caches as that solver left them, and each solver runs after each other one equally often (a rotation
    of one order puts each solver after the same one in every round); ``repeats`` rounds, and more on a fast row,
    until every solver's runs have taken ``ROUND_SECONDS`` (at most ``MAX_ROUNDS``; a best of 5 runs of a few
    milliseconds measures the caches more than the solver), then to the end of a cycle of the square where every
    run is shorter than ``FAST_RUN``. Runs past 2 s are not repeated. Returns name -> ``(best seconds, cpu seconds
    of that run, its output)``."""
    best, spent, names = {}, dict.fromkeys(timers, 0.0), list(timers)
    orders = balanced_orders(len(names))
    rounds = 0

    def more():
        if rounds < repeats or (rounds < MAX_ROUNDS and min(spent.values()) < ROUND_SECONDS):
            return True
        return rounds % len(orders) != 0 and max(run[0] for run in best.values()) < FAST_RUN

    while more():
        for i in orders[rounds % len(orders)]:
            name = names[i]
            if name in best and best[name][0] > 2.0:
                spent[name] = max(spent[name], ROUND_SECONDS)
                continue
            seconds, cpu, out = timers[name]()
            spent[name] += seconds
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, cpu, out)
        rounds += 1
    return best


def timed_once(f):
    """A timer for :func:`interleaved`: one call of ``f``, its wall and CPU seconds and its output."""
    def timer():
        t, c = time.perf_counter(), time.process_time()
        out = f()
        return time.perf_counter() - t, time.process_time() - c, out
    return timer


FAST_ROW = 0.25  # seconds: a row whose ct.solve, backend, skglm and celer runs all take less is timed again interleaved


def retime(problem, D, runs):
    """Where ct.solve, the backend and the swept skglm (both solvers) and celer each took under ``FAST_ROW``
    (each timed in a block of its own, best of 3: a run of a few milliseconds right after another of the same
    solver measures the caches that run left), time them again at their settings as the headline does
    (:func:`interleaved`: every solver as many times, right after each other one equally often) and credit
    each with that best run."""
    fits = {"skglm": skglm_fit, "skglm_pn": lambda p, D: skglm_fit(p, D, solver="prox_newton"), "celer": celer_fit}
    names = [name for name in ("ct.solve", "fista", *fits) if name in runs]
    if any(runs[name].seconds is None or runs[name].seconds >= FAST_ROW for name in names):
        return
    timers = our_timers(problem, "fista")
    for name in names[2:]:
        timers[name] = (lambda f, tol: timed_once(lambda: f(tol)))(fits[name](problem, D), runs[name].setting)
    for name, (seconds, cpu, out) in interleaved(timers).items():
        run = runs[name]
        if name not in fits:  # our history's times, scaled to the run credited (as run_fista scales them)
            run.points = [(t * seconds / run.seconds, gap) for t, gap in run.points]
        run.seconds, run.cpu = seconds, cpu


def our_timers(problem, backend="backend"):
    """Timers for :func:`interleaved` of ours on one thread: ``ct.solve`` (what a user calls, the verification
    included) and the backend alone (named ``backend``), each on a :func:`fresh` problem."""
    from cvxtransformer.solvers.proxgrad import ProxGrad

    return {"ct.solve": timed_once(lambda: ct.solve(fresh(problem), "fista", tol=TARGET, threads=1)),
            backend: timed_once(lambda: ProxGrad().solve(fresh(problem), tol=TARGET, threads=1))}


def swept_tol(fit, problem, tols):
    """The loosest of ``tols`` at which ``fit(tol)`` (program (8): coefficients in Z's layout) is certified at
    ``TARGET``, or None."""
    return next((tol for tol in tols if gap_of(problem, fit(tol)) <= TARGET), None)


def passes_of(solve, X):
    """``solve()`` once, counting the entries of X its attention operators read (gathered by ``rows``, read
    in place by ``_runs_of``), in passes over X: ``(passes, output)``."""
    from cvxtransformer.core.attention import AttentionOperator

    read, saved = [0.0], {name: getattr(AttentionOperator, name) for name in ("rows", "_runs_of")}

    def counting(method):
        def counted(op, s, e):
            read[0] += (e - s) * op.nK * op.d / X.size
            return method(op, s, e)
        return counted

    try:
        for name, method in saved.items():
            setattr(AttentionOperator, name, counting(method))
        out = solve()
    finally:
        for name, method in saved.items():
            setattr(AttentionOperator, name, method)
    return read[0], out
