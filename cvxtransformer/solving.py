"""``solve``: one entry point for every backend, returning a certified :class:`SolveResult`."""
import contextlib
import sys
import threading
import time

import numpy as np

from cvxtransformer.solvers import SOLVERS, get_solver

from .core.certificate import gap_safe_screen, screen_solution
from .core.errors import invalid
from .core.problem import check_problem
from .core.result import SolveResult
from .core.threads import limited
from .core.validation import check_bool, check_choice, check_positive, check_tol
from .verify import certify


AUTO_COEFFICIENTS = 2e5  # CVXPY coefficients (design rows x features x columns) up to which "auto" takes Clarabel


def choose_solver(problem, form="primal", options=None, tol=1e-6):
    """``(solver, why)``: the backend that ``solver="auto"`` takes for ``problem``. Clarabel (interior
    point: the tightest certificates) for a small CVXPY problem, the torch backend ("fista", which
    never forms the design and streams the data) otherwise, or when an option or the form
    needs one of them (the dual form: CVXPY; a sharded problem or a torch option: fista)."""
    from .core.cvxpy_builders import cvxpy_coefficients, estimate_cvxpy_bytes
    from .core.validation import available_bytes, format_bytes

    check_choice("form", form, ("primal", "dual"))
    if options is not None and not isinstance(options, dict):
        raise invalid("options", "a dict of solver options (or None)", type(options).__name__)
    tol = check_tol(tol)
    options = dict(options or {})
    clarabel = SOLVERS["clarabel"]()
    cvxpy_options = sorted({"formulation", "nuclear_form"} & set(options))
    torch_only = sorted(set(options) - set(clarabel.translate) - set(clarabel.settings(tol, {})) - set(cvxpy_options))
    if form != "primal":
        return "clarabel", f"auto: the {form} form is solved by CVXPY"
    if problem.program.shards is not None:
        return "fista", "auto: a problem sharded over processes"
    if torch_only:
        return "fista", f"auto: option {torch_only[0]} is the torch backend's"
    if cvxpy_options:
        return "clarabel", f"auto: option {cvxpy_options[0]} is CVXPY's"
    formulation = options.get("formulation", "auto")
    size = float(cvxpy_coefficients(problem, formulation))
    need, room = estimate_cvxpy_bytes(problem, form, clarabel, formulation), available_bytes()
    if size <= AUTO_COEFFICIENTS and need <= room / 2:
        return "clarabel", f"auto: a small problem ({size:.2g} CVXPY coefficients <= {AUTO_COEFFICIENTS:.0e})"
    why = f"{size:.2g} CVXPY coefficients > {AUTO_COEFFICIENTS:.0e}" if size > AUTO_COEFFICIENTS else \
        f"CVXPY would take about {format_bytes(need)} of {format_bytes(room)} available"
    return "fista", f"auto: {why}"


@contextlib.contextmanager
def heartbeat(what, after=5.0, every=30.0, stream=None):
    """While the block runs: a line on ``stream`` (stderr) once it has run ``after`` seconds, then every
    ``every`` seconds, saying ``what`` runs and for how long (``after=None``: silent)."""
    if after is None:
        yield
        return
    done, start = threading.Event(), time.perf_counter()

    def beat():
        wait = min(after, threading.TIMEOUT_MAX)  # a wait beyond it overflows (heartbeat_after=1e308)
        while not done.wait(wait):
            print(f"cvxtransformer: {what}: running for {time.perf_counter() - start:.0f} s",
                  file=stream or sys.stderr, flush=True)
            wait = every

    thread = threading.Thread(target=beat, daemon=True, name="cvxtransformer-heartbeat")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def solve(problem, solver="auto", form="primal", tol=1e-6, verbose=False, screen=True, refine="auto",
          refine_time=10.0, heartbeat_after=None, atol=None, threads=None, **options):
    """Solve a :class:`ConvexProblem` and certify the solution.

    Parameters
    ----------
    problem : ConvexProblem, from :func:`cvxtransformer.make_problem`
    solver : "clarabel" or "scs" (CVXPY backends), "fista" (the torch proximal-gradient backend), or
        "auto" (:func:`choose_solver`: Clarabel for a small problem, fista otherwise; the result's
        ``solver`` names the one taken and ``solver_choice`` why)
    form : "primal" solves the program; "dual" solves its dual ((21)/(28)/(33), or the spectral-norm
        dual of program (6)) and reads Z back from the multipliers of the norm constraints
    tol : relative duality gap ``(P(Z) - D(V)) / D(V)`` at which the result is ``certified``
        (recomputed by the verifier); it bounds ``(P(Z) - p*) / p*`` at every scale of the data
    atol : None (default), or an absolute gap ``P(Z) - D(V)`` that certifies too (the certificate's
        ``certified_by`` says which test did; the torch backend stops at either): for data near
        interpolation, where float64 cannot reach ``tol`` relative to a tiny optimum
    screen : set to exactly zero the blocks that the gap-safe test proves zero at every optimum
        (interior-point and splitting solvers return tiny nonzero values there; for the nuclear
        norm, truncate Z to the proved rank bound)
    refine : the verifier's refined dual point (:func:`cvxtransformer.certify`): True, False, or
        "auto" (only when the solver's own dual point does not certify ``tol``)
    refine_time : seconds allowed to the refinement
    heartbeat_after : None (silent), or seconds after which a line on stderr says what the backend is
        solving, its size and for how long (then every 30 s); the command line sets 5
    threads : the most CPU threads the call uses, the backend's and the verification's products, torch's
        and BLAS's (None: torch's setting; small products run on one thread; :mod:`cvxtransformer.core.threads`)
    options : passed to the backend (``max_iter``, ``time_limit``, solver settings; see each solver);
        the CVXPY backends take ``formulation``: "auto" (default: the squared loss compressed to the
        size of Z whatever N, a program's factored map where it offers one and it is smaller), or "compressed",
        "factored", "direct" (the dense design); the one used is ``result.formulation``; and
        ``nuclear_form``, the PSD cones of a nuclear norm in the primal: "joint" (one of side p + q,
        Clarabel's default), "rows" (max(p, q) of side min(p, q) + 1) or "auto" (rows where its
        eigendecompositions cost less, SCS's default; docs/ has the measurements on program (6))

    For ``beta >= beta_max`` the solution ``Z = 0`` is known in closed form; it is returned
    without calling the solver and certified like any other.

    Example
    -------
    >>> import numpy as np, cvxtransformer as ct
    >>> X = np.random.default_rng(0).standard_normal((30, 4, 3))
    >>> P = ct.make_problem(X, X[:, 1, 0], program=8, beta=1.0)
    >>> ct.solve(P, "clarabel").certified
    True
    >>> result = ct.solve(P)   # solver="auto"
    >>> result.solver, result.solver_choice
    ('clarabel', 'auto: a small problem (1.4e+02 CVXPY coefficients <= 2e+05)')
    """
    check_problem(problem)
    tol, atol = check_tol(tol), check_positive("atol", atol, none_ok=True)
    verbose, screen = check_bool("verbose", verbose), check_bool("screen", screen)
    heartbeat_after = check_positive("heartbeat_after", heartbeat_after, none_ok=True)
    threads = check_positive("threads", threads, integer=True, none_ok=True)
    choice = None
    if solver == "auto":
        solver, choice = choose_solver(problem, form, options, tol)
    backend = get_solver(solver, auto=True)
    backend.validate(problem, form, options)
    program = problem.program
    # one thread policy for the backend and the verification: the blocks they open inside this one, of the same
    # number, leave BLAS as it is
    with limited(threads):
        start = time.perf_counter()
        limit = options.get("time_limit")  # the whole call ends within time_limit + refine_time (+ a few passes)
        deadline = None if limit is None else start + float(limit) + float(refine_time)
        screened = formulation = None
        if problem.beta >= problem.beta_max():
            Z, V, status, times, iterations, history = (problem.zeros(), None, "zero (beta >= beta_max)",
                                                        (0.0, 0.0), 0, [])
        else:
            what = (f"{solver} on the {form} of {program.label}, N = {program.N} samples, Z of shape {program.shape} "
                    f"({int(np.prod(program.shape))} coefficients)")
            extra = {}
            if backend.name == "fista":  # its stop at atol, its threads; no V that the verifier computes from Z itself
                extra = dict(threads=threads, residual_dual=False, **({} if atol is None else {"atol": atol}))
            with heartbeat(what, heartbeat_after):
                out = backend.solve(problem, form=form, tol=tol, verbose=verbose, **extra, **options)
            Z, V, status, iterations, history = out.Z, out.V, out.status, out.iterations, out.history
            if Z is None:  # the backend's time limit came before any solution: Z = 0 is certified, nothing refined
                Z, refine = problem.zeros(), False
            times, screened, formulation = (out.build_seconds, out.solve_seconds), out.screened, out.formulation
            if screen and screened is None:
                Z, screened = screen_solution(problem, Z, V)
        cert = certify(problem, Z, V=V, tol=tol, refine=refine, refine_time=refine_time, atol=atol, deadline=deadline,
                       threads=threads)
        if screened is None:  # at the certificate's dual point, whose scores A^T V it computed
            screened = gap_safe_screen(problem, cert.V, cert.duality_gap, cert.G)
    V_out = cert.V[:, 0] if program.scalar_output else cert.V
    return SolveResult(program=program.name, loss=problem.loss.name, form=form, solver=solver, solver_choice=choice,
                       beta=problem.beta, Z=Z, V=V_out, status=status, certificate=cert,
                       build_seconds=times[0], solve_seconds=times[1], iterations=iterations,
                       gate_arrays=program.gate_arrays(),
                       history=history, screened=np.asarray(screened), formulation=formulation)
