"""Proximal Newton for the logistic and cross-entropy losses (issue 24): the losses' Newton faces and
the weighted Gram matrices against independent computations; certified solves on every program with
these losses, in float64 and float32, on memory-mapped data and on two gloo processes (the same
iterate on both, and the single-process solution); the fallback to first order; the nuclear norm
kept on first order."""
import math

import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.core.errors import InvalidInputError
from cvxtransformer.core.losses import get_loss
from cvxtransformer.solvers.distributed import shard_problem
from cvxtransformer.solvers.proxgrad import driver, prox_newton

from conftest import GROUP_LASSO_CASES, MHSA_CASES, case_id, random_problem, random_targets
from test_distributed import launch

NEWTON_CASES = [c for c in GROUP_LASSO_CASES if c[1] != "squared"]


@pytest.fixture
def steps(monkeypatch):
    """Newton steps taken by every solve of the test (the driver's calls of prox_newton)."""
    taken, real = [], prox_newton.prox_newton

    def spy(*args, **kwargs):
        budget = args[4]
        start = budget.iterations
        out = real(*args, **kwargs)
        taken.append(budget.iterations - start)
        return out

    monkeypatch.setattr(driver, "prox_newton", spy)
    return taken


# --- the Newton faces of the losses and of the operators -------------------------------------

@pytest.mark.parametrize("name, kind", [("squared", "vector"), ("logistic", "binary"), ("cross_entropy", "classes")])
def test_hessian_and_gradient_metric_of_every_loss(name, kind):
    """``hessian`` is the derivative of ``grad L`` (central differences), and ``gradient_metric`` is
    ``sum_i grad L_i^T pinv(W_i) grad L_i`` (numpy's pseudo-inverse)."""
    rng = np.random.default_rng(0)
    loss = get_loss(name)
    T = loss.encode(random_targets(kind, rng, 9, 4), None)
    Y = rng.standard_normal(T.shape)
    W = loss.hessian(Y, T)
    assert W.shape == (9, T.shape[1], T.shape[1])
    eps = 1e-6
    for l in range(T.shape[1]):
        E = np.zeros_like(Y)
        E[:, l] = eps
        fd = (loss.gradient(Y + E, T) - loss.gradient(Y - E, T)) / (2 * eps)
        np.testing.assert_allclose(W[:, :, l], fd, atol=1e-8)
    G = loss.gradient(Y, T)
    explicit = sum(G[i] @ np.linalg.pinv(W[i]) @ G[i] for i in range(9))
    assert loss.gradient_metric(Y, T) == pytest.approx(explicit, rel=1e-9)
    # the gradient at Y in the Hessian taken elsewhere (a Hessian kept from an earlier Newton step)
    Y0 = Y + rng.standard_normal(Y.shape)
    W0 = loss.hessian(Y0, T)
    explicit = sum(G[i] @ np.linalg.pinv(W0[i]) @ G[i] for i in range(9))
    assert loss.gradient_metric(Y, T, Y0) == pytest.approx(explicit, rel=1e-9)


@pytest.mark.parametrize("program", [8, 10, 12])
@pytest.mark.parametrize("chunk", [None, 7])
# 24: 72 features, summed by block rows of the upper triangle; 100: 300 features, the lower triangle by BLAS's syrk
# (weights >= 0 or none, CPU) mirrored 256 rows at a time
@pytest.mark.parametrize("d", [3, 24, 100])
def test_weighted_gram_is_the_gram_of_the_weighted_design(program, chunk, d):
    problem = random_problem(program, "squared", "scalar" if program == 8 else "vector", seed=3, N=33, n=5, d=d)
    p = problem.program
    J, K = torch.arange(0, p.h, 2), torch.tensor([0, 2, 3])  # gated: every other gate
    assert p.h == 1 or 1 < len(J) < p.h
    op = p.operator("cpu", torch.float64, chunk).restrict(J, K)
    cols = (J.numpy()[:, None, None] * p.n * p.d + K.numpy()[None, :, None] * p.d
            + np.arange(p.d)[None, None, :]).ravel()
    D = p.design()[:, cols]
    w = np.random.default_rng(1).standard_normal((p.N, 3))
    w[::3] = 0.0  # samples of zero weight are skipped (a third of every chunk)
    np.testing.assert_allclose(op.sample_norms().numpy(), np.sum(D * D, axis=1), rtol=1e-13)
    for weights in (w, w[:, :1], np.abs(w[:, :1])):  # gated, weights >= 0: blocks Y^T Y, Y = sqrt(w) X
        H = op.weighted_gram(torch.from_numpy(np.ascontiguousarray(weights))).numpy()
        assert H.shape == (weights.shape[1], len(cols), len(cols))
        for m in range(weights.shape[1]):
            np.testing.assert_allclose(H[m], D.T @ (weights[:, m, None] * D), rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize("case", [(8, "logistic", "binary"), (12, "cross_entropy", "classes")], ids=case_id)
def test_newton_hessian_is_the_hessian_of_the_smooth_part(case):
    """``newton_hessian`` in the model's layout (output, gate, token, coordinate) is
    ``sum_i W_i[l, m] D_i D_i^T`` block by block, computed here from the dense design, over every
    sample but the lightest ones: whole binary orders of magnitude of ``tr W_i ||D_i||^2`` that together
    carry at most ``HESSIAN_MASS`` of its trace (here the samples predicted with a margin of 25 to 40: a curvature of e^-25 or less)."""
    problem = random_problem(*case, seed=4, N=30, n=4, d=3, gates=2)
    p, loss = problem.program, problem.loss
    op = p.operator("cpu", torch.float64)
    T = torch.from_numpy(problem.T)
    Y = np.random.default_rng(2).standard_normal(T.shape)
    Y[:4] = np.linspace(25, 40, 4)[:, None] * problem.T[:4]  # T: labels +-1, or one-hot rows
    Y = torch.from_numpy(Y)
    H = prox_newton.newton_hessian(op, loss, Y, T).numpy()
    W, D = loss.hessian(Y, T).numpy(), p.design()
    mass = np.trace(W, axis1=1, axis2=2) * np.sum(D * D, axis=1)
    orders, light, carried = np.frexp(mass)[1], [], 0.0  # whole binary orders of magnitude, lightest first
    orders[mass == 0] = orders.min() - 1  # a curvature that underflowed to 0 is the lightest
    for k in np.unique(orders):
        carried += mass[orders == k].sum()
        if carried > prox_newton.HESSIAN_MASS * mass.sum():
            break
        light += np.flatnonzero(orders == k).tolist()
    assert set(light) >= {0, 1, 2, 3}  # the sure samples, at least
    c, F = T.shape[1], D.shape[1]
    keep = np.setdiff1d(np.arange(len(W)), light)
    expected = np.einsum("ilm,if,ig->lfmg", W[keep], D[keep], D[keep]).reshape(c * F, c * F)
    np.testing.assert_allclose(H, expected, rtol=1e-12, atol=1e-12)
    full = np.einsum("ilm,if,ig->lfmg", W, D, D).reshape(c * F, c * F)
    assert 0.0 < np.trace(full) - np.trace(H) <= prox_newton.HESSIAN_MASS * np.trace(full)


# --- certified solves -------------------------------------------------------------------------

@pytest.mark.parametrize("case", NEWTON_CASES, ids=case_id)
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-9), ("float32", 1e-4)])
def test_newton_solves_are_certified_and_match_clarabel(case, dtype, tol, steps):
    problem = random_problem(*case, seed=5, N=60, n=4, d=3, gates=3, frac=0.05)
    result = ct.solve(problem, "fista", tol=tol, dtype=dtype, method="gram")
    assert result.certified and result.certificate.relative_gap <= tol, result.status
    assert sum(steps) > 0  # the Newton model did the work
    cert = ct.certify(problem, result.Z, result.V, tol=tol, refine=False)
    assert cert.certified and result.history[-1].relative_gap == pytest.approx(cert.relative_gap, abs=1e-12)
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    assert result.certificate.primal_objective == pytest.approx(reference, rel=max(tol, 1e-7))


def test_auto_takes_newton_steps_on_group_lasso_and_first_order_on_the_nuclear_norm(steps):
    problem = random_problem(10, "cross_entropy", "classes", seed=6, N=80, n=4, d=3, frac=0.02)
    assert ct.solve(problem, "fista", tol=1e-8).certified and sum(steps) > 0
    del steps[:]
    for case in [c for c in MHSA_CASES if c[1] != "squared"]:
        problem = random_problem(*case, seed=6, N=40, n=3, d=2)
        assert ct.solve(problem, "fista", tol=1e-7).certified
        with pytest.raises(InvalidInputError, match="method"):
            ct.solve(problem, "fista", method="gram")
    assert steps == []
    onehot = ct.make_problem(np.eye(5)[np.random.default_rng(0).integers(0, 5, (50, 3))],
                             np.random.default_rng(1).integers(0, 3, 50), program=10, loss="cross_entropy", beta=1.0)
    assert ct.solve(onehot.with_beta(0.2 * onehot.beta_max()), "fista", tol=1e-8, method="gram").certified
    assert steps == []  # one-hot tokens: no weighted Gram matrix, first order


def hessian_spy(monkeypatch):
    """The Hessians prox_newton computes (a list that grows by one at each)."""
    computed, real = [], prox_newton.newton_hessian

    def spy(*args):
        computed.append(1)
        return real(*args)

    monkeypatch.setattr(prox_newton, "newton_hessian", spy)
    return computed


@pytest.mark.parametrize("case", [(10, "cross_entropy", "classes"), (12, "logistic", "binary")], ids=case_id)
def test_a_hessian_serves_several_steps_and_the_solve_is_the_same(case, monkeypatch, steps):
    """Lazy Hessians: a Newton step whose active blocks have not changed, and whose predecessor
    divided the gap by 10 or more, reuses the last Hessian (``LAZY_STEPS``) where the cost model says
    that a Hessian costs more than the rest of a step (here: always); the solve is certified and
    reaches the optimum of the solve that computes a Hessian at every step."""
    computed = hessian_spy(monkeypatch)
    monkeypatch.setattr(driver._Run, "_reuse_pays", lambda self, op: lambda active: True)
    problem = random_problem(*case, seed=9, N=300, n=4, d=3, gates=3, frac=0.01)
    lazy = ct.solve(problem, "fista", tol=1e-10, method="gram")
    assert lazy.certified and len(computed) < sum(steps), (len(computed), steps)
    monkeypatch.setattr(prox_newton, "LAZY_STEPS", 0)
    del computed[:], steps[:]
    eager = ct.solve(problem, "fista", tol=1e-10, method="gram")
    assert eager.certified and len(computed) == sum(steps)
    assert lazy.certificate.primal_objective == pytest.approx(eager.certificate.primal_objective, rel=1e-9)


@pytest.mark.parametrize("case", [(10, "cross_entropy", "classes"), (12, "logistic", "binary")], ids=case_id)
def test_a_hessian_cheaper_than_a_step_is_never_reused(case, monkeypatch, steps):
    """On a few active features a Hessian costs less than the two passes of a step (the driver's cost model:
    N (c F_a)^2 / 2 multiply-adds at GEMM speed against 2 N F c streamed), so every step computes its own:
    a stale one saves less than the extra step it may cost. The cost model's verdict is checked by hand."""
    computed = hessian_spy(monkeypatch)
    verdicts = []
    real = driver._Run._reuse_pays

    def spy(self, op):
        pays = real(self, op)
        c = self.problem.program.n_outputs

        def verdict(active):
            hessian = c * (c + 1) / 2 * active.weighted_gram_cost() / (1.5 * driver.GEMM_SPEEDUP["cpu"])
            verdicts.append((pays(active), hessian > 2.0 * op.N_total * np.prod(op.shape)))
            return verdicts[-1][0]
        return verdict

    monkeypatch.setattr(driver._Run, "_reuse_pays", spy)
    problem = random_problem(*case, seed=9, N=300, n=4, d=3, gates=3, frac=0.01)
    result = ct.solve(problem, "fista", tol=1e-10, method="gram")
    assert result.certified and sum(steps) > len(verdicts) > 0
    assert all(v == (False, False) for v in verdicts), verdicts
    assert len(computed) == sum(steps)


@pytest.mark.parametrize("failure", ["no model", "no step"])
def test_a_newton_model_that_fails_leaves_the_subproblem_to_first_order(failure, monkeypatch, steps):
    """No model (the metric overflows: an iterate far from any optimum) or no descent step from it:
    prox_newton gives up the subproblem ("stalled") and first order solves it, certified."""
    problem = random_problem(12, "logistic", "binary", seed=7, N=50, n=4, d=3)
    if failure == "no model":
        monkeypatch.setattr(type(problem.loss), "gradient_metric", lambda *args, **kwargs: torch.tensor(math.inf))
    else:
        monkeypatch.setattr(prox_newton, "_line_search", lambda *args: None)
    result = ct.solve(problem, "fista", tol=1e-8, method="gram")
    assert result.certified and steps and sum(steps) == 0 and result.iterations > 0


@pytest.fixture
def model_dtypes(monkeypatch):
    """The dtype of every Newton model built (``newton_model``'s Hessian), in order."""
    built, real = [], prox_newton.newton_model

    def spy(H, *args):
        built.append(H.dtype)
        return real(H, *args)

    monkeypatch.setattr(prox_newton, "newton_model", spy)
    return built


@pytest.mark.parametrize("case", NEWTON_CASES, ids=case_id)
def test_loose_models_in_the_hessians_precision_reach_the_same_optimum(case, monkeypatch, model_dtypes):
    """Models solved to a loose gap (LOW_MODEL_GAP or looser) and large enough (LOW_MODEL_FEATURES,
    lowered here to every model) are built in float32, the Hessian's precision; the tight ones of
    the last steps in float64. The solve is certified to 1e-10 and reaches the optimum of a solve
    whose models are all float64, and Clarabel's."""
    problem = random_problem(*case, seed=5, N=80, n=4, d=3, gates=3, frac=0.01)
    monkeypatch.setattr(prox_newton, "LOW_MODEL_FEATURES", 1)
    low = ct.solve(problem, "fista", tol=1e-10, method="gram")
    assert low.certified and low.certificate.relative_gap <= 1e-10
    assert torch.float32 in model_dtypes and model_dtypes[-1] == torch.float64, model_dtypes
    del model_dtypes[:]
    monkeypatch.setattr(prox_newton, "LOW_MODEL_GAP", math.inf)
    exact = ct.solve(problem, "fista", tol=1e-10, method="gram")
    assert exact.certified and set(model_dtypes) == {torch.float64}
    assert low.certificate.primal_objective == pytest.approx(exact.certificate.primal_objective, rel=1e-9)
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    assert low.certificate.primal_objective == pytest.approx(reference, rel=1e-7)


def test_a_low_precision_model_that_gives_no_step_is_built_again_in_the_working_precision(monkeypatch, model_dtypes,
                                                                                          steps):
    """Where the float32 model's point is no descent step (here: every one of them, forced), the
    same step is taken from the model in float64: Newton steps go on, and the solve is certified."""
    problem = random_problem(12, "logistic", "binary", seed=5, N=80, n=4, d=3, gates=3, frac=0.01)
    monkeypatch.setattr(prox_newton, "LOW_MODEL_FEATURES", 1)
    real = prox_newton._line_search
    monkeypatch.setattr(prox_newton, "_line_search",
                        lambda *args: None if model_dtypes[-1] == torch.float32 else real(*args))
    result = ct.solve(problem, "fista", tol=1e-10, method="gram")
    assert result.certified and result.certificate.relative_gap <= 1e-10
    retried = [i for i in range(1, len(model_dtypes)) if model_dtypes[i - 1] == torch.float32]
    assert retried and all(model_dtypes[i] == torch.float64 for i in retried), model_dtypes
    assert sum(steps) > 0


@pytest.mark.slow
@pytest.mark.parametrize("case", NEWTON_CASES, ids=case_id)
def test_float32_at_its_floor_stops_in_a_few_newton_steps(case):
    """float32 asked for a gap it cannot certify (1e-9): once the Newton steps stop lowering the gap
    below float32's floor (or none decreases P), the subproblem ends ("floor") without first order
    behind it, and the driver declares the stall in a few steps (it took 800 to 2,350 iterations of
    first order before); the point reached is the optimum, as the verifier's refined dual shows."""
    problem = random_problem(*case, seed=5, N=300, n=4, d=3, gates=3, frac=0.001)
    result = ct.solve(problem, "fista", tol=1e-9, dtype="float32", method="gram", refine=False)
    assert not result.certified and result.status.startswith("stalled") and "float32" in result.status
    assert result.iterations <= 30, result.iterations
    assert ct.certify(problem, result.Z, result.V, tol=1e-9).certified  # refined: the point is optimal
    exact = ct.solve(problem, "fista", tol=1e-10)
    assert result.certificate.primal_objective == pytest.approx(exact.certificate.primal_objective, rel=1e-6)


def test_newton_on_a_memory_map_streams_and_matches_memory(tmp_path, steps):
    rng = np.random.default_rng(8)
    X = rng.standard_normal((70, 4, 3)).astype(np.float32)
    y = rng.integers(0, 3, 70)
    np.save(tmp_path / "X.npy", X)
    problems = [ct.make_problem(A, y, program=12, loss="cross_entropy", beta=1.0, gates=3)
                for A in (X.astype(float), np.load(tmp_path / "X.npy", mmap_mode="r"))]
    assert problems[1].program.operator("cpu", torch.float64, 16).streams
    beta = 0.1 * problems[0].beta_max()
    one, mapped = (ct.solve(p.with_beta(beta), "fista", tol=1e-8, method="gram", chunk_size=16) for p in problems)
    assert mapped.certified and sum(steps) > 0
    np.testing.assert_allclose(mapped.Z, one.Z, rtol=1e-7, atol=1e-9)


# --- two processes: the same model, the same steps ----------------------------------------------

def _newton_on_shards(rank):
    out = {}
    for case in NEWTON_CASES:
        for dtype in ("float64", "float32"):
            problem = shard_problem(random_problem(*case, seed=9, N=41, frac=0.05), [21, 20])
            r = ct.solve(problem, "fista", tol=1e-10 if dtype == "float64" else 1e-4, dtype=dtype, method="gram")
            out[f"{case_id(case)}-{dtype}"] = [np.asarray(r.Z).tolist(), r.certificate.primal_objective,
                                               r.certificate.relative_gap, r.certified, r.iterations]
    # loose models in float32 (every model, however small): the same on both processes
    features, prox_newton.LOW_MODEL_FEATURES = prox_newton.LOW_MODEL_FEATURES, 1
    problem = shard_problem(random_problem(12, "logistic", "binary", seed=9, N=41, frac=0.05), [21, 20])
    r = ct.solve(problem, "fista", tol=1e-10, method="gram")
    out["low"] = [np.asarray(r.Z).tolist(), r.certificate.primal_objective, r.certified]
    prox_newton.LOW_MODEL_FEATURES = features
    # method "auto": the ski rental's cost (pairs of gates on, summed over the shards) decides alike
    problem = shard_problem(random_problem(12, "logistic", "binary", seed=9, N=41, frac=0.05), [21, 20])
    r = ct.solve(problem, "fista", tol=1e-10)
    out["auto"] = [np.asarray(r.Z).tolist(), r.certificate.primal_objective, r.certified,
                   problem.program.operator("cpu", torch.float64).weighted_gram_cost()]
    return out


@pytest.mark.slow
def test_newton_on_two_processes_takes_the_same_steps_as_one(tmp_path):
    results, codes, _ = launch(tmp_path, 2, _newton_on_shards)
    assert codes == [0, 0] and "error" not in results[0], results.get(0, {}).get("trace")
    assert results[0] == results[1]  # bit for bit: every decision from sums over the shards
    Z, P, certified = results[0].pop("low")
    whole = random_problem(12, "logistic", "binary", seed=9, N=41, frac=0.05)
    assert certified and P == pytest.approx(ct.solve(whole, "fista", tol=1e-10).certificate.primal_objective,
                                            rel=1e-8)
    Z, P, certified, cost = results[0].pop("auto")
    whole = random_problem(12, "logistic", "binary", seed=9, N=41, frac=0.05)
    M = whole.program.mask
    assert cost == np.sum(np.triu(M.T @ M)) * (whole.program.n * whole.program.d) ** 2  # both shards counted
    assert certified and P == pytest.approx(ct.solve(whole, "fista", tol=1e-10).certificate.primal_objective,
                                            rel=1e-8)
    for key, (Z, P, gap, certified, iterations) in results[0].items():
        case = next(c for c in NEWTON_CASES if key.startswith(case_id(c) + "-"))
        dtype = key.rsplit("-", 1)[1]
        one = ct.solve(random_problem(*case, seed=9, N=41, frac=0.05), "fista", dtype=dtype, method="gram",
                       tol=1e-10 if dtype == "float64" else 1e-4)
        assert certified and iterations > 0, key
        rel = 1e-8 if dtype == "float64" else 1e-4
        assert P == pytest.approx(one.certificate.primal_objective, rel=rel), key
        if dtype == "float64":
            assert np.linalg.norm(np.asarray(Z) - one.Z) <= 1e-7 * max(np.linalg.norm(one.Z), 1e-12), key


def test_weighted_gram_cost_counts_the_samples_of_each_pair_of_gates():
    """Gated: ``sum_{j <= j'} |{i: M_ij M_ij' = 1}| (|K| d)^2`` multiply-adds per weight column (the
    pairs are gathered); ungated: the upper triangle ``N F^2 / 2``."""
    problem = random_problem(12, "squared", "vector", seed=3, N=33, n=5, d=3, gates=3)
    p = problem.program
    J, K = [0, 2], [1, 3]
    M = p.mask[:, J]
    pairs = sum(int(np.sum(M[:, a] * M[:, b])) for a in range(2) for b in range(a, 2))
    assert 0 < pairs < 3 * p.N
    assert p.operator("cpu", torch.float64).restrict(torch.tensor(J), torch.tensor(K)).weighted_gram_cost() \
        == pairs * (len(K) * p.d) ** 2
    p8 = random_problem(8, "squared", "scalar", seed=3, N=33, n=5, d=3).program
    assert p8.operator("cpu", torch.float64).weighted_gram_cost() == p8.N * (p8.n * p8.d) ** 2 / 2


# --- Newton on the support: the start of a dense model ------------------------------------------

def test_newton_on_support_stops_once_its_decrement_is_below_stop():
    """With ``stop = 0`` the iterate is the stationary point of phi (H z - b + beta z_g / ||z_g|| = 0,
    checked from its definition); with a stop, the point it returns is within ``stop`` of that
    minimum (a Newton step of decrement ``lambda^2 <= stop`` leaves O(lambda^4))."""
    from cvxtransformer.solvers.proxgrad.newton import newton_on_support
    rng = np.random.default_rng(3)
    m, d, beta = 12, 4, 0.05
    A = rng.standard_normal((200, m * d))
    H, b = torch.tensor(A.T @ A), torch.tensor(A.T @ rng.standard_normal(200))
    z0 = torch.tensor(rng.standard_normal((m, d)))

    def phi(z):
        v = z.reshape(-1)
        return float(0.5 * v @ H @ v - b @ v + beta * torch.linalg.vector_norm(z, dim=-1).sum())

    exact = newton_on_support(H, b, z0, beta)
    unit = exact / torch.linalg.vector_norm(exact, dim=-1, keepdim=True)
    stationarity = H @ exact.reshape(-1) - b + beta * unit.reshape(-1)
    assert float(torch.linalg.vector_norm(stationarity)) <= 1e-9 * float(torch.linalg.vector_norm(b))
    for stop in (1e-2, 1e-6):
        early = newton_on_support(H, b, z0, beta, stop=stop)
        assert phi(exact) <= phi(early) <= phi(exact) + stop
    assert torch.equal(newton_on_support(H, b, z0, beta, deadline=0.0), z0)  # past its deadline: no iteration


def test_newton_on_support_ends_where_its_decrement_is_at_phis_rounding(monkeypatch):
    """A support of more features (51 to 57) than samples (50), on a path of program (12): near the
    optimum the Newton decrement (1e-14 of phi) is below what phi's rounding shows, so no step
    decreases phi. That is convergence, not a failed support: each support's Newton solve returns its
    point (it returned None here, and the point at the third beta took 360 first-order iterations to a
    gap of 9.9e-7 instead of a polish at iteration 120 to 7e-8)."""
    from cvxtransformer.solvers.proxgrad import newton
    outcomes, real = [], newton._on_support

    def spy(ops, H, *args):
        out = real(ops, H, *args)
        outcomes.append((H.shape[0], out is not None))
        return out

    monkeypatch.setattr(newton, "_on_support", spy)
    problem = random_problem(12, "squared", "vector", seed=5, N=50, n=5, d=3, gates=4, frac=0.2)
    path = ct.solve_path(problem, n_betas=4)
    assert any(features > problem.program.N for features, _ in outcomes)
    # (a smaller support, polished when first seen, may fail: one that still held groups of the wrong side)
    assert all(ok for features, ok in outcomes if features > problem.program.N), outcomes
    assert path[2].result.iterations <= 150 and path[2].relative_gap <= 1e-7


def test_newton_on_support_with_float32_factors_reaches_the_float64_point():
    """A float32 factorisation refined once in float64: the same stationary point (to rounding, not
    to float32's precision), and the same early stops; where the Hessian is singular in float32
    (eigenvalues 2 and 1e-12), the float64 factorisation takes over and the iterates are its own."""
    from cvxtransformer.solvers.proxgrad.newton import newton_on_support
    rng = np.random.default_rng(5)
    m, d, beta = 10, 3, 0.1
    A = rng.standard_normal((150, m * d))
    H, b = torch.tensor(A.T @ A), torch.tensor(A.T @ rng.standard_normal(150))
    z0 = torch.tensor(rng.standard_normal((m, d)))
    exact = newton_on_support(H, b, z0, beta)
    low = newton_on_support(H, b, z0, beta, factor=torch.float32)
    torch.testing.assert_close(low, exact, rtol=1e-11, atol=1e-12)
    unit = low / torch.linalg.vector_norm(low, dim=-1, keepdim=True)
    assert float(torch.linalg.vector_norm(H @ low.reshape(-1) - b + beta * unit.reshape(-1))) \
        <= 1e-9 * float(torch.linalg.vector_norm(b))
    one = newton_on_support(H, b, z0, beta, iterations=1, factor=torch.float32)  # the refined step is the step
    torch.testing.assert_close(one, newton_on_support(H, b, z0, beta, iterations=1), rtol=1e-9, atol=1e-12)

    S = torch.tensor([[1.0, 1.0 - 1e-12], [1.0 - 1e-12, 1.0]], dtype=torch.float64)
    assert int(torch.linalg.cholesky_ex(S.to(torch.float32))[1]) != 0 and int(torch.linalg.cholesky_ex(S)[1]) == 0
    star = torch.tensor([[2.0], [1.0]], dtype=torch.float64)
    bS = S @ star.reshape(-1) + 1e-3  # z* = star is stationary: S z - b + beta sign(z) = 0
    start = star + 1e-3
    assert torch.equal(newton_on_support(S, bS, start, 1e-3, factor=torch.float32),
                       newton_on_support(S, bS, start, 1e-3))


@pytest.mark.parametrize("case", [(10, "cross_entropy", "classes"), (12, "logistic", "binary")], ids=case_id)
def test_a_model_whose_support_is_x_s_is_started_by_newton_with_zero_blocks(case, monkeypatch, steps):
    """At a moderate beta some blocks stay zero: a model that let no violator in (its blocks are x's
    nonzero ones, but the product of their gates and tokens, or their outputs, holds zero groups too)
    starts with Newton on x's support, zero groups kept at zero, and its gap decides whether that
    support was the model's; such models are solved that way, and the solve reaches Clarabel's optimum."""
    started, real = [], prox_newton._newton_start

    def spy(model, xm, *args):
        out = real(model, xm, *args)
        started.append((bool((torch.linalg.vector_norm(xm, dim=-1) == 0).any()), out[1]))
        return out

    monkeypatch.setattr(prox_newton, "_newton_start", spy)
    problem = random_problem(*case, seed=4, N=300, n=10, d=3, gates=2, frac=0.3)
    result = ct.solve(problem, "fista", tol=1e-9, method="gram")
    assert result.certified and 0 < result.certificate.support_size < problem.program.n_blocks
    assert (True, True) in started, started  # a model with zero blocks solved by the start alone
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    assert result.certificate.primal_objective == pytest.approx(reference, rel=1e-7)


@pytest.mark.parametrize("case", [(8, "logistic", "binary"), (10, "cross_entropy", "classes"),
                                  (12, "logistic", "binary")], ids=case_id)
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-9), ("float32", 1e-4)])
def test_a_dense_model_is_started_by_newton_on_its_support(case, dtype, tol, monkeypatch, steps):
    """At a small beta every block is active: the model (no violator let in) starts with Newton on
    x's support, which solves it; the solve is certified and reaches the optimum of the solve without
    that start (``START_FEATURES = 0``) and Clarabel's."""
    started, real = [], prox_newton._newton_start

    def spy(*args):
        out = real(*args)
        started.append(out[1])
        return out

    monkeypatch.setattr(prox_newton, "_newton_start", spy)
    problem = random_problem(*case, seed=11, N=300, n=3, d=3, gates=2, frac=1e-3)
    result = ct.solve(problem, "fista", tol=tol, dtype=dtype, method="gram")
    cert = ct.certify(problem, result.Z, result.V, tol=tol, refine=False)
    assert result.certified and cert.certified and cert.relative_gap <= tol
    assert any(started), started  # at least one model solved by Newton on the support alone
    monkeypatch.setattr(prox_newton, "START_FEATURES", 0)
    without = ct.solve(problem, "fista", tol=tol, dtype=dtype, method="gram")
    assert without.certified
    reference = ct.solve(problem, "clarabel", tol=1e-9).certificate.primal_objective
    for r in (result, without):
        assert r.certificate.primal_objective == pytest.approx(reference, rel=max(tol, 1e-7))
    assert {h.method for h in result.history if h.method} == {"newton"}  # no fallback to first order


@pytest.mark.parametrize("dtype, tol, inner", [("float64", 1e-6, 1e-6), ("float32", 1e-4, 5e-5)])
def test_a_settled_working_set_is_solved_to_tol_itself_in_float64(dtype, tol, inner, monkeypatch):
    """Newton takes every violator, so its first working set is settled: in float64 its gap is the
    certificate's (no margin needed: a round that lands between tol / 2 and tol is not repeated); in
    float32 the certificate's float64 gap may differ, and the subproblem is solved to tol / 2."""
    tols, real = [], driver.prox_newton

    def spy(*args, **kwargs):
        tols.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "prox_newton", spy)
    problem = random_problem(12, "logistic", "binary", seed=2, N=300, n=4, d=3, frac=0.01)
    result = ct.solve(problem, "fista", tol=tol, dtype=dtype, method="gram")
    assert result.certified and tols == [inner]
    assert ct.certify(problem, result.Z, result.V, tol=tol, refine=False).relative_gap <= tol


def test_newton_on_support_drops_the_groups_that_leave_and_reaches_the_optimum():
    """A support found early by first order holds every group, of which 5 of 8 are 0 at the optimum (a point near
    the optimum, as a first-order iterate at a gap of a few percent is): plain Newton cannot polish it (a group is
    carried through 0, where phi is not smooth), while with ``drop`` the groups that a full step carries through
    0 leave, and Newton goes on with the others, to the optimum: its KKT conditions hold (stationarity on the
    support, ``||(H z - b)_g|| <= beta`` off it), and its objective is CVXPY's (Clarabel), computed independently."""
    import cvxpy as cp
    from cvxtransformer.solvers.proxgrad.newton import newton_on_support
    rng = np.random.default_rng(13)
    m, d, N = 8, 4, 200
    A = rng.standard_normal((N, m * d)) + 0.8 * rng.standard_normal((N, 1))  # correlated columns
    w = np.zeros((m, d))
    w[:3] = rng.standard_normal((3, d))
    y = A @ w.reshape(-1) + 0.5 * rng.standard_normal(N)
    beta = 0.1 * np.max(np.linalg.norm((A.T @ y).reshape(m, d), axis=1))
    z = cp.Variable((m, d))
    objective = 0.5 * cp.sum_squares(A @ cp.vec(z, order="C") - y) + beta * cp.sum(cp.norm(z, 2, axis=1))
    best = cp.Problem(cp.Minimize(objective)).solve(solver="CLARABEL")
    star = z.value
    zero = np.linalg.norm(star, axis=1) < 1e-6
    assert zero.sum() == 5
    H, b = torch.tensor(A.T @ A), torch.tensor(A.T @ y)
    z0 = torch.tensor(star + 0.05 * rng.standard_normal((m, d)))
    plain = newton_on_support(H, b, z0, beta)
    assert plain is None or np.abs(plain.numpy() - star).max() > 1e-3
    found = newton_on_support(H, b, z0, beta, drop=True).numpy()
    norms = np.linalg.norm(found, axis=1)
    np.testing.assert_array_equal(norms == 0.0, zero)
    grad = (A.T @ (A @ found.reshape(-1) - y)).reshape(m, d)
    np.testing.assert_allclose(grad[~zero] + beta * found[~zero] / norms[~zero, None], 0.0, atol=1e-6 * beta)  # phi's rounding
    assert np.all(np.linalg.norm(grad[zero], axis=1) <= beta)
    value = 0.5 * np.sum((A @ found.reshape(-1) - y) ** 2) + beta * norms.sum()
    assert value <= best + 1e-7 * abs(best)


def test_after_a_drop_newton_goes_on_from_the_full_step_of_the_groups_that_stay(monkeypatch):
    """The drop test's support (8 groups, 5 of them 0 at the optimum): the second Newton solve starts where the
    first one's full step takes the groups that stay, ``z + step`` with ``step = -hess^-1 grad`` computed here from
    their definitions (hess = H + blockdiag(beta (I - u u^T) / ||z_g||), grad = H z - b + beta u)."""
    from cvxtransformer.solvers.proxgrad import newton
    rng = np.random.default_rng(13)
    m, d, N = 8, 4, 200
    A = rng.standard_normal((N, m * d)) + 0.8 * rng.standard_normal((N, 1))
    y = A[:, :3 * d] @ rng.standard_normal(3 * d) + 0.5 * rng.standard_normal(N)
    beta = 0.1 * np.max(np.linalg.norm((A.T @ y).reshape(m, d), axis=1))
    H, b = A.T @ A, A.T @ y
    starts, real = [], newton._newton

    def spy(ops, H_, b_, z, *args):
        starts.append(np.array(z))
        return real(ops, H_, b_, z, *args)

    monkeypatch.setattr(newton, "_newton", spy)
    z0 = 0.05 * rng.standard_normal((m, d))
    newton.newton_on_support(torch.tensor(H), torch.tensor(b), torch.tensor(z0), beta, drop=True)
    assert len(starts) >= 2 and len(starts[1]) < m
    norms = np.linalg.norm(z0, axis=1, keepdims=True)
    u = z0 / norms
    hess = H.copy()
    for g in range(m):
        hess[g * d:(g + 1) * d, g * d:(g + 1) * d] += beta * (np.eye(d) - np.outer(u[g], u[g])) / norms[g]
    step = -np.linalg.solve(hess, H @ z0.reshape(-1) - b + beta * u.reshape(-1)).reshape(m, d)
    stay = np.sum((z0 + step) * z0, axis=1) >= 0
    np.testing.assert_allclose(starts[1], (z0 + step)[stay], rtol=1e-9, atol=1e-12)


def test_a_full_newton_step_of_a_settled_decrement_ends_the_solve(monkeypatch):
    """A full step whose decrement is at most ``SETTLED`` of phi ends the solve: without that rule the solve takes
    exactly one factorisation more (the step that finds the decrement at phi's rounding), and reaches the same
    point to rounding; the point is stationary (checked from the definition)."""
    from cvxtransformer.solvers.proxgrad import newton
    rng = np.random.default_rng(3)
    m, d, beta = 12, 4, 0.05
    A = rng.standard_normal((200, m * d))
    H, b = torch.tensor(A.T @ A), torch.tensor(A.T @ rng.standard_normal(200))
    z0 = torch.tensor(rng.standard_normal((m, d)))
    count, real = [0], newton._Host.factor

    def counted(*args):
        count[0] += 1
        return real(*args)

    monkeypatch.setattr(newton._Host, "factor", staticmethod(counted))
    settled = newton.newton_on_support(H, b, z0, beta)
    with_rule = count[0]
    monkeypatch.setattr(newton, "SETTLED", 0.0)
    count[0] = 0
    rounded = newton.newton_on_support(H, b, z0, beta)
    assert count[0] == with_rule + 1
    torch.testing.assert_close(settled, rounded, rtol=1e-12, atol=1e-14)
    unit = settled / torch.linalg.vector_norm(settled, dim=-1, keepdim=True)
    stationarity = H @ settled.reshape(-1) - b + beta * unit.reshape(-1)
    assert float(torch.linalg.vector_norm(stationarity)) <= 1e-9 * float(torch.linalg.vector_norm(b))


def test_newton_on_the_host_and_on_a_device_take_the_same_steps(monkeypatch):
    """The Newton iteration runs in numpy with LAPACK on the CPU (``_Host``) and in torch on a GPU (``_Device``):
    one algorithm, two sets of array calls. On the same systems (float64 factors, float32 factors refined once,
    and the drops of a support that still holds groups 0 at the optimum) both reach the same point, and a polish
    of a FISTA iterate (its support extraction and assembly) gives the same coefficients either way: the device's
    calls are run here on CPU tensors."""
    from cvxtransformer.solvers.proxgrad import newton
    from cvxtransformer.solvers.proxgrad.smooth import GramSmooth
    rng = np.random.default_rng(21)
    m, d, N = 8, 4, 200
    A = rng.standard_normal((N, m * d)) + 0.8 * rng.standard_normal((N, 1))
    w = np.zeros((m, d))
    w[:3] = rng.standard_normal((3, d))
    y = A @ w.reshape(-1) + 0.5 * rng.standard_normal(N)
    beta = 0.1 * np.max(np.linalg.norm((A.T @ y).reshape(m, d), axis=1))
    H, b = A.T @ A, A.T @ y
    z0 = rng.standard_normal((m, d))
    for factor, drop, scale in ((None, False, 0.01), (torch.float32, False, 0.01), (None, True, 1.0),
                                (torch.float32, True, 1.0)):  # every group nonzero at 0.001 beta_max; 3 at 0.1
        host = newton._on_support(newton._Host, H, b, z0, scale * beta, 20, 0.0, None, factor, drop)
        device = newton._on_support(newton._Device, torch.tensor(H), torch.tensor(b), torch.tensor(z0), scale * beta,
                                    20, 0.0, None, factor, drop)
        assert isinstance(host, np.ndarray) and isinstance(device, torch.Tensor)
        np.testing.assert_allclose(host, device.numpy(), rtol=1e-9, atol=1e-12)
    assert isinstance(newton.newton_on_support(torch.tensor(H), torch.tensor(b), torch.tensor(z0), 0.01 * beta),
                      torch.Tensor)

    sm = GramSmooth(torch.tensor(H), torch.tensor(b)[None], float(y @ y), 1, m, d)
    x = torch.tensor(z0).reshape(1, 1, m, d)
    x[0, 0, 5:] = 0.0  # a support of 5 groups
    on_host = newton.polish(sm, x, beta, drop=True)
    monkeypatch.setattr(newton, "_host", lambda t: False)
    on_device = newton.polish(sm, x, beta, drop=True)
    torch.testing.assert_close(on_host, on_device, rtol=1e-9, atol=1e-12)
    found = on_host.reshape(m, d).numpy()
    norms = np.linalg.norm(found, axis=1)
    assert np.all(norms[5:] == 0.0) and np.any(norms[:5] > 0)
    grad = H @ found.reshape(-1) - b  # stationary on the support it kept: H z - b + beta z_g / ||z_g|| = 0
    kept = norms > 0
    np.testing.assert_allclose((grad.reshape(m, d) + beta * found / np.where(kept, norms, 1.0)[:, None])[kept], 0.0,
                               atol=1e-8 * np.abs(b).max())
