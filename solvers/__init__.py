"""Solver backends of cvxtransformer.

Each backend is a :class:`~cvxtransformer.solvers.base.Solver` class: its ``forms``, what it ``requires`` of the
problem's loss, regulariser and program, its optional ``packages`` and ``options``, checked by
``validate`` before it runs. :data:`SOLVERS` is the typed registry that
:func:`cvxtransformer.solve` looks backends up in. This package depends on
:mod:`cvxtransformer.core` only.
"""
from cvxtransformer.core.contracts import SOLVER_FACES, check_faces

from .base import Solver
from .cvxpy_solvers import SCS, Clarabel
from .proxgrad import ProxGrad

SOLVERS = {}


def register(cls):
    """Add the solver class ``cls`` to :data:`SOLVERS` under ``cls.name`` once it offers every face of
    the contract (:data:`~cvxtransformer.core.contracts.SOLVER_FACES`); otherwise one error names the
    missing faces."""
    check_faces(f"register: solver {getattr(cls, 'name', None)!r}", cls, SOLVER_FACES)
    SOLVERS[cls.name] = cls
    return cls


for _solver in (Clarabel, SCS, ProxGrad):
    register(_solver)


def get_solver(name, auto=False):
    """A solver instance by name ("clarabel", "scs", "fista"); errors name the argument (and "auto"
    among the choices where the caller takes it, ``auto``)."""
    from cvxtransformer.core.errors import invalid

    if not isinstance(name, str) or name not in SOLVERS:
        raise invalid("solver", ("'auto' or " if auto else "") + f"one of {sorted(SOLVERS)}", repr(name))
    return SOLVERS[name]()


__all__ = ["SOLVERS", "Clarabel", "ProxGrad", "SCS", "Solver", "get_solver", "register"]
