"""Why program (12) cannot generalise on a/b mod p (docs/reproduction.md), checked on small moduli:
the co-occurrence argument, the sign of the operand terms at an exact optimum, and the pieces the
exact solves of ``grok-gates`` rest on (the readings of division, the one-hot token operator, the
ReLU teacher's gates)."""
import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.core.attention import (AttentionOperator, AttentionProgram, TokenOperator, gate_mask,
                                           one_hot_tokens, sample_gates)
from cvxtransformer.datasets.algorithmic import READINGS, division_table, modular_division
from cvxtransformer.experiments.gate_solves import operand_evidence
from cvxtransformer.nn.deep import ReLUNetwork


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_test_label_cooccurs_with_its_operands_in_training(seed):
    """p = 7: for x != 0, (x, z) fixes y and (y, z) fixes x, so a test row's label never appears in
    training with its first operand or with its second."""
    d = modular_division(p=7, train_fraction=0.5, seed=seed)
    seen_x = {(int(x), int(z)) for (x, _, y, _), z in zip(d.tokens_train, d.y_train)}
    seen_y = {(int(y), int(z)) for (x, _, y, _), z in zip(d.tokens_train, d.y_train)}
    rows = [(int(x), int(y), int(z)) for (x, _, y, _), z in zip(d.tokens_test, d.y_test) if x != 0]
    assert len(rows) > 10
    assert not any((x, z) in seen_x or (y, z) in seen_y for x, y, z in rows)
    zero = [(int(x), int(z)) for (x, _, _, _), z in zip(d.tokens_test, d.y_test) if x == 0]
    assert zero and all(z == 0 for _, z in zero)          # the x = 0 rows: label 0, seen in training


def test_readings_of_division():
    for p in (5, 7):  # prime p: the three readings are one table
        tables = [sorted(zip(*(a.tolist() for a in division_table(p, r)))) for r in READINGS]
        assert tables[0] == tables[1] == tables[2] and len(tables[0]) == p * (p - 1)
    x, y, z = division_table(15, "invertible")
    assert len(z) == 120 and all((zi * yi - xi) % 15 == 0 for xi, yi, zi in zip(x, y, z))
    x, y, z = division_table(15, "power")                     # openai/grok: (y z mod 15) / y = z
    assert len(z) == 210 and np.array_equal(x, (y * z) % 15)
    labels = {}
    for xi, yi, zi in zip(x.tolist(), y.tolist(), z.tolist()):
        labels.setdefault((xi, yi), set()).add(zi)
    assert len(labels) == 146 and max(len(v) for v in labels.values()) == 5   # conflicting labels (y = 3, 6, ...)
    x, y, z = division_table(15, "fermat")
    assert len(z) == 210 and all(zi == (xi * pow(int(yi), 13, 15)) % 15 for xi, yi, zi in zip(x, y, z))
    d = modular_division(p=15, train_fraction=0.5, seed=0, reading="power")
    assert d.X_train.shape == (105, 4, 17) and d.X_test.shape == (105, 4, 17)
    with pytest.raises(ct.InvalidInputError, match="reading: expected one of"):
        modular_division(p=7, reading="euler")


def one_hot_case(N=60, n=4, d=7, h=5, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, d, (N, n))
    tokens[:, 1] = 3                                          # a constant token, as "op" and "="
    return np.eye(d)[tokens], tokens, sample_gates(h, n, d, seed + 1)


def test_token_operator_equals_the_dense_operator():
    X, tokens, (U1, U2) = one_hot_case()
    assert np.array_equal(one_hot_tokens(X), tokens) and one_hot_tokens(X + 1e-3) is None
    M = torch.from_numpy(gate_mask(X, U1, U2))
    dense = AttentionOperator(torch.from_numpy(X), None, M, 3, torch.device("cpu"))
    lookup = TokenOperator(torch.from_numpy(tokens), 7, None, M, 3, torch.device("cpu"), torch.float64)
    Z, V = torch.randn(dense.shape, dtype=torch.float64), torch.randn(60, 3, dtype=torch.float64)
    torch.testing.assert_close(lookup.forward(Z), dense.forward(Z))
    torch.testing.assert_close(lookup.adjoint(V), dense.adjoint(V))
    torch.testing.assert_close(lookup.block_norms(), dense.block_norms())
    torch.testing.assert_close(lookup.block_norm_bounds(), dense.block_norm_bounds())
    J, K = torch.tensor([0, 3, 4]), torch.tensor([1, 2])
    a, b = dense.restrict(J, K), lookup.restrict(J, K)
    Zr = torch.randn(a.shape, dtype=torch.float64)
    torch.testing.assert_close(b.forward(Zr), a.forward(Zr))
    torch.testing.assert_close(b.adjoint(V), a.adjoint(V))
    assert b.shape == a.shape and (b.N, b.hJ, b.nK, b.F) == (a.N, a.hJ, a.nK, a.F)
    assert isinstance(AttentionProgram(12, X, 3, U1, U2).operator(), TokenOperator)
    assert isinstance(AttentionProgram(12, X + 0.5, 3, U1, U2).operator(), AttentionOperator)


def test_one_hot_program_solves_to_the_interior_point_optimum():
    """The torch backend on the token operator and Clarabel on the dense CVXPY form agree."""
    X, tokens, (U1, U2) = one_hot_case(N=40, h=3)
    y = tokens[:, 0] % 3
    P = ct.make_problem(X, y, program=12, loss="cross_entropy", beta=1.0, U1=U1, U2=U2)
    P = P.with_beta(0.2 * P.beta_max())
    a, b = ct.solve(P, "clarabel", tol=1e-7), ct.solve(P, "fista", tol=1e-8)
    assert a.certified and b.certified
    assert b.certificate.primal_objective == pytest.approx(a.certificate.primal_objective, rel=1e-6)


@pytest.mark.parametrize("gates", ["random", "teacher"])
def test_operand_terms_of_an_unseen_label_are_never_positive_at_the_optimum(gates):
    """At every optimum of program (12) on one-hot tokens, ``Z[j, z, 0, x] = -(||z_g|| / beta) g_x`` with
    ``g_x = sum_{train i: x_i = x, M_ij = 1} p_iz >= 0`` when label z never comes with x in training:
    the operand part of the true label's logit is <= 0 on every test row with x != 0, whatever
    the gates (random, or a ReLU network's activation pattern)."""
    d = modular_division(p=5, train_fraction=0.6, seed=3)
    if gates == "random":
        U1, U2 = sample_gates(4, 4, 7, 0)
    else:
        U1, U2 = ReLUNetwork(7, 4, 5, dim=6, hidden=4, seed=0).gates()
    P = ct.make_problem(d.X_train, d.y_train, program=12, loss="cross_entropy", beta=1.0, U1=U1, U2=U2, n_classes=5)
    res = ct.solve(P.with_beta(0.05 * P.beta_max()), "clarabel", tol=1e-8)
    assert res.certified
    test = P.program.on(d.X_test)
    nonzero = d.tokens_test[:, 0] != 0
    Z = res.Z
    for (x, _, y, _), z in zip(d.tokens_test[nonzero], d.y_test[nonzero]):
        assert np.all(Z[:, z, 0, x] <= 1e-6) and np.all(Z[:, z, 2, y] <= 1e-6)
    ev = operand_evidence(test, Z, d.tokens_test, d.y_test)
    assert np.all(ev[nonzero] <= 1e-6) and np.any(ev[nonzero] < -1e-3)
    direct = np.array([sum(test.mask[i, j] * (Z[j, d.y_test[i], 0, d.tokens_test[i, 0]] +
                                              Z[j, d.y_test[i], 2, d.tokens_test[i, 2]]) for j in range(4))
                       for i in range(len(d.y_test))])
    np.testing.assert_allclose(ev, direct, atol=1e-12)


def test_relu_teacher_gates_are_its_activation_pattern():
    d = modular_division(p=11, train_fraction=0.5, seed=0)
    net = ReLUNetwork(13, 4, 11, dim=8, hidden=16, seed=2)
    U1, U2 = net.gates()
    with torch.no_grad():
        pre = net.preactivations(torch.as_tensor(d.tokens_train)).double().numpy()
        logits = net(torch.as_tensor(d.tokens_train)).double().numpy()
    np.testing.assert_array_equal(gate_mask(d.X_train, U1, U2), (pre >= 0).astype(float))
    # the network itself is a point of program (12) with these gates: Z[j, l, k] = W1[j, k] (E W2^T)[:, j] W3[j, l]
    W3 = net.W3.detach().double().numpy()
    Z = np.einsum("jk,jv,jl->jlkv", U1, U2, W3)
    np.testing.assert_allclose(AttentionProgram(12, d.X_train, 11, U1, U2).forward(Z), logits, rtol=1e-4, atol=1e-4)
