"""Standard problems and named checks, shared by the tests and the benchmarks (as numpy.testing
and cvxpy's solver test helpers are).

:data:`CASES` lists every (program, loss, target kind) that docs/conventions.md allows; :func:`random_problem`
builds a small random instance of one with ``beta = frac * beta_max``. The ``check_*`` functions
recompute one property of a solution each, independently of the code that produced it, and raise
``AssertionError`` with a message naming what failed.

Example
-------
>>> from cvxtransformer.testing import random_problem, check_gap
>>> import cvxtransformer as ct
>>> problem = random_problem(10, "squared", "vector")
>>> check_gap(problem, ct.solve(problem), 1e-7)
"""
import numpy as np

from .core.certificate import dual_feasible_point, relative_gap, scaled_residual
from .core.problem import make_problem
from .core.registry import families
from .core.regularizers import GroupLasso

# Every (program, loss, target kind) that docs/conventions.md allows, on small random instances: the cases each
# family declares (its register call's ``cases``), in the registry's order.
CASES = [(name, loss, kind) for name, fam in families().items() for loss, kind in fam.cases]
GROUP_LASSO_CASES = [c for c in CASES if families()[c[0]].program.regularizer_class is GroupLasso]


def cases_of(name):
    """The cases of one family."""
    return [c for c in CASES if c[0] == name]


def case_id(case):
    return f"p{case[0]}-{case[1]}-{case[2]}"


def random_targets(kind, rng, N, n, c=3, d=3):
    """Targets of one kind: scalar (N,), binary (N,) in {-1, +1}, vector (N, c), sequence (N, n, 2),
    channels (N, 2, d) (two outputs per channel, for a token-mixing program), classes (N,) in [0, c)."""
    if kind == "scalar":
        return rng.standard_normal(N)
    if kind == "binary":
        return np.where(rng.standard_normal(N) > 0, 1.0, -1.0)
    if kind == "vector":
        return rng.standard_normal((N, c))
    if kind == "sequence":
        return rng.standard_normal((N, n, 2))
    if kind == "channels":
        return rng.standard_normal((N, 2, d))
    if kind == "classes":
        return rng.integers(0, c, N)
    raise ValueError(kind)


def random_problem(program, loss, kind, seed=0, N=40, n=4, d=3, gates=3, frac=0.3):
    """A random instance with beta = frac * beta_max (so the optimum is sparse, or low-rank, but nonzero);
    ``gates``: h of program (12), P of a family with P gates (sampled from ``seed``)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n, d))
    y = random_targets(kind, rng, N, n, d=d)
    problem = make_problem(X, y, program=program, loss=loss, beta=1.0, gates=gates, gate_seed=seed)
    return problem.with_beta(frac * problem.beta_max())


def check_gap(problem, result, tol):
    """The certificate's numbers are their definitions at the returned Z and V, and the gap is within ``tol``."""
    cert = result.certificate
    P = problem.primal_objective(result.Z)
    assert cert.primal_objective == P, f"P(Z) reported {cert.primal_objective!r}, recomputed {P!r}"
    assert cert.duality_gap == cert.primal_objective - cert.dual_objective, "gap != P - D"
    V = np.asarray(result.V, dtype=float).reshape(problem.T.shape)
    D = problem.dual_objective(V)
    assert np.isclose(D, cert.dual_objective, rtol=1e-12, atol=1e-12), f"D(V) reported {cert.dual_objective}, got {D}"
    check_dual_feasibility(problem, V)
    assert cert.relative_gap >= -1e-14, f"negative gap {cert.relative_gap:.3e}: weak duality violated"
    assert cert.relative_gap <= tol and cert.certified, f"relative gap {cert.relative_gap:.3e} > tol {tol:.1e}"


def check_dual_feasibility(problem, V, rtol=1e-12):
    """``V`` lies in the loss's dual domain and satisfies the dual norm constraint."""
    V = np.asarray(V, dtype=float).reshape(problem.T.shape)
    norm = problem.regularizer.dual_norm(problem.program.adjoint(V))
    assert norm <= problem.beta * (1 + rtol), f"dual norm {norm!r} > beta {problem.beta!r}"
    projected = problem.loss.project_dual_domain(V, problem.T)
    assert np.allclose(projected, V, atol=1e-12, rtol=0), "V is outside the loss's dual domain"


def check_strong_duality(problem, primal_result, dual_result, rtol):
    """The dual program's optimum, at its V made feasible, equals the primal optimum."""
    V, _ = dual_feasible_point(problem, np.asarray(dual_result.V, dtype=float).reshape(problem.T.shape))
    p_star, d_star = primal_result.certificate.primal_objective, problem.dual_objective(V)
    assert abs(p_star - d_star) <= rtol * abs(p_star), f"max D = {d_star!r}, min P = {p_star!r}"


def check_kkt(result, stationarity, feasibility):
    """KKT residuals of docs/conventions.md (relative to beta) below the given levels."""
    cert = result.certificate
    assert cert.kkt_dual_feasibility <= feasibility, f"KKT dual feasibility {cert.kkt_dual_feasibility:.3e}"
    assert cert.kkt_stationarity <= stationarity, f"KKT stationarity {cert.kkt_stationarity:.3e}"


def check_recovery(problem, result, rtol=1e-9):
    """The reduction's ``invert`` gives one head per nonzero group (rank-many for the nuclear norm), and
    the nonconvex objective at the recovered weights equals P(Z)."""
    cert = result.certificate
    assert cert.heads_recovered == problem.regularizer.support_size(result.Z), "heads != support size"
    for value in (cert.recovered_objective, cert.recovered_objective_lemma1):
        if value is not None:
            assert np.isclose(value, cert.primal_objective, rtol=rtol, atol=0), \
                f"recovered objective {value!r} != P(Z) {cert.primal_objective!r}"


def check_training_against_bound(problem, network, lr, steps):
    """Adam on the gated network of ``problem``'s family, ``network(m)`` with m heads (or units), against
    the certified optimum: every objective on the way stays at or above D(V); with twice the heads the
    optimum needs (its support size, at least 2) it ends within 1% of P(Z*); with one head it has a
    rank-one Z whose P is at most its objective, and a certified gap of at least 1% of P(Z*).
    Imports torch (the trainer)."""
    from .nn.trainer import train
    from .solving import solve

    result = solve(problem, "clarabel", tol=1e-9, refine=True)
    r = result.certificate.support_size
    assert r >= 2 and result.certified, f"the optimum needs {r} heads (certified: {result.certified})"
    bound, P_star = result.certificate.dual_objective, result.certificate.primal_objective
    runs = {}
    for m in (1, 2 * r):
        runs[m] = train(network(m), problem.program.X, problem.T, problem.loss, problem.beta, lr=lr, steps=steps)
        assert np.all(runs[m].history.objective >= bound), f"{m} heads went below the certified bound"
    assert runs[2 * r].objective <= 1.01 * P_star, f"{2 * r} heads: {runs[2 * r].objective} > 1.01 P* = {P_star}"
    one = runs[1].objective
    Z1 = runs[1].network.effective_coefficients()
    assert problem.regularizer.rank(Z1) == 1 and problem.primal_objective(Z1) <= one + 1e-9
    assert one - bound >= 0.01 * P_star, f"one head: certified gap {one - bound} < 1% of P* = {P_star}"
    return runs


def residual_gap(problem, Z):
    """The relative gap of Z from its scaled residual alone (no other dual point), ``(P - D) / D``."""
    P, _, _, D, _ = scaled_residual(problem.loss, problem.regularizer, problem.program.forward,
                                    problem.program.adjoint, problem.T, Z)
    return relative_gap(P, D)


def write_planted_folder(folder, N, n, d, seed=0, chunk=8192):
    """A DATA folder of float32 ``X.npy`` (N, n, d), written chunk by chunk through a memory map (it may
    be larger than memory), and ``y.npy``: a planted teacher on a third of the tokens plus noise."""
    import os

    os.makedirs(folder, exist_ok=True)
    X = np.lib.format.open_memmap(os.path.join(folder, "X.npy"), mode="w+", dtype=np.float32, shape=(N, n, d))
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, d)) * (rng.random((n, 1)) < 0.3)
    y = np.empty(N)
    for s in range(0, N, chunk):
        rows = rng.standard_normal((min(chunk, N - s), n, d)).astype(np.float32)
        X[s:s + len(rows)] = rows
        y[s:s + len(rows)] = np.einsum("ikd,kd->i", rows, w) + 0.1 * rng.standard_normal(len(rows))
    X.flush()
    del X
    np.save(os.path.join(folder, "y.npy"), y)
    return folder
