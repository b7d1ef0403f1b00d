"""cvxtransformer: convexified transformer attention, solved and certified exactly.

Ergen, Neyshabur & Mehta, "Convexifying Transformers" (arXiv 2211.11052): with attention rows on
the simplex, regularized training of attention-only networks (with or without a gated-ReLU FCN)
is a group-lasso program, (8), (10) or (12). Sahiner et al.: linear multi-head self-attention
with weight decay is a nuclear-norm program, (6), and with a gated ReLU on the attention scores a
sum of nuclear norms, one per gate. This package builds those programs (the families of
:mod:`cvxtransformer.core.registry`) and their duals, solves them, and certifies any solution.

Layers (each imports only the ones below it; see docs/architecture.md):

* :mod:`cvxtransformer.core`: losses, regularisers, programs, problems, certificates, reductions;
* :mod:`cvxtransformer.solvers` (the folder ``solvers/`` at the repository's top level): Clarabel,
  SCS and the torch proximal-gradient backend;
* :func:`solve`, :func:`certify`, :func:`solve_path`, :mod:`cvxtransformer.nn` (nonconvex
  networks and their trainer), :mod:`cvxtransformer.datasets`;
* :mod:`cvxtransformer.cli` and :mod:`cvxtransformer.experiments`.

The names below are loaded on first use, so that importing a lower layer never imports an
upper one (and ``import cvxtransformer`` is instant).
"""
import importlib as _importlib
import os as _os

__version__ = "0.2.0"

# ``cvxtransformer.solvers`` is the folder solvers/ at the repository's top level. An install puts it
# inside this package (pyproject.toml's package-dir); in a source checkout (or an editable install)
# it is beside it, and is found there by adding the checkout to this package's search path.
_CHECKOUT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "solvers")) and \
        _os.path.isfile(_os.path.join(_CHECKOUT, "solvers", "__init__.py")):
    __path__.append(_CHECKOUT)

# the generic modules' exports; each program family's module (registry.MODULES) exports its own ``__all__``,
# and the estimators their classes of each family, found on first use (_family_exports)
_EXPORTS = {
    "cvxtransformer.core.errors": ("CvxTransformerError", "InvalidInputError", "MissingDependencyError", "SolverError"),
    "cvxtransformer.core.losses": ("CrossEntropyLoss", "LogisticLoss", "Loss", "SquaredLoss", "get_loss"),
    "cvxtransformer.core.regularizers": ("GroupLasso", "NuclearNorm", "Regularizer"),
    "cvxtransformer.core.problem": ("ConvexProblem", "make_problem"),
    "cvxtransformer.core.certificate": ("Certificate", "dual_feasible_point", "kkt_residuals"),
    "cvxtransformer.core.reductions": ("nonconvex_objective", "recover_weights"),
    "cvxtransformer.core.result": ("SolveResult",),
    "cvxtransformer.solving": ("choose_solver", "solve"),
    "cvxtransformer.verify": ("NetworkCertificate", "certify", "certify_network"),
    "cvxtransformer.path": ("PathPoint", "beta_grid", "solve_path"),
    "cvxtransformer.comparison": ("Comparison", "compare"),
    "cvxtransformer.estimators": ("AttentionClassifier", "AttentionRegressor", "ConvexClassifier", "ConvexRegressor",
                                  "TokenStandardScaler"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


def _family_exports():
    """Name -> module of what the program families export: each built-in family module's ``__all__`` and
    the estimators of every registered family that declares some (imports the family modules, not
    scikit-learn)."""
    from .core.registry import MODULES, estimator_names

    where = {}
    for module in MODULES:
        where.update(dict.fromkeys(getattr(_importlib.import_module(module), "__all__", ()), module))
    where.update(dict.fromkeys(estimator_names(), "cvxtransformer.estimators"))
    return where


def __getattr__(name):
    if name == "__all__":  # every public name (imports the family modules)
        return sorted(set(_WHERE) | set(_family_exports()))
    module = _WHERE.get(name)
    if module is None and not name.startswith("_"):
        module = _family_exports().get(name)
    if module is None:
        raise AttributeError(f"module 'cvxtransformer' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    """The public names: the exports, ``__version__`` and the submodules loaded so far (no helpers)."""
    return sorted({name for name in globals() if not name.startswith("_")} | set(__getattr__("__all__"))
                  | {"__version__"})
