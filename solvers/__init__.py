"""Solver backends of cvxtransformer.

A backend is a function ``backend(problem, form, tol, verbose, **options) -> BackendOutput``
that returns canonical coefficients Z of shape (h, c, n, d) and a candidate dual point;
:func:`cvxtransformer.solve` certifies whatever it returns. Backends are looked up by name
in :data:`BACKENDS` and imported only when used, so a missing optional dependency fails
only for the backend that needs it.
"""
from dataclasses import dataclass, field
from importlib import import_module

import numpy as np


@dataclass
class BackendOutput:
    Z4: np.ndarray
    V: np.ndarray
    status: str
    build_seconds: float
    solve_seconds: float
    iterations: int = None
    history: list = field(default_factory=list)


# name -> (module, function, forms it supports)
BACKENDS = {
    "clarabel": ("solvers.cvxpy_backend", "solve_clarabel", ("primal", "dual")),
    "scs": ("solvers.cvxpy_backend", "solve_scs", ("primal", "dual")),
    "fista": ("solvers.fista", "solve_fista", ("primal",)),
}


def get_backend(name):
    """The backend function and the forms it supports, for a solver name."""
    module, function, forms = BACKENDS[name]
    return getattr(import_module(module), function), forms
