"""The linear maps of programs (8), (10), (12): forward, adjoint, design and gates, checked
against sample-by-sample formulas of SPEC.md."""
import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.core.attention import AttentionProgram

rng = np.random.default_rng(11)
N, n, d, c, h = 9, 4, 3, 2, 5
X = rng.standard_normal((N, n, d))
U1, U2 = ct.sample_gates(h, n, d, seed=2)


def explicit_mask():
    return np.array([[float(U1[j] @ X[i] @ U2[j] >= 0) for j in range(h)] for i in range(N)])


def explicit_forward(Z4, M):
    out = np.zeros((N, c))
    for i in range(N):
        for l in range(c):
            out[i, l] = sum(M[i, j] * np.trace(Z4[j, l].T @ X[i]) for j in range(Z4.shape[0]))
    return out


def test_gate_mask_matches_definition():
    np.testing.assert_array_equal(ct.gate_mask(X, U1, U2), explicit_mask())


@pytest.mark.parametrize("gated", [False, True])
def test_forward_and_adjoint(gated):
    M = explicit_mask() if gated else None
    prog = AttentionProgram(12, X, c, U1, U2) if gated else AttentionProgram(10, X, c)
    Z4 = rng.standard_normal(prog.canonical_shape)
    Z = Z4.reshape(prog.shape)  # the program's one shape: (c, n, d) for (10), (h, c, n, d) for (12)
    np.testing.assert_allclose(prog.forward(Z), explicit_forward(Z4, M if gated else np.ones((N, 1))),
                               rtol=1e-12)
    V = rng.standard_normal((N, c))
    assert prog.adjoint(V).shape == prog.shape
    G = prog.adjoint(V).reshape(prog.canonical_shape)
    # <A Z, V> = <Z, A^T V>
    assert np.sum(prog.forward(Z) * V) == pytest.approx(np.sum(Z4 * G), rel=1e-12)
    # the dual constraint of SPEC.md (28)/(33): G[j, l, k] = sum_i V_il M_ij x_ik
    Mm = M if gated else np.ones((N, 1))
    j, l, k = prog.h - 1, c - 1, 1
    np.testing.assert_allclose(G[j, l, k], sum(V[i, l] * Mm[i, j] * X[i, k] for i in range(N)), rtol=1e-12)
    # the dense design reproduces the forward map
    W = Z4.transpose(0, 2, 3, 1).reshape(-1, c)
    np.testing.assert_allclose(prog.design() @ W, prog.forward(Z), rtol=1e-12)


def test_program_8_is_10_with_one_output_and_10_is_12_with_an_open_gate():
    y = rng.standard_normal(N)
    p8 = ct.make_problem(X, y, program=8, beta=1.0)
    p10 = ct.make_problem(X, y[:, None], program=10, beta=1.0)
    p12 = ct.make_problem(X, y[:, None], program=12, beta=1.0, U1=np.zeros((1, n)), U2=np.zeros((1, d)))
    Z = rng.standard_normal((n, d))
    assert p8.program.shape == (n, d) and p10.program.shape == (1, n, d) and p12.program.shape == (1, 1, n, d)
    values = [p.primal_objective(Z.reshape(p.program.shape)) for p in (p8, p10, p12)]
    assert values[0] == pytest.approx(values[1], rel=1e-14) and values[0] == pytest.approx(values[2], rel=1e-14)
    assert p8.beta_max() == pytest.approx(p12.beta_max(), rel=1e-14)


def test_group_operator_norms_are_spectral_norms():
    M = explicit_mask()
    prog = AttentionProgram(12, X, c, U1, U2)
    norms = prog.block_norms()
    j, k = 3, 2
    B = np.stack([M[i, j] * X[i, k] for i in range(N)], axis=1)  # d x N
    assert norms[j, 0, k] == pytest.approx(np.linalg.norm(B, 2), rel=1e-10)
    assert norms[j, 1, k] == norms[j, 0, k]


def test_beta_max_is_the_dual_norm_at_zero():
    y = rng.standard_normal(N)
    p = ct.make_problem(X, y, program=8, beta=1.0)
    expected = max(np.linalg.norm(sum(y[i] * X[i, k] for i in range(N))) for k in range(n))
    assert p.beta_max() == pytest.approx(expected, rel=1e-13)


def test_forward_reads_only_z_s_tokens_where_that_saves_more_than_the_restriction_costs(monkeypatch):
    """The torch operator's forward restricts itself to the tokens where Z is nonzero only where the whole
    product is over ``RESTRICT_WORK`` multiply-adds (a restricted operator costs about 0.1 ms of calls); both
    ways give ``yhat = sum_k X_k z_k``, computed here from its definition."""
    import torch

    from cvxtransformer.core import attention
    calls, real = [], attention.AttentionOperator.restrict

    def spy(self, *args, **kwargs):
        calls.append(self.N)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(attention.AttentionOperator, "restrict", spy)
    rng = np.random.default_rng(3)
    for N in (100, 20_000):  # 100 * 8 * 4 and 20,000 * 8 * 4 multiply-adds, about the threshold 5e5
        X = rng.standard_normal((N, 8, 4))
        program = AttentionProgram(8, X, 1)
        Z = np.zeros((8, 4))
        Z[[1, 6]] = rng.standard_normal((2, 4))
        op = program.operator()
        yhat = op.forward(torch.from_numpy(Z).reshape(op.shape))
        np.testing.assert_allclose(yhat.numpy()[:, 0], np.einsum("ikd,kd->i", X, Z), rtol=1e-12, atol=1e-12)
    assert calls == [20_000]  # only the large product was restricted
    assert 100 * 8 * 4 < attention.RESTRICT_WORK < 20_000 * 8 * 4
