"""Result types: one for every backend's raw output, one for a certified solve.

Fields are typed; the history of an iterative backend is a list of :class:`Check` records.
"""
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from .io import dumps, save_npz


@dataclass
class Check:
    """One gap evaluation of an iterative solver.

    kind : "certified" (the whole problem, float64) or "inner" (a working-set subproblem)
    screened : blocks proved zero so far (certified checks); working_set : blocks in the working set
    """

    kind: str
    iteration: int
    seconds: float
    primal: float
    dual: float
    gap: float
    relative_gap: float
    screened: Optional[int] = None
    working_set: Optional[int] = None
    method: Optional[str] = None


@dataclass
class BackendOutput:
    """What a solver backend returns; :func:`cvxtransformer.solve` certifies it.

    Attributes
    ----------
    Z : coefficients in the program's shape
    V : a candidate dual point (N, n_outputs), or None
    screened : blocks the backend proved zero (the regulariser's block mask), or None
    formulation : how a CVXPY backend handed the program to CVXPY ("compressed", "factored",
        "direct"; :mod:`cvxtransformer.core.cvxpy_builders`), None for other backends
    """

    Z: np.ndarray
    V: Optional[np.ndarray]
    status: str
    build_seconds: float
    solve_seconds: float
    iterations: Optional[int] = None
    history: list = field(default_factory=list)
    screened: Optional[np.ndarray] = None
    formulation: Optional[str] = None


@dataclass
class SolveResult:
    """A solution and its certificate.

    Attributes
    ----------
    Z : coefficients in the program's shape
    V : the dual point used by the certificate, (N,) when there is one output, (N, c) otherwise
    status : the backend's own status string (reported, never trusted)
    certificate : :class:`cvxtransformer.core.certificate.Certificate`, recomputed from Z
    screened : blocks proved zero by gap-safe screening (groups, or singular directions), or None
    history : list of :class:`Check` (iterative backends)
    formulation : the CVXPY formulation ("compressed", "factored", "direct"), None when no CVXPY
        problem was solved (the torch backend, or Z = 0 for beta >= beta_max)
    solver_choice : why ``solver="auto"`` took ``solver`` (None when the solver was named)
    gate_arrays : the program's gate arrays by name (``program.gate_arrays()``; empty without gates)
    """

    program: object
    loss: str
    form: str
    solver: str
    beta: float
    Z: np.ndarray
    V: np.ndarray
    status: str
    certificate: object
    solve_seconds: float
    build_seconds: float = 0.0
    iterations: Optional[int] = None
    history: list = field(default_factory=list)
    screened: Optional[np.ndarray] = None
    formulation: Optional[str] = None
    solver_choice: Optional[str] = None  # why solver="auto" took ``solver`` (None: the solver was named)
    gate_arrays: dict = field(default_factory=dict)  # the program's gate arrays by name (program.gate_arrays())

    @property
    def certified(self):
        return self.certificate.certified

    def summary(self):
        """JSON-ready dict: the fields of the command line's ``--json`` output."""
        out = {"program": self.program, "loss": self.loss, "form": self.form, "formulation": self.formulation,
               "solver": self.solver, "solver_choice": self.solver_choice, "beta": self.beta}
        out.update(self.certificate.to_dict())
        out.update(status=self.status, solve_seconds=self.solve_seconds,
                   build_seconds=self.build_seconds, iterations=self.iterations)
        return out

    def history_dicts(self):
        return [asdict(h) for h in self.history]

    def save(self, path, **extra):
        """Write ``Z``, ``V``, ``beta``, the program's gate arrays by name (:attr:`gate_arrays`, e.g. those of
        program (12)) and the ``extra`` arrays to ``path`` atomically."""
        arrays = {"Z": self.Z, "V": self.V, "beta": np.float64(self.beta), "summary": np.array(dumps(self.summary())),
                  **extra, **self.gate_arrays}
        save_npz(path, **arrays)
