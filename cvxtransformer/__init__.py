"""cvxtransformer: convexified transformer attention, solved and certified exactly.

Ergen, Neyshabur & Mehta, "Convexifying Transformers" (arXiv 2211.11052): with attention
rows on the simplex, regularized training of attention-only networks (with or without a
gated-ReLU FCN) is a group-lasso program, (8), (10) or (12). This package builds those
programs and their duals, solves them, and certifies any solution.
"""
from .certificate import Certificate, certify, dual_feasible_point, kkt_residuals
from .errors import CvxTransformerError, InvalidInputError, MissingDependencyError, SolverError
from .losses import CrossEntropyLoss, LogisticLoss, SquaredLoss, get_loss
from .path import PathPoint, beta_grid, solve_path
from .problem import ConvexProblem, make_problem
from .programs import Program, gate_mask, sample_gates
from .recovery import NonconvexWeights, nonconvex_objective, recover_weights
from .result import SolveResult
from .solve import solve

__version__ = "0.1.0"

__all__ = [
    "Certificate", "ConvexProblem", "CrossEntropyLoss", "CvxTransformerError", "InvalidInputError",
    "LogisticLoss", "MissingDependencyError", "NonconvexWeights", "PathPoint", "Program", "SolveResult",
    "SolverError", "SquaredLoss", "certify", "dual_feasible_point", "gate_mask", "get_loss",
    "beta_grid", "kkt_residuals", "make_problem", "nonconvex_objective", "recover_weights", "sample_gates",
    "solve", "solve_path",
]
