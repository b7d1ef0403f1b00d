"""The torch networks (3), (6)/(9), (11): objectives against numpy, Proposition 1 loaded exactly."""
import numpy as np
import pytest
import torch
from scipy.special import softmax

import cvxtransformer as ct
from cvxtransformer.core.losses import get_loss, project_rows_to_simplex
from cvxtransformer.nn.networks import AlternativeAttention, GatedAttention, SoftmaxAttention, build_network

from conftest import GROUP_LASSO_CASES as CASES
from conftest import case_id, random_problem


def objective(net, problem):
    return net.objective(net.encode_inputs(problem.program.X), problem.T, problem.loss, problem.beta).item()


def load_recovered(problem, Z, form):
    weights = ct.recover_weights(problem, Z, form=form)
    c, p = problem.T.shape[1], problem.program
    if p.number == 12:
        return GatedAttention.from_weights(weights, p.U1, p.U2, c=c)
    return AlternativeAttention.from_weights(weights, c=c)


def network(problem, heads, seed):
    n, d, c, p = problem.program.n, problem.program.d, problem.T.shape[1], problem.program
    if p.number == 12:
        return GatedAttention(n, d, c, heads, p.U1, p.U2, seed=seed)
    return AlternativeAttention(n, d, c, heads, seed=seed)


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("form", ["balanced", "lemma1"])
def test_recovered_weights_reproduce_the_convex_optimum(case, form):
    problem = random_problem(*case)
    result = ct.solve(problem)
    net = load_recovered(problem, result.Z, form)
    P_star = result.certificate.primal_objective
    assert net.heads == result.certificate.heads_recovered > 0
    assert objective(net, problem) == pytest.approx(P_star, rel=1e-12, abs=1e-12)
    # The network implements exactly the convex coefficients it was loaded from.
    np.testing.assert_allclose(net.effective_coefficients(), result.Z.reshape(problem.program.canonical_shape),
                               atol=1e-14)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_torch_objective_matches_numpy_nonconvex_objective(case):
    problem = random_problem(*case)
    for heads, seed in ((1, 0), (7, 1)):
        net = network(problem, heads, seed)
        expected = ct.nonconvex_objective(problem, net.to_weights())
        assert objective(net, problem) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_any_network_is_above_the_convex_objective_of_its_coefficients(case):
    problem = random_problem(*case)
    D = ct.solve(problem).certificate.dual_objective
    for seed in range(3):
        net = network(problem, 5, seed)
        value = objective(net, problem)
        assert value >= problem.primal_objective(net.effective_coefficients().reshape(problem.program.shape)) - 1e-9
        assert value >= D


@pytest.mark.parametrize("loss, targets", [
    ("squared", lambda r: r.standard_normal((20, 3))),
    ("logistic", lambda r: np.where(r.standard_normal((20, 1)) > 0, 1.0, -1.0)),
    ("cross_entropy", lambda r: np.eye(3)[r.integers(0, 3, 20)]),
])
def test_torch_losses_match_numpy_even_at_large_margins(loss, targets):
    rng = np.random.default_rng(0)
    T = targets(rng)
    Yhat = 40 * rng.standard_normal(T.shape)  # softplus thresholds would be off by ~1e-9 here
    expected = get_loss(loss).value(Yhat, T)
    assert get_loss(loss).value(torch.tensor(Yhat), torch.tensor(T)).item() == pytest.approx(expected, rel=1e-13)


def test_simplex_projection_matches_numpy_and_is_idempotent():
    net = AlternativeAttention(5, 2, 1, 6)
    with torch.no_grad():
        net.W1.copy_(torch.tensor(np.random.default_rng(0).standard_normal((6, 5)) * 3))
    expected = project_rows_to_simplex(net.W1.detach().numpy())
    net.project_()
    W = net.W1.detach()
    np.testing.assert_allclose(W.numpy(), expected, atol=1e-15)
    assert torch.all(W >= 0) and torch.allclose(W.sum(dim=1), torch.ones(6, dtype=W.dtype))
    assert torch.equal(project_rows_to_simplex(W), W)  # idempotent
    vertex = torch.eye(5, dtype=torch.float64)
    assert torch.equal(project_rows_to_simplex(vertex), vertex)


def test_alternative_network_hand_checkable():
    # One head on token 1 with value (1, 2) and output (3,): yhat = 3 * (x_1 . (1, 2)).
    net = AlternativeAttention(2, 2, 1, 0).set_weights([[0.0, 1.0]], [[1.0, 2.0]], [[3.0]])
    X = np.array([[[9.0, 9.0], [1.0, 1.0]]])
    (Xt,) = net.encode_inputs(X)
    assert net(Xt).item() == 9.0
    assert net.penalty(2.0).item() == pytest.approx(0.5 * 2.0 * (5.0 + 9.0))


def test_gated_network_closes_heads_whose_gate_is_negative():
    U1, U2 = np.array([[1.0, 0.0]]), np.array([[1.0, 0.0]])
    net = GatedAttention(2, 2, 1, 0, U1, U2).set_weights([[1.0, 0.0]], [[1.0, 0.0]], [[1.0]])
    X = np.array([[[2.0, 0.0], [0.0, 0.0]], [[-2.0, 0.0], [0.0, 0.0]]])
    assert net(*net.encode_inputs(X)).flatten().tolist() == [2.0, 0.0]
    assert net.arrays()["gate"].tolist() == [0]


def test_softmax_network_is_the_student_teacher_softmax_teacher():
    rng = np.random.default_rng(0)
    N, n, d, c = 10, 5, 4, 3
    X = rng.standard_normal((N, n, d))
    Wq, Wk, Wv, Wo = (rng.standard_normal(s) for s in ((d, d), (d, d), (d, d), (d, c)))
    A = softmax(np.einsum("ikd,de,fe,ilf->ikl", X, Wq, Wk, X) / np.sqrt(d), axis=-1)
    Y = np.einsum("ikl,ild,de,ec->ikc", A, X, Wv, Wo)
    token0 = SoftmaxAttention(n, d, c).set_weights(Wq, Wk, Wv, Wo)
    np.testing.assert_allclose(token0(*token0.encode_inputs(X)).detach().numpy(), Y[:, 0], atol=1e-12)
    seq = SoftmaxAttention(n, d, n * c, sequence=True).set_weights(Wq, Wk, Wv, Wo)
    np.testing.assert_allclose(seq(*seq.encode_inputs(X)).detach().numpy(), Y.reshape(N, -1), atol=1e-12)
    beta = 0.7
    expected = 0.5 * beta * sum(np.sum(W ** 2) for W in (Wq, Wk, Wv, Wo))
    assert seq.penalty(beta).item() == pytest.approx(expected, rel=1e-13)
    assert seq.attention_map(X).shape == (n, n) and token0.attention_map(X).shape == (1, n)
    assert set(seq.arrays()) == {"Wq", "Wk", "Wv", "Wo"} and seq.arrays()["Wo"].shape == (d, c)


def test_initialisation_is_deterministic_and_on_the_simplex():
    a, b = AlternativeAttention(6, 3, 2, 10, seed=3), AlternativeAttention(6, 3, 2, 10, seed=3)
    for name in ("W1", "W2", "W3"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert torch.all(a.W1 >= 0) and torch.allclose(a.W1.sum(dim=1), torch.ones(10, dtype=torch.float64))
    assert not torch.equal(a.W2, AlternativeAttention(6, 3, 2, 10, seed=4).W2)


def test_float32_networks_run():
    net = AlternativeAttention(4, 3, 2, 3, dtype=torch.float32)
    out = net(*net.encode_inputs(np.ones((2, 4, 3))))
    assert out.dtype == torch.float32 and out.shape == (2, 2)


def test_errors_name_the_argument():
    with pytest.raises(ct.InvalidInputError, match="heads"):
        AlternativeAttention(4, 3, 2, -1)
    with pytest.raises(ct.InvalidInputError, match="W1: expected attention rows on the simplex"):
        AlternativeAttention(2, 1, 1, 0).set_weights([[0.7, 0.7]], [[1.0]], [[1.0]])
    with pytest.raises(ct.InvalidInputError, match="W1, W2, W3"):
        AlternativeAttention(2, 1, 1, 0).set_weights([[0.5, 0.5]], [[1.0, 2.0]], [[1.0]])
    with pytest.raises(ct.InvalidInputError, match="gate"):
        GatedAttention(2, 1, 1, 2, np.ones((1, 2)), np.ones((1, 1)), gate=[0, 1])
    with pytest.raises(ct.InvalidInputError, match="U1, U2"):
        GatedAttention(2, 1, 1, 2, np.ones((1, 3)), np.ones((1, 1)))
    with pytest.raises(ct.InvalidInputError, match="model"):
        build_network("transformer", 2, 1, 1, heads=1)
    with pytest.raises(ct.InvalidInputError, match="U1, U2"):
        build_network("gated", 2, 1, 1, heads=1)
    with pytest.raises(ct.InvalidInputError, match=r"X: expected shape \(N, 2, 1\)"):
        AlternativeAttention(2, 1, 1, 1).encode_inputs(np.ones((3, 2, 2)))
    with pytest.raises(ct.InvalidInputError, match="c: expected a multiple of n"):
        SoftmaxAttention(4, 2, 6, sequence=True)
    weights = ct.recover_weights(ct.make_problem(np.ones((3, 2, 2)), np.ones((3, 1)), program=10, beta=1.0),
                                 np.ones((1, 2, 2)))
    with pytest.raises(ct.InvalidInputError, match="weights.gate"):
        GatedAttention.from_weights(weights, np.ones((1, 2)), np.ones((1, 2)))


def test_build_network_builds_the_networks_the_families_declare():
    """Besides the attention models, build_network builds what the families' ``models`` declare (``network``):
    the same network as the class called directly, the family's gate arrays passed by name, others ignored."""
    from cvxtransformer.core.registry import families
    from cvxtransformer.nn.mhsa import GatedMHSA, LinearMHSA
    from cvxtransformer.nn.mixer import GatedMixer

    rng = np.random.default_rng(0)
    H, G = rng.standard_normal((2, 3, 3)), rng.standard_normal((2, 4))
    declared = {m for f in families().values() for m, spec in f.reduction.models.items() if spec.get("network")}
    assert {"linear_mhsa", "gated_mhsa", "relu_mhsa", "mixer", "relu_mixer"} <= declared
    for model, expected in (("linear_mhsa", LinearMHSA(4, 3, 2, 3, pooled=True, seed=5)),
                            ("gated_mhsa", GatedMHSA(4, 3, 2, 3, H, pooled=True, seed=5)),
                            ("mixer", GatedMixer(4, 3, 2, 3, G, pooled=True, seed=5))):
        net = build_network(model, 4, 3, 2, heads=3, seed=5, H=H, G=G, U1=np.ones((1, 4)), U2=np.ones((1, 3)))
        assert type(net) is type(expected) and net.pooled
        for key, value in expected.arrays().items():
            np.testing.assert_array_equal(net.arrays()[key], value)
    per_token = build_network("linear_mhsa", 4, 3, 8, heads=1, sequence=True)
    assert not per_token.pooled and per_token.c_token == 2
    np.testing.assert_array_equal(build_network("gated_mhsa", 4, 3, 2, heads=1, H=H).H, H)
    with pytest.raises(ct.InvalidInputError, match=r"^H: expected the gate matrices of gated-ReLU MHSA program for "
                                                    r"the gated_mhsa network, got None"):
        build_network("gated_mhsa", 4, 3, 2, heads=1)
    with pytest.raises(ct.InvalidInputError, match=r"^model: expected one of \('alternative', 'gated', 'alternative_wd', 'gated_wd', 'softmax', "
                                                    r"'linear_mhsa', .*'relu_mixer'\), got 'transformer'"):
        build_network("transformer", 2, 1, 1, heads=1)
