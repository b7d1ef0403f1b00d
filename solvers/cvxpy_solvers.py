"""CVXPY backends: any program or its dual, built by :mod:`cvxtransformer.core.cvxpy_builders`,
solved with Clarabel (interior point) or SCS (operator splitting).

The option ``formulation`` ("auto", "compressed", "factored" or "direct") chooses how the program is
handed to CVXPY; "auto" picks the most compact one the problem allows (the squared loss compressed to
the size of its coefficients, whatever N), and the one used is recorded in the result. CVXPY is
imported when one of them validates or solves a problem, not with this module (a torch solve never
imports it).
"""
import ctypes
import signal
import threading
import time
import warnings

from cvxtransformer.core.contracts import CVXPY_BUILDERS
from cvxtransformer.core.errors import MissingDependencyError, SolverError, invalid
from cvxtransformer.core.result import BackendOutput
from cvxtransformer.core.validation import check_allocation, check_int, check_positive

from .base import Solver

NUCLEAR_FORMS = ("auto", "joint", "rows")  # the option nuclear_form (NuclearNorm.cvxpy_penalty)


class TimeLimitReached(Exception):
    """Raised by :func:`interruptible` when its ``timeout`` passes before the call returns."""


class _Abandoned(BaseException):
    """Raised inside a call that :func:`interruptible` stopped waiting for (its timeout passed): it ends
    the call's Python code at its next bytecode (a native solver runs on until it returns)."""


def interruptible(call, poll=0.05, timeout=None):
    """``call()`` run in a daemon thread while the main thread waits for it, so that Ctrl-C and SIGTERM
    are acted on at once: Python runs its signal handlers in the main thread only, between bytecodes,
    and a native solver (Clarabel, SCS: they release the GIL) would otherwise hold the main thread
    until it returns. SCS installs its own Ctrl-C handler while it runs (it would end the solve as a
    failure), so Python's is installed again at every poll. After an interruption the solver thread
    runs on in the background until it returns or the process exits (the command line exits).

    ``timeout`` (seconds, a function that says them at the time it is called, or None): past it (counted
    from the start), :class:`TimeLimitReached` is raised in the main thread
    and the call is abandoned: an exception is raised in its thread (``PyThreadState_SetAsyncExc``),
    which ends CVXPY's compilation, which is Python, within a bytecode, and native code (a solver's
    setup, which its own time limit does not bound) when it returns. Called outside the main thread,
    ``call()`` runs in the caller's thread, without ``timeout``."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="cvxpy-solve", daemon=True)
    handler = signal.getsignal(signal.SIGINT)
    start = time.perf_counter()
    worker.start()
    while worker.is_alive():
        end = None if timeout is None else start + (timeout() if callable(timeout) else timeout)
        worker.join(poll if end is None else min(poll, max(0.0, end - time.perf_counter())))
        if callable(handler) or handler in (signal.SIG_DFL, signal.SIG_IGN):
            signal.signal(signal.SIGINT, handler)
        if end is not None and worker.is_alive() and time.perf_counter() >= end:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(_Abandoned))
            raise TimeLimitReached()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


GRACE = 1.0  # seconds past time_limit that a CVXPY solve is waited for (its solver stops itself by time_limit)


class CVXPYSolver(Solver):
    """A conic solver called through CVXPY; ``formulation``, ``nuclear_form``, ``max_iter``, ``time_limit``
    and the solver's own settings (by their CVXPY names) are options. ``time_limit`` bounds the whole
    solve: the build, CVXPY's compilation and the solver (given the time left), which is waited for
    :data:`GRACE` more; past it there is no solution (``Z=None``, the status says where the time went)."""

    forms = ("primal", "dual")
    requires = CVXPY_BUILDERS
    cvxpy_name = ""
    translate = {}  # our option name -> the solver's setting
    max_iter_limit = 0  # the largest iteration budget the solver's integer type holds
    # Memory of a CVXPY build and solve with this solver, measured (peak RSS over the interpreter's,
    # ``ru_maxrss``) by benchmarks/memory.py on the project's machine (docs/benchmark_memory.md): per
    # nonzero of the map CVXPY gets (and of the loss's and the regulariser's cones) and per entry of
    # the dense Hessian block of a PSD cone (the nuclear norm's, of side p + q for Z of shape (p, q)),
    # each the largest ratio measured, rounded up; read by core.cvxpy_builders.estimate_cvxpy_bytes.
    bytes_per_coefficient = None
    bytes_per_psd_entry = None
    # The PSD cones of a nuclear norm in the primal (NuclearNorm.cvxpy_penalty), the default of the option
    # nuclear_form: "joint", one cone of side p + q, "rows", max(p, q) cones of side min(p, q) + 1, or
    # "auto", rows where its eigendecompositions cost less (NuclearNorm.resolve_form); each solver's is the
    # faster one measured on program (6) (its docs page).
    nuclear_form = "joint"

    def settings(self, tol, options):
        raise NotImplementedError

    def validate(self, problem, form, options):
        known = set(self.translate) | set(self.settings(1e-6, {})) | {"formulation", "nuclear_form"}
        self.options = tuple(sorted(known))
        super().validate(problem, form, options)
        import cvxpy as cp

        from cvxtransformer.core.cvxpy_builders import choose_formulation

        choose_formulation(problem, options.get("formulation", "auto"))
        if options.get("nuclear_form", "joint") not in NUCLEAR_FORMS:
            raise invalid("nuclear_form", f"one of {NUCLEAR_FORMS}", repr(options["nuclear_form"]))
        if options.get("max_iter") is not None:
            check_int("max_iter", options["max_iter"], 1)
            if options["max_iter"] > self.max_iter_limit:
                raise invalid("max_iter", f"an integer in [1, {self.max_iter_limit}] for solver {self.name!r} (the "
                              "largest budget its iteration counter holds)", repr(options["max_iter"]),
                              f"pass at most {self.max_iter_limit}, or bound the solve with time_limit")
        check_positive("time_limit", options.get("time_limit"), none_ok=True)
        for key, default in self.settings(1e-6, {}).items():  # the solver's own settings, by its names
            if key in options and key not in self.translate:  # (ours, translated, are checked above)
                if isinstance(default, int):
                    check_int(key, options[key], 1, self.max_iter_limit)
                else:
                    check_positive(key, options[key])
        if self.cvxpy_name not in cp.installed_solvers():
            raise MissingDependencyError(f"solver: {self.name} is not installed; pip install {self.name}")

    def solve(self, problem, form="primal", tol=1e-6, verbose=False, formulation="auto", nuclear_form=None,
              **options):
        import cvxpy as cp

        from cvxtransformer.core.cvxpy_builders import BUILDERS, cvxpy_coefficients, estimate_cvxpy_bytes

        label = problem.program.label
        nuclear_form = nuclear_form or self.nuclear_form
        check_allocation("solver", estimate_cvxpy_bytes(problem, form, self, formulation, nuclear_form),
                         f"{self.name} on the CVXPY {form} of {label} ({cvxpy_coefficients(problem, formulation):.2g} "
                         "coefficients), which would take about",
                         "use solver='fista' (--solver fista" + (" --form primal" if form != "primal" else "")
                         + "), the torch backend, which never forms it"
                         + (", or fewer gates (--gates)" if problem.program.gate_arrays() else ""))
        t0 = time.perf_counter()
        limit = options.pop("time_limit", None)
        deadline = None if limit is None else t0 + limit
        settings = self.settings(tol, {self.translate.get(k, k): v for k, v in options.items()
                                       if v is not None})  # max_iter=None: no budget (the solver's default)
        psd = {"nuclear_form": nuclear_form} if form == "primal" else {}  # the dual has one LMI form
        phase, t1 = ["our build of the CVXPY problem"], []

        def build_and_solve():
            """Our build, CVXPY's compilation, then the solver with the time left (None: no time left)."""
            built = BUILDERS[form](problem, formulation, **psd)
            t1.append(time.perf_counter())
            if verbose:
                print(f"{self.name}: the {form} of {label}, {built.formulation} formulation, built in "
                      f"{t1[0] - t0:.2f} s")
            phase[0] = "CVXPY's compilation"
            data, chain, inverse = built.problem.get_problem_data(solver=self.cvxpy_name, verbose=verbose,
                                                                  solver_opts=settings)
            left = None
            if deadline is not None:
                left = deadline - time.perf_counter()
                if left <= 0:
                    return None
                settings[self.translate["time_limit"]] = left
            phase[0] = (f"{self.name}, started with {left:.2g} s left" if deadline is not None else self.name) + \
                " (its setup, a factorization, is not bounded by its time limit)"
            solution = chain.solve_via_data(built.problem, data, False, verbose, settings)
            built.problem.unpack_results(solution, chain, inverse)
            return built

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # a stack of matrices (the gated MHSA program) is canonicalised by CVXPY's SciPy backend: not news
            warnings.filterwarnings("ignore", message="The problem has an expression with dimension greater than 2")
            try:
                # past the limit, the solver (once started with the time left) is given GRACE to stop itself
                built = interruptible(build_and_solve, timeout=None if limit is None else
                                      lambda: limit + (GRACE if phase[0].startswith(self.name) else 0.0))
            except TimeLimitReached:
                built = None
            except cp.error.SolverError as exc:
                raise SolverError(f"solver: {self.name} failed on the {form} of {label} ({exc}); try the "
                                  "other solver, a larger beta, or rescaled data") from None
        t2 = time.perf_counter()
        t1 = t1[0] if t1 else t2
        if built is None:  # the time limit came first: no solution (solve certifies Z = 0 and says so)
            return BackendOutput(Z=None, V=None, status=f"time_limit reached in {phase[0]} (after {t2 - t0:.1f} s, "
                                 f"limit {limit:g} s): no solution", build_seconds=t1 - t0, solve_seconds=t2 - t1)
        status = built.problem.status
        if status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE, cp.USER_LIMIT):
            raise SolverError(f"solver: {self.name} returned status {status!r} on the {form} of {label}; "
                              "try the other solver")
        try:
            Z, V = built.extract_Z(), built.extract_V()
        except (TypeError, AttributeError, ValueError):
            raise SolverError(f"solver: {self.name} returned no solution (status {status!r}); "
                              "try the other solver") from None
        notes = sorted({str(w.message).split("\n")[0].strip() for w in caught})
        if notes:
            status = f"{status} ({'; '.join(notes)})"
        if deadline is not None and t2 >= deadline and built.problem.status != cp.OPTIMAL:
            status = f"time_limit reached: {status}"
        return BackendOutput(Z=Z, V=V, status=status, build_seconds=t1 - t0, solve_seconds=t2 - t1,
                             iterations=getattr(built.problem.solver_stats, "num_iters", None),
                             formulation=built.formulation)


class Clarabel(CVXPYSolver):
    """Clarabel, interior point: gaps of 1e-9 and below on these programs (docs/accuracy.md)."""

    name = "clarabel"
    cvxpy_name = "CLARABEL"
    bytes_per_coefficient, bytes_per_psd_entry = 300, 64
    nuclear_form = "joint"  # "rows" fills its KKT factor: 6x slower on program (6) at d = 8
    translate = {"max_iter": "max_iter", "time_limit": "time_limit"}
    max_iter_limit = 2**32 - 1  # a u32

    def settings(self, tol, options):
        eps = min(1e-9, 1e-2 * tol)
        settings = dict(tol_gap_abs=eps, tol_gap_rel=eps, tol_feas=eps, tol_ktratio=1e-7, max_iter=500)
        settings.update(options)
        return settings


class SCS(CVXPYSolver):
    """SCS, operator splitting: first-order accuracy, large problems."""

    name = "scs"
    cvxpy_name = "SCS"
    bytes_per_coefficient, bytes_per_psd_entry = 450, 16
    nuclear_form = "auto"  # rows for program (6) with N = 2,000, d = 12, c = 2
    translate = {"max_iter": "max_iters", "time_limit": "time_limit_secs"}
    max_iter_limit = 2**31 - 1  # scs_int, a C int in the wheels (larger values wrap silently)

    def settings(self, tol, options):
        eps = min(1e-6, 1e-2 * tol)
        settings = dict(eps_abs=eps, eps_rel=eps, max_iters=200_000)
        settings.update(options)
        return settings
