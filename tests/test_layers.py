"""One direction of dependency: commands and experiments -> networks, solve and certify -> solver
backends -> core. Each layer is imported, and used, in a fresh interpreter in which every layer
above it is unimportable; the test fails if any of them is needed."""
import subprocess
import sys
import textwrap

import pytest

CORE = ["cvxtransformer.core"]
SOLVERS = ["solvers"]
API = ["cvxtransformer.solving", "cvxtransformer.verify", "cvxtransformer.path", "cvxtransformer.comparison",
       "cvxtransformer.nn",
       "cvxtransformer.datasets", "cvxtransformer.testing", "cvxtransformer.estimators", "cvxtransformer.energy"]
COMMANDS = ["cvxtransformer.cli", "cvxtransformer.experiments", "cvxtransformer.__main__"]

USE = {
    "core": """
        import numpy as np
        from cvxtransformer.core.problem import make_problem
        from cvxtransformer.core.certificate import assemble
        from cvxtransformer.core.cvxpy_builders import build_primal
        X = np.random.default_rng(0).standard_normal((10, 3, 2))
        for program in (12, "mhsa", "gated_mhsa"):
            P = make_problem(X, X[:, 0, :], program=program, beta=0.5)
            cert = assemble(P, P.zeros(), {}, 1e-6)
            assert cert.primal_objective >= cert.dual_objective
            build_primal(P)
    """,
    "solvers": """
        import numpy as np
        from cvxtransformer.core.problem import make_problem
        from solvers import get_solver
        X = np.random.default_rng(0).standard_normal((10, 3, 2))
        P = make_problem(X, X[:, 0, :], program=10, beta=0.5)
        for name in ("clarabel", "scs", "fista"):
            out = get_solver(name).solve(P, tol=1e-4)
            assert out.Z.shape == P.program.shape
    """,
    "api": """
        import numpy as np
        import cvxtransformer as ct
        from cvxtransformer.nn.networks import AlternativeAttention
        from cvxtransformer.nn.trainer import train
        X = np.random.default_rng(0).standard_normal((10, 3, 2))
        P = ct.make_problem(X, X[:, 0, :], program=10, beta=0.5)
        assert ct.solve(P).certified and ct.certify(P, P.zeros()).relative_gap >= 0
        train(AlternativeAttention(3, 2, 2, 2), X, P.T, "squared", 0.5, steps=3)
    """,
}
LAYERS = {"core": (CORE, SOLVERS + API + COMMANDS), "solvers": (SOLVERS, API + COMMANDS),
          "api": (API, COMMANDS)}

SCRIPT = """
import importlib, importlib.util, pkgutil, sys
BLOCKED = {blocked!r}

class Block:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError("layer violation: " + name + " was imported")
        return None

def load(name):  # a module whose optional package is not installed (MissingDependencyError) is skipped
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if type(exc).__name__ != "MissingDependencyError":
            raise

sys.meta_path.insert(0, Block())
for root in {roots!r}:
    if importlib.util.find_spec(root) is None:
        continue
    module = load(root)
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), root + "."):
        load(info.name)
{use}
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_needs_no_layer_above_it(layer):
    roots, blocked = LAYERS[layer]
    code = SCRIPT.format(blocked=blocked, roots=roots, use=textwrap.dedent(USE[layer]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_the_block_really_blocks():
    code = SCRIPT.format(blocked=["solvers"], roots=["cvxtransformer.solving"], use="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "layer violation: solvers" in out.stderr
