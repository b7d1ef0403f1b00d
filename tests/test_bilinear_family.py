"""docs/examples/bilinear_family.py: a family in a user's own file on the design base (a bilinear readout,
``yhat_il = <Z_l, X_i>`` with ``beta sum_l ||Z_l||_*``) agrees with the program written directly in CVXPY
through every solver and form; its network is certified; ``compare`` trains networks the user passes
(certified where they are the family's), and on a family without models says so in one line."""
import cvxpy as cp
import numpy as np
import pytest
import torch
from conftest import load_example

import cvxtransformer as ct
from cvxtransformer.core.errors import InvalidInputError


@pytest.fixture
def example(monkeypatch):
    """The example's module, its family registered in this test only."""
    module = load_example(monkeypatch, "bilinear_family.py")
    module.register_family()
    return module


def direct(X, y, beta, loss="squared"):
    """The program written directly in CVXPY: ``sum_i L(<Z_l, X_i>, y_il) + beta sum_l ||Z_l||_*``."""
    N, n, d = X.shape
    c = y.shape[1]
    Z = [cp.Variable((n, d)) for _ in range(c)]
    Yhat = cp.hstack([cp.reshape(X.reshape(N, n * d) @ cp.vec(Zl, order="C"), (N, 1), order="C") for Zl in Z])
    fit = 0.5 * cp.sum_squares(Yhat - y) if loss == "squared" else cp.sum(cp.logistic(-cp.multiply(y, Yhat)))
    problem = cp.Problem(cp.Minimize(fit + beta * sum(cp.normNuc(Zl) for Zl in Z)))
    problem.solve(solver="CLARABEL", tol_gap_rel=1e-10, tol_gap_abs=1e-10, tol_feas=1e-10)
    return problem.value, np.stack([Zl.value for Zl in Z])


def test_the_example_family_is_its_direct_cvxpy_program_through_every_solver(example, capsys):
    out = example.main()
    assert "certified gap" in capsys.readouterr().out
    value, Z = direct(out["X"], out["y"], out["beta"])
    assert set(out["results"]) == {"clarabel primal", "clarabel dual", "scs primal", "scs dual", "fista primal"}
    for name, result in out["results"].items():
        assert result.certified, name
        assert result.certificate.primal_objective == pytest.approx(value, rel=1e-6), name
        np.testing.assert_allclose(result.Z, Z, atol=1e-5 * np.abs(Z).max(), err_msg=name)  # a gap of 1e-8: Z to ~1e-6
    assert out["network"].gap <= 1e-8 * value  # the recovered heads attain the optimum
    run = out["comparison"].models["bilinear"]  # the user's network: its weights are the family's heads
    assert run.report["bound_applies"] and run.certified_lower_bound <= value * (1 + 1e-9)
    assert run.certified_gap == pytest.approx(run.objective - run.certified_lower_bound)
    assert run.objective >= value * (1 - 1e-9)


def test_the_example_family_takes_the_other_losses(example):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((40, 3, 2))
    y = np.where(np.einsum("ikd,kd->i", X, rng.standard_normal((3, 2))) > 0, 1.0, -1.0)[:, None]
    P = ct.make_problem(X, y[:, 0], program="bilinear", loss="logistic", beta=1.0)
    P = P.with_beta(0.1 * P.beta_max())
    value, _ = direct(X, y, P.beta, "logistic")
    for solver in ("clarabel", "fista"):
        result = ct.solve(P, solver, tol=1e-8)
        assert result.certified and result.certificate.primal_objective == pytest.approx(value, rel=1e-6)


def test_compare_trains_the_users_networks_and_says_which_it_bounds(example):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((30, 3, 2))
    P = ct.make_problem(X, rng.standard_normal((30, 2)), program="bilinear", beta=1.0)
    P = P.with_beta(0.3 * P.beta_max())
    net = example.BilinearNetwork(3, 2, 2, heads=2, seed=0)
    before = net.w1.detach().clone()

    class Unbound(example.BilinearNetwork):  # the same outputs, but no weights the family's reduction takes
        to_weights = None

    out = ct.compare(P, networks={"mine": net, "other": Unbound(3, 2, 2, heads=2, seed=0)}, steps=50, solver="clarabel")
    assert torch.equal(net.w1.detach(), before)  # a copy is trained, not the module given
    mine, other = out.models["mine"], out.models["other"]
    lower = out.certificate.dual_objective
    assert mine.report["bound_applies"] and mine.certified_gap == pytest.approx(mine.objective - lower)
    assert not other.report["bound_applies"] and other.certified_gap is None
    assert "is bounded only where it offers to_weights()" in other.report["note"]
    assert mine.objective == pytest.approx(other.objective, rel=1e-12)  # the same network, trained alike
    for bad, match in (({"alternative": net}, r"^networks: expected names apart from compare's models"),
                       ({"x": torch.nn.Linear(2, 2)}, r"^networks\['x'\]: expected a torch module with encode_inputs"),
                       ({"x": example.BilinearNetwork(3, 2, 3, heads=1)}, r"^networks\['x'\]: expected outputs of "
                                                                          r"shape \(N, 2\)")):
        with pytest.raises(InvalidInputError, match=match):
            ct.compare(P, networks=bad, steps=5)


def test_compare_on_a_family_without_models_says_so_in_one_line(example):
    X = np.random.default_rng(3).standard_normal((20, 3, 2))
    P = ct.make_problem(X, X[:, 0, :], program="bilinear", beta=1.0)
    with pytest.raises(InvalidInputError) as info:
        ct.compare(P, steps=5)
    message = str(info.value)
    assert message.startswith("models: expected a model of compare for bilinear readout program, got none") \
        and "networks={'name': torch module}" in message and "\n" not in message and "()" not in message
    with pytest.raises(InvalidInputError, match=r"^models: expected no model: program \(bilinear\) has none of "
                                                r"compare's models, got 'alternative'; alternative joins programs"):
        ct.compare(P, models="alternative", steps=5)
