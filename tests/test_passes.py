"""Passes over the data: a certificate from Z reads the data twice at most (the forward pass for P(Z) and
the residual, which reads the tokens where Z is nonzero only on large data, and one adjoint for the dual point's
feasibility), and ``ct.solve`` adds no other pass to its backend's.

An operator that counts its calls (forward, adjoint, forward_adjoint) and the entries of X it reads (in
units of whole passes over X: rows gathered by ``rows``, and rows of tokens read in place by ``_runs_of``)
watches every product of programs (8), (10) and (12).
"""
import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.core import attention
from cvxtransformer.core.attention import AttentionOperator
from cvxtransformer.solvers.proxgrad import ProxGrad


@pytest.fixture(autouse=True)
def restricted_forward(monkeypatch):
    """These problems are small: below ``RESTRICT_WORK`` multiply-adds a forward pass reads every token (a
    restricted operator costs more than it saves). Set to 0 here, forward reads only the tokens where Z is
    nonzero, as on large data, and the counts below say so; test_a_small_certificate_reads_the_data_twice
    keeps the default."""
    monkeypatch.setattr(attention, "RESTRICT_WORK", 0)


class Counts:
    """Calls of the operator's products and the rows of X read, summed over every operator of a program."""

    def __init__(self, monkeypatch, X):
        self.calls = {"forward": 0, "adjoint": 0, "forward_adjoint": 0}
        self.read = 0.0  # entries of X read, over X.size: passes over the data
        self.size = X.size
        for name in self.calls:
            monkeypatch.setattr(AttentionOperator, name, self._counted(name, getattr(AttentionOperator, name)))
        for name in ("rows", "_runs_of"):
            monkeypatch.setattr(AttentionOperator, name, self._reading(getattr(AttentionOperator, name)))

    def _reading(self, method):
        def read(op, s, e):
            self.read += (e - s) * op.nK * op.d / self.size
            return method(op, s, e)
        return read

    def _counted(self, name, method):
        def counted(op, *args, **kwargs):
            self.calls[name] += 1
            return method(op, *args, **kwargs)
        return counted

    def snapshot(self):
        return dict(self.calls, passes=self.read)


def squared_problem(program=8, N=400, n=6, d=4, frac=0.2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n, d))
    y = X[:, 1] @ rng.standard_normal(d) + X[:, 4] @ rng.standard_normal(d) + 0.3 * rng.standard_normal(N)
    if program != 8:
        y = np.c_[y, X[:, 2, 0] - y]
    P = ct.make_problem(X, y, program=program, beta=1.0, gates=3)
    return P.with_beta(frac * P.beta_max())


def network_objective(problem, heads, lemma1=False):
    """Objective (9)/(11) at the heads, summed head by head (docs/conventions.md), independently of the library."""
    X, T, beta, program = problem.program.X, problem.T, problem.beta, problem.program
    Y = np.zeros_like(T)
    for j in range(heads.W1.shape[0]):
        score = np.einsum("k,ikd,d->i", heads.W1[j], X, heads.W2[j])
        if heads.gate is not None:
            score = score * (np.einsum("k,ikd,d->i", program.U1[heads.gate[j]], X, program.U2[heads.gate[j]]) >= 0)
        Y += score[:, None] * heads.W3[j][None, :]
    if lemma1:
        penalty = beta * np.sum(np.linalg.norm(heads.W2, axis=1) * np.abs(heads.W3).sum(axis=1))
    else:
        penalty = 0.5 * beta * (np.sum(heads.W2 ** 2) + np.sum(np.abs(heads.W3).sum(axis=1) ** 2))
    return 0.5 * np.sum((Y - T) ** 2) + penalty


@pytest.mark.parametrize("program", [8, 10, 12])
def test_a_certificate_from_Z_reads_the_data_twice(monkeypatch, program):
    Z = ct.solve(squared_problem(program), "clarabel", tol=1e-9).Z
    problem = squared_problem(program)  # the same data, a problem that has certified nothing yet
    problem.beta_max()  # cached: the certificate reports it
    counts = Counts(monkeypatch, problem.program.X)
    cert = ct.certify(problem, Z, refine=False)
    tokens = np.linalg.norm(Z.reshape(problem.program.canonical_shape), axis=-1).any(axis=(0, 1)).mean()
    assert 0 < tokens < 1  # the forward pass reads the tokens where Z is nonzero, the adjoint every token
    assert counts.snapshot()["passes"] == pytest.approx(1 + tokens, abs=1e-12)
    assert (counts.calls["adjoint"], counts.calls["forward_adjoint"]) == (1, 0) and counts.calls["forward"] >= 1
    # the same numbers as the verifier's faces, computed here in plain numpy from the design
    D = problem.program.design()
    W = problem.program.to_cvxpy(Z)
    R = problem.T - D @ W
    assert cert.primal_objective == pytest.approx(0.5 * np.sum(R ** 2) + problem.beta * np.sum(
        np.linalg.norm(Z.reshape(problem.program.canonical_shape), axis=-1)), rel=1e-12)
    scale = min(1.0, problem.beta / np.max(np.linalg.norm((D.T @ R).T.reshape(-1, problem.program.d), axis=1)))
    assert cert.dual_objective == pytest.approx(scale * np.sum(R * problem.T) - 0.5 * scale ** 2 * np.sum(R ** 2),
                                                rel=1e-12)
    # the recovered heads' objectives are computed when read: no product of the operator, and equal to the
    # network's objective at the recovered heads, summed head by head
    heads = problem.reduction.invert(problem, Z, "balanced")
    assert cert.recovered_objective == pytest.approx(network_objective(problem, heads), rel=1e-11)
    lemma1 = problem.reduction.invert(problem, Z, "lemma1")
    assert cert.to_dict()["recovered_objective_lemma1"] == pytest.approx(
        network_objective(problem, lemma1, lemma1=True), rel=1e-11)
    assert counts.snapshot()["passes"] == pytest.approx(1 + tokens, abs=1e-12) and counts.calls["adjoint"] == 1


def test_a_small_certificate_reads_the_data_twice(monkeypatch):
    """Below RESTRICT_WORK the forward pass reads every token: two whole passes, one forward and one adjoint."""
    monkeypatch.undo()
    Z = ct.solve(squared_problem(8), "clarabel", tol=1e-9).Z
    problem = squared_problem(8)
    problem.beta_max()
    assert problem.program.N * problem.program.n * problem.program.d < attention.RESTRICT_WORK
    counts = Counts(monkeypatch, problem.program.X)
    ct.certify(problem, Z, refine=False)
    assert counts.snapshot() == {"forward": 1, "adjoint": 1, "forward_adjoint": 0, "passes": 2.0}


def test_a_given_dual_point_costs_an_adjoint_only_where_it_may_beat_the_residual(monkeypatch):
    Z = ct.solve(squared_problem(8), "clarabel", tol=1e-9).Z
    problem = squared_problem(8)
    problem.beta_max()
    own = ct.certify(problem, Z, refine=False)
    problem = squared_problem(8)
    problem.beta_max()
    counts = Counts(monkeypatch, problem.program.X)
    # the residual's own scaled point, halved: no scaling of it beats the residual (exact bound, squared loss)
    cert = ct.certify(problem, Z, V=0.5 * own.V, refine=False)
    assert counts.snapshot()["passes"] <= 2.0 and counts.calls["adjoint"] == 1
    assert (cert.dual_objective, cert.dual_source) == (own.dual_objective, "residual")
    # the dual optimum at a worse Z: it beats that Z's residual, so its adjoint is computed (a third pass)
    tokens = np.linalg.norm(Z, axis=-1).astype(bool).mean()
    worse = Z * 0.7
    V_opt = own.V
    before = counts.snapshot()["passes"]
    cert = ct.certify(problem, worse, V=V_opt, refine=False)
    assert counts.snapshot()["passes"] - before == pytest.approx(2.0 + tokens)  # its adjoint: one more pass
    assert cert.dual_source == "given" and cert.dual_objective == pytest.approx(own.dual_objective, rel=1e-12)


def solve_counting(monkeypatch, problem):
    """``ct.solve(problem, "fista")`` with the reads of X counted: the result, the counts, and the counts when the
    backend returned."""
    counts, at_return, solve = Counts(monkeypatch, problem.program.X), {}, ProxGrad.solve

    def solve_and_count(self, *args, **kwargs):
        out = solve(self, *args, **kwargs)
        at_return.update(counts.snapshot())
        return out

    monkeypatch.setattr(ProxGrad, "solve", solve_and_count)
    return ct.solve(problem, "fista"), counts, at_return


@pytest.mark.parametrize("program", [8, 12])
def test_solve_reads_no_data_after_its_backend(monkeypatch, program):
    """The torch backend's last certified check on the CPU in float64 is the verifier's own ``residual_of``
    of the point it returns: ct.solve's certificate of that Z reads no more data, and it equals the
    certificate that a problem which saw no solve computes from Z in two passes."""
    problem = squared_problem(program)
    problem.beta_max()
    result, counts, at_return = solve_counting(monkeypatch, problem)
    assert result.certified and result.certificate.refine_status.startswith("not needed")
    assert counts.snapshot() == at_return
    fresh = squared_problem(program)
    before = counts.snapshot()
    alone = ct.certify(fresh, result.Z, refine="auto")
    assert 1.0 < counts.snapshot()["passes"] - before["passes"] <= 2.0
    mine, theirs = result.certificate.to_dict(), alone.to_dict()
    for key in ("refine_seconds",):
        mine.pop(key), theirs.pop(key)
    assert mine == theirs
    # the recovered objective is read (here) from the heads, with no product of the operator
    after = counts.snapshot()
    assert result.certificate.recovered_objective == pytest.approx(
        network_objective(problem, problem.reduction.invert(problem, result.Z)), rel=1e-10)
    assert counts.snapshot() == after


def test_the_verifier_remembers_the_last_Z_by_its_values(monkeypatch):
    problem = squared_problem(8)
    Z = ct.solve(squared_problem(8), "clarabel", tol=1e-9).Z
    problem.beta_max()
    counts = Counts(monkeypatch, problem.program.X)
    first = ct.certify(problem, Z, refine=False)
    once = counts.snapshot()["passes"]
    again = ct.certify(problem, Z.copy(), refine=False)
    assert counts.snapshot()["passes"] == once and again.to_dict() == first.to_dict()
    nudged = Z.copy()
    nudged[np.unravel_index(np.argmax(np.abs(Z)), Z.shape)] *= 1 + 1e-15
    ct.certify(problem, nudged, refine=False)  # another Z (by one rounding): computed afresh
    assert counts.snapshot()["passes"] == pytest.approx(2 * once)


def test_lazy_fields_survive_pickling_and_appear_in_the_summary():
    import pickle

    problem = squared_problem(10)
    result = ct.solve(problem, "fista")
    summary = result.summary()
    keys = list(summary)
    assert keys.index("heads_recovered") + 1 == keys.index("recovered_objective")
    assert summary["recovered_objective"] == result.certificate.recovered_objective
    copy = pickle.loads(pickle.dumps(result.certificate))
    assert copy.recovered is not None and copy.recovered.problem is None
    assert copy.to_dict() == result.certificate.to_dict()


@pytest.mark.parametrize("loss", ["squared", "logistic", "cross_entropy"])
def test_scaled_dual_bound_bounds_every_scaling(loss):
    """The bound that lets the verifier skip a candidate's adjoint is >= D(s V) on a fine grid of s in
    (0, 1] (squared loss: equal to its maximum, in closed form), for points in the dual domain."""
    rng = np.random.default_rng(3)
    N, c = 50, 3
    L = ct.core.losses.get_loss(loss)
    T = {"squared": rng.standard_normal((N, c)), "logistic": rng.choice([-1.0, 1.0], (N, 1)),
         "cross_entropy": np.eye(c)[rng.integers(0, c, N)]}[loss]
    grid = np.linspace(1e-3, 1.0, 400)
    for trial in range(8):
        Yhat = rng.standard_normal(T.shape) * (0.3 + trial)
        V = L.dual_variable(Yhat, T) * (1.0 + 0.2 * rng.standard_normal())  # some overshoot the domain
        V = L.project_dual_domain(V, T)
        bound = L.scaled_dual_bound(V, T)
        values = [L.dual_objective(V, T, s) for s in grid]
        if bound is None:  # only where D(s V) may still increase past s = 1: never for a point at s = 1 of a max
            assert loss != "squared"
            continue
        assert bound >= max(values) - 1e-12 * abs(max(values))
        if loss == "squared":  # the maximum itself, as scipy finds it
            from scipy.optimize import minimize_scalar
            best = minimize_scalar(lambda s: -L.dual_objective(V, T, s), bounds=(0.0, 1.0), method="bounded",
                                   options={"xatol": 1e-12})
            assert bound == pytest.approx(max(-best.fun, L.dual_objective(V, T, 1.0), 0.0), rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("program", [8, 12])
def test_a_logistic_solve_reads_no_data_after_its_backend(monkeypatch, program):
    """Proximal Newton has A x at hand after each step; the check that ends the solve (a settled working set solved
    to tol) is the verifier's own ``residual_of`` all the same, so ct.solve's certificate reads no more data (with
    A x reused there, it read the data twice more), and equals the certificate of a problem that saw no solve."""
    rng = np.random.default_rng(1)
    N, n, d = 600, 6, 4
    X = rng.standard_normal((N, n, d))
    y = np.where(X[:, 1] @ rng.standard_normal(d) + X[:, 4] @ rng.standard_normal(d) + 0.3 * rng.standard_normal(N) >= 0,
                 1.0, -1.0)
    problem = ct.make_problem(X, y, program=program, loss="logistic", beta_frac=0.1, gates=3)
    result, counts, at_return = solve_counting(monkeypatch, problem)
    assert result.certified and {h.method for h in result.history} >= {"newton"}
    assert counts.snapshot() == at_return
    fresh = ct.make_problem(X, y, program=program, loss="logistic", beta_frac=0.1, gates=3)
    mine, theirs = result.certificate.to_dict(), ct.certify(fresh, result.Z, refine="auto").to_dict()
    mine.pop("refine_seconds"), theirs.pop("refine_seconds")
    assert mine == theirs
