"""The trainer: histories, determinism, and the certified bound that no trained network crosses."""
import math

import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.nn.networks import AlternativeAttention, GatedAttention, SoftmaxAttention
from cvxtransformer.nn.trainer import train

from conftest import random_problem


def independent_lower_bound(problem, Z):
    """D(V) recomputed here from SPEC.md's formulas only (squared loss): V = s (T - yhat(Z)),
    s = min(1, beta / max_{j,l,k} ||sum_i V_il M_ij x_ik||), D(V) = <V, T> - ||V||^2 / 2."""
    X, T, beta, U1, U2 = problem.program.X, problem.T, problem.beta, problem.program.U1, problem.program.U2
    N = X.shape[0]
    M = np.ones((N, 1)) if U1 is None else (np.einsum("jk,ikd,jd->ij", U1, X, U2) >= 0).astype(float)
    Z4 = np.asarray(Z).reshape(M.shape[1], T.shape[1], X.shape[1], X.shape[2])
    Yhat = np.einsum("ij,jlkd,ikd->il", M, Z4, X)
    V = T - Yhat
    worst = np.max(np.linalg.norm(np.einsum("il,ij,ikd->jlkd", V, M, X), axis=-1))
    V = V * min(1.0, beta / worst)
    assert np.max(np.linalg.norm(np.einsum("il,ij,ikd->jlkd", V, M, X), axis=-1)) <= beta * (1 + 1e-12)
    return float(np.sum(V * T) - 0.5 * np.sum(V * V))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adam_never_reports_an_objective_below_the_certified_bound(seed):
    problem = random_problem(10, "squared", "vector", seed=seed, N=40, n=4, d=3)
    result = ct.solve(problem)
    bound = independent_lower_bound(problem, result.Z)
    assert bound == pytest.approx(result.certificate.dual_objective, rel=1e-6)
    for heads in (2, 12):
        net = AlternativeAttention(4, 3, problem.T.shape[1], heads, seed=seed)
        run = train(net, problem.program.X, problem.T, "squared", problem.beta, lr=0.05, steps=300, seed=seed)
        assert run.status == "finished"
        assert np.all(run.history.objective >= bound)
        assert run.objective >= bound
        assert run.objective < run.history.objective[0]
        # The recorded final objective is the network's objective, recomputed independently.
        assert run.objective == pytest.approx(ct.nonconvex_objective(problem, net.to_weights()), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_gated_network_stays_above_the_bound_of_program_12(seed):
    problem = random_problem(12, "squared", "vector", seed=seed, N=40, n=4, d=3, gates=3)
    bound = independent_lower_bound(problem, ct.solve(problem).Z)
    net = GatedAttention(4, 3, problem.T.shape[1], 18, problem.program.U1, problem.program.U2, seed=seed)
    run = train(net, problem.program.X, problem.T, "squared", problem.beta, lr=0.05, steps=200,
                batch_size=16, seed=seed)
    assert np.all(run.history.objective >= bound)


def test_history_shapes_and_metrics():
    problem = random_problem(10, "cross_entropy", "classes", N=30)
    X, T = problem.program.X, problem.T
    run = train(AlternativeAttention(4, 3, 3, 6), X, T, "cross_entropy", problem.beta, steps=40, eval_every=10,
                X_test=X[:7], T_test=T[:7])
    h = run.history
    assert h.iterations.tolist() == list(range(41)) and h.objective.shape == h.seconds.shape == (41,)
    assert np.all(np.diff(h.seconds) >= 0) and run.seconds == h.seconds[-1]
    assert h.eval_iterations.tolist() == [0, 10, 20, 30, 40]
    for a in (h.train_loss, h.test_loss, h.train_accuracy, h.test_accuracy, h.eval_seconds):
        assert a.shape == (5,) and np.all(np.isfinite(a))
    assert np.all((h.train_accuracy >= 0) & (h.train_accuracy <= 1))
    # The last evaluation is at the final weights: mean train loss = data part of the objective / N.
    penalty = run.network.penalty(problem.beta).item()
    assert h.train_loss[-1] == pytest.approx((run.objective - penalty) / 30, rel=1e-10)


def test_metrics():
    T = np.array([[1.0], [-1.0], [1.0]])
    logistic = ct.get_loss("logistic")
    loss, acc = logistic.metrics(np.array([[2.0], [1.0], [-1.0]]), T)
    assert acc == pytest.approx(1 / 3) and loss == pytest.approx(logistic.value(np.array([[2.0], [1.0], [-1.0]]), T) / 3)
    assert math.isnan(ct.get_loss("squared").metrics(np.zeros((2, 1)), np.ones((2, 1)))[1])
    assert ct.get_loss("cross_entropy").metrics(np.array([[1.0, 0.0], [2.0, 0.0]]), np.eye(2))[1] == 0.5


@pytest.mark.parametrize("batch_size", [None, 8])
@pytest.mark.parametrize("optimizer, lr", [("adam", 0.02), ("sgd", 1e-3)])
def test_fixed_seeds_are_deterministic(batch_size, optimizer, lr):
    problem = random_problem(10, "squared", "vector", N=32)

    def once(seed):
        net = AlternativeAttention(4, 3, 3, 5, seed=seed)
        return train(net, problem.program.X, problem.T, "squared", problem.beta, optimizer=optimizer, lr=lr,
                     steps=30, batch_size=batch_size, seed=seed)

    a, b, c = once(0), once(0), once(1)
    np.testing.assert_array_equal(a.history.objective, b.history.objective)
    np.testing.assert_array_equal(a.network.W2.detach().numpy(), b.network.W2.detach().numpy())
    assert not np.array_equal(a.history.objective, c.history.objective)
    assert a.objective < a.history.objective[0]


def test_softmax_network_trains():
    problem = random_problem(10, "squared", "sequence", N=30)
    net = SoftmaxAttention(4, 3, problem.T.shape[1], sequence=True)
    run = train(net, problem.program.X, problem.T, "squared", problem.beta, steps=60, lr=0.05)
    assert run.objective < run.history.objective[0]


def test_sgd_with_a_huge_step_is_reported_as_diverged():
    problem = random_problem(10, "squared", "vector", N=30)
    run = train(AlternativeAttention(4, 3, 3, 5), problem.program.X, problem.T, "squared", problem.beta,
                optimizer="sgd", lr=1e3, steps=200)
    assert run.status == "diverged" and not math.isfinite(run.objective) and run.steps < 200
    assert len(run.history.objective) == run.steps + 1


def test_time_limit_and_threads_are_restored():
    problem = random_problem(10, "squared", "vector", N=30)
    before = torch.get_num_threads()
    run = train(AlternativeAttention(4, 3, 3, 5), problem.program.X, problem.T, "squared", problem.beta,
                steps=10 ** 6, time_limit=0.05)
    assert run.status == "time limit" and run.steps < 10 ** 6
    assert torch.get_num_threads() == before


def test_progress_bar_can_be_silenced(capsys):
    problem = random_problem(10, "squared", "vector", N=20)
    args = (problem.program.X, problem.T, "squared", problem.beta)
    train(AlternativeAttention(4, 3, 3, 2), *args, steps=5)
    assert capsys.readouterr().err == ""
    train(AlternativeAttention(4, 3, 3, 2), *args, steps=5, progress=True)
    assert "alternative (adam)" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, match", [
    (dict(optimizer="rmsprop"), "optimizer: expected one of"),
    (dict(lr=0.0), "lr: expected a finite number > 0"),
    (dict(lr=float("nan")), "lr: expected"),
    (dict(steps=0), "steps: expected an integer >= 1"),
    (dict(steps=2.5), "steps: expected an integer"),
    (dict(batch_size=0), "batch_size: expected"),
    (dict(batch_size=1000), "batch_size: expected at most the number of samples"),
    (dict(eval_every=-1), "eval_every"),
    (dict(beta=0.0), "beta: expected"),
    (dict(threads=0), "threads"),
])
def test_bad_options_name_the_argument(kwargs, match):
    problem = random_problem(10, "squared", "vector", N=20)
    options = dict(beta=problem.beta, steps=3)
    options.update(kwargs)
    with pytest.raises(ct.InvalidInputError, match=match):
        train(AlternativeAttention(4, 3, 3, 2), problem.program.X, problem.T, "squared", **options)


def test_targets_must_be_encoded():
    problem = random_problem(10, "squared", "vector", N=20)
    with pytest.raises(ct.InvalidInputError, match=r"T: expected encoded targets of shape \(N, 3\)"):
        train(AlternativeAttention(4, 3, 3, 2), problem.program.X, problem.T[:, 0], "squared", 1.0, steps=2)
