"""One result type for every backend, and its RESULT.npz file."""
import json
import os
import tempfile
from dataclasses import dataclass, field

import numpy as np


@dataclass
class SolveResult:
    """A solution of program (8), (10) or (12) and its certificate.

    Z : coefficients in the program's public shape
    V : the dual point used by the certificate, (N,) for program (8), (N, c) otherwise
    status : the backend's own status string (reported, never trusted)
    certificate : :class:`cvxtransformer.certificate.Certificate`, recomputed from Z
    """

    program: int
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
    iterations: int = None
    U1: np.ndarray = None
    U2: np.ndarray = None
    history: list = field(default_factory=list)

    @property
    def certified(self):
        return self.certificate.certified

    def summary(self):
        """JSON-ready dict: the fields of the command line's ``--json`` output."""
        out = {"program": self.program, "loss": self.loss, "form": self.form, "solver": self.solver,
               "beta": self.beta}
        out.update(self.certificate.to_dict())
        out.update(status=self.status, solve_seconds=self.solve_seconds,
                   build_seconds=self.build_seconds, iterations=self.iterations)
        return out

    def save(self, path):
        """Write ``Z``, ``V`` (and ``U1``, ``U2`` for program (12)) to ``path`` atomically."""
        arrays = {"Z": self.Z, "V": self.V, "summary": np.array(json.dumps(self.summary()))}
        if self.U1 is not None:
            arrays.update(U1=self.U1, U2=self.U2)
        save_npz_atomic(path, **arrays)


def save_npz_atomic(path, **arrays):
    """``np.savez`` to a temporary file in the same folder, renamed into place when complete."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
