"""``certify_network``: networks (9), (11) and (5) trained here in plain torch (not by the package's
trainer) are certified through the forward map weights -> Z; their certified gaps are checked
against P(Z*) of an exact solve, and the forward map against ``invert``."""
import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.core.attention import AttentionHeads, gate_mask, sample_gates
from cvxtransformer.core.mhsa import MHSAHeads
from cvxtransformer.datasets import student_teacher

N, n, d, c, H = 60, 4, 3, 2, 3


@pytest.fixture(scope="module")
def data():
    X, Y = student_teacher(N=N, n=n, d=d, c=c, heads=2, noise=0.1, seed=0)
    return X, Y


def adam(params, objective, steps=400, lr=0.03):
    opt = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        value = objective()
        value.backward()
        opt.step()
    with torch.no_grad():
        return objective().item()


def train_attention(X, Y, beta, m, gates=None):
    """Network (9) (or (11) with ``gates`` = (mask (N, h), gate of each head)) in plain torch: attention
    rows as softmaxes of logits, squared loss summed, penalty beta/2 (||w2||^2 + ||w3||_1^2)."""
    torch.manual_seed(0)
    logits = torch.randn(m, n, dtype=torch.float64, requires_grad=True)
    W2 = (0.5 * torch.randn(m, d, dtype=torch.float64)).requires_grad_()
    W3 = (0.5 * torch.randn(m, c, dtype=torch.float64)).requires_grad_()
    Xt, Yt = torch.as_tensor(X), torch.as_tensor(Y)
    open_ = torch.ones(N, m, dtype=torch.float64) if gates is None else torch.as_tensor(gates[0][:, gates[1]])

    def objective():
        W1 = torch.softmax(logits, dim=1)
        scores = torch.einsum("jk,ikd,jd->ij", W1, Xt, W2) * open_
        return 0.5 * torch.sum((scores @ W3 - Yt) ** 2) + beta / 2 * (
            torch.sum(W2 ** 2) + torch.sum(torch.sum(torch.abs(W3), dim=1) ** 2))

    value = adam([logits, W2, W3], objective)
    weights = {"W1": torch.softmax(logits, dim=1).detach().numpy(), "W2": W2.detach().numpy(),
               "W3": W3.detach().numpy()}
    if gates is not None:
        weights["gate"] = gates[1]
    return weights, value


def train_mhsa(X, Y, beta, m):
    """Network (5) in plain torch: f(X_i) = sum_j X_i W1j X_i^T X_i W2j per token, penalty beta/2 sum ||W||^2."""
    torch.manual_seed(1)
    W1 = (0.3 * torch.randn(m, d, d, dtype=torch.float64)).requires_grad_()
    W2 = (0.3 * torch.randn(m, d, Y.shape[2], dtype=torch.float64)).requires_grad_()
    Xt, Yt = torch.as_tensor(X), torch.as_tensor(Y)

    def objective():
        G = Xt.transpose(1, 2) @ Xt
        out = torch.einsum("ita,jak,ikb,jbc->itc", Xt, W1, G, W2)
        return 0.5 * torch.sum((out - Yt) ** 2) + beta / 2 * (torch.sum(W1 ** 2) + torch.sum(W2 ** 2))

    value = adam([W1, W2], objective, steps=500, lr=0.01)
    return {"W1": W1.detach().numpy(), "W2": W2.detach().numpy()}, value


def check(problem, weights, value):
    """The certified gap against the true gap from an exact solve, and the network's objective."""
    cert = ct.certify_network(problem, weights)
    exact = ct.solve(problem, "clarabel", tol=1e-9).certificate
    assert exact.relative_gap <= 1e-9
    optimum = exact.primal_objective                       # P(Z*) >= p* >= D(V) of any dual point
    assert cert.objective == pytest.approx(value, rel=1e-12)  # the network's own objective
    assert cert.certificate.primal_objective <= cert.objective * (1 + 1e-12)  # P(Z) <= the network's
    assert cert.lower_bound <= optimum + 1e-9 * optimum     # a lower bound on the family's optimum
    true_gap = cert.objective - optimum
    assert true_gap > 1e-3                                  # Adam did not reach the optimum
    assert cert.gap >= true_gap - 1e-9 * optimum
    assert cert.gap - true_gap <= 1e-6 * optimum            # tight: the refined dual point
    assert cert.relative_gap == pytest.approx(cert.gap / cert.lower_bound)  # (objective - D) / D, issue 33
    return cert


def test_network_9_trained_in_plain_torch(data):
    X, Y = data
    P = ct.make_problem(X, Y, program=10, beta=1.0)
    P = P.with_beta(0.1 * P.beta_max())
    weights, value = train_attention(X, Y, P.beta, m=5)
    cert = check(P, weights, value)
    assert cert.network == "(9)" and cert.program == 10 and cert.heads == 5
    # the forward map: the program's output at Z is the network's output
    np.testing.assert_allclose(P.program.forward(cert.Z),
                               np.einsum("jk,ikd,jd->ij", weights["W1"], X, weights["W2"]) @ weights["W3"],
                               rtol=1e-12, atol=1e-12)


def test_network_11_trained_in_plain_torch(data):
    X, Y = data
    U1, U2 = sample_gates(H, n, d, seed=3)
    P = ct.make_problem(X, Y, program=12, beta=1.0, U1=U1, U2=U2)
    P = P.with_beta(0.1 * P.beta_max())
    gate = np.arange(6) % H
    weights, value = train_attention(X, Y, P.beta, m=6, gates=(gate_mask(X, U1, U2), gate))
    cert = check(P, weights, value)
    assert cert.network == "(11)" and cert.program == 12


@pytest.mark.slow
def test_network_5_trained_in_plain_torch(data):
    X, _ = data
    Y = X[:, :, :2] @ np.array([[1.0, 0.5], [-0.5, 1.0]]) + 0.1 * np.roll(X[:, :, :2], 1, axis=1)
    P = ct.make_problem(X, Y, program="mhsa", beta=1.0)
    P = P.with_beta(0.1 * P.beta_max())
    weights, value = train_mhsa(X, Y, P.beta, m=3)
    cert = check(P, weights, value)
    assert cert.network == "(5)" and cert.program == "mhsa" and cert.Z.shape == (d * d, d * 2)


def test_the_package_modules_certify_as_their_weights(data):
    from cvxtransformer.nn.mhsa import LinearMHSA
    from cvxtransformer.nn.networks import SoftmaxAttention
    from cvxtransformer.nn.trainer import train

    X, Y = data
    P = ct.make_problem(X, Y, program=12, beta=1.0, gates=H, gate_seed=1)
    P = P.with_beta(0.2 * P.beta_max())
    from cvxtransformer.nn.networks import GatedAttention

    net = train(GatedAttention(n, d, c, 4, P.program.U1, P.program.U2), X, P.T, "squared", P.beta, steps=30).network
    a, b = ct.certify_network(P, net), ct.certify_network(P, net.to_weights())
    assert a.objective == pytest.approx(b.objective, rel=1e-12) and a.lower_bound == pytest.approx(b.lower_bound)
    np.testing.assert_allclose(a.Z, net.effective_coefficients().reshape(P.program.shape))
    other = GatedAttention(n, d, c, 4, *sample_gates(H, n, d, seed=7))  # not the problem's gates
    with pytest.raises(ct.InvalidInputError, match="network: expected outputs equal to those of program"):
        ct.certify_network(P, other)
    mhsa = ct.make_problem(X, Y, program="mhsa", beta=1.0)
    with pytest.raises(ct.InvalidInputError, match="network: expected outputs equal"):  # pooled vs per-token
        ct.certify_network(mhsa, LinearMHSA(n, d, n * c, 2, pooled=False))
    for softmax in (SoftmaxAttention(n, d, c), SoftmaxAttention(n, d, c).arrays()):
        with pytest.raises(ct.InvalidInputError, match=r"softmax attention \(3\) is not covered"):
            ct.certify_network(P, softmax)


@pytest.mark.parametrize("bad, match", [
    (dict(W1=np.full((2, 4), 0.3), W2=np.ones((2, 3)), W3=np.ones((2, 2))), "weights.W1: expected attention rows on"),
    (dict(W1=np.full((2, 4), 0.25), W2=np.ones((2, 2)), W3=np.ones((2, 2))), "weights: expected W1, W2, W3 of shapes"),
    (dict(W1=np.full((2, 4), 0.25), W2=np.ones((2, 3)), W3=np.ones((2, 2)), gate=np.zeros(2, int)), "weights.gate"),
    (dict(W1=np.ones((2, 3, 3)), W2=np.ones((2, 3, 2))), r"weights: expected AttentionHeads .* got MHSAHeads"),
    (dict(V=np.ones(2)), "network: expected a dict with W1, W2, W3"),
    ("net", "network: expected AttentionHeads"),
])
def test_weights_outside_the_family_are_refused(data, bad, match):
    X, Y = data
    P = ct.make_problem(X, Y, program=10, beta=1.0)
    with pytest.raises(ct.InvalidInputError, match=match):
        ct.certify_network(P, bad)


def test_forward_map_inverts_invert(data):
    """weights -> Z -> weights -> Z is the identity on Z, for every reduction and form."""
    X, Y = data
    rng = np.random.default_rng(0)
    U1, U2 = sample_gates(H, n, d, seed=3)
    for program in (8, 10, 12):
        y = Y[:, 0] if program == 8 else Y
        P = ct.make_problem(X, y, program=program, beta=1.0, U1=U1 if program == 12 else None,
                            U2=U2 if program == 12 else None)
        m = 7
        heads = AttentionHeads(W1=rng.dirichlet(np.ones(n), size=m), W2=rng.standard_normal((m, d)),
                               W3=rng.standard_normal((m, P.program.n_outputs)),
                               gate=rng.integers(0, H, m) if program == 12 else None)
        Z = P.reduction.coefficients(P, heads)
        assert Z.shape == P.program.shape
        for form in ("balanced", "lemma1"):
            again = P.reduction.coefficients(P, ct.recover_weights(P, Z, form))
            np.testing.assert_allclose(again, Z, rtol=1e-13, atol=1e-14)
    P = ct.make_problem(X, X[:, :, :2], program="mhsa", beta=1.0)
    heads = MHSAHeads(W1=rng.standard_normal((2, d, d)), W2=rng.standard_normal((2, d, 2)))
    Z = P.reduction.coefficients(P, heads)
    back = ct.recover_weights(P, Z)
    assert back.heads == 2  # rank(Z) = 2 heads
    np.testing.assert_allclose(P.reduction.coefficients(P, back), Z, atol=1e-12 * np.abs(Z).max())


# ----------------------------------------------------------------------------- issue #33: outside the family
def unit_lemma1(weights):
    """Lemma-1 heads with unit value vectors, the outputs of ``weights`` (w_2 / ||w_2||, w_3 ||w_2||)."""
    r = np.linalg.norm(weights["W2"], axis=1)
    return AttentionHeads(weights["W1"], weights["W2"] / r[:, None], weights["W3"] * r[:, None], form="lemma1")


def test_issue33_lemma1_heads_with_rescaled_value_vectors(data):
    """W2 * 1e3, W3 / 1e3 (the same outputs) used to give a bound 15.1 above the objective 2.27."""
    X, Y = data
    P = ct.make_problem(X, Y, program=10, beta=1.0)
    P = P.with_beta(0.1 * P.beta_max())
    weights, _ = train_attention(X, Y, P.beta, m=5)
    unit = unit_lemma1(weights)
    by_hand = (0.5 * np.sum((np.einsum("jk,ikd,jd->ij", unit.W1, X, unit.W2) @ unit.W3 - Y) ** 2)
               + P.beta * np.abs(unit.W3).sum())                 # Lemma 1's penalty at unit value vectors
    base = ct.certify_network(P, unit)
    assert base.objective == pytest.approx(by_hand, rel=1e-12)
    for scale in (1e3, 1e-3, 7.0):
        scaled = AttentionHeads(unit.W1, unit.W2 * scale, unit.W3 / scale, form="lemma1")
        cert = ct.certify_network(P, scaled)
        assert cert.lower_bound <= cert.objective
        assert cert.objective == pytest.approx(base.objective, rel=1e-12)
        assert cert.gap == pytest.approx(base.gap, rel=1e-6, abs=1e-9 * base.objective)
        assert cert.lower_bound == cert.certificate.dual_objective
    # the same heads in the balanced form carry their own (larger) penalty, never below the bound
    balanced = ct.certify_network(P, dict(W1=unit.W1, W2=unit.W2 * 1e3, W3=unit.W3 / 1e3))
    assert balanced.lower_bound <= balanced.objective and balanced.objective > 1e5


@pytest.mark.parametrize("program, heads", [
    (10, dict(W1=np.full((2, n), 1 / n), W2=np.ones((2, d)), W3=np.ones((2, c)), form="Lemma1")),
    (10, AttentionHeads(W1=np.full((2, n), 1 / n), W2=np.ones((2, d)), W3=np.ones((2, c)), form="unit")),
    ("mhsa", dict(W1=np.ones((2, d, d)), W2=np.ones((2, d, c)), form="lemma1")),
    ("gated_mhsa", dict(W1=np.ones((2, d, d)), W2=np.ones((2, d, c)), gate=np.zeros(2, int), form=None)),
])
def test_issue33_unknown_form_is_refused_naming_the_forms(data, program, heads):
    X, Y = data
    P = ct.make_problem(X, X[:, :, :c] if program != 10 else Y, program=program, beta=1.0,
                        **({"gates": 2} if program == "gated_mhsa" else {}))
    allowed = r"\('balanced', 'lemma1'\)" if program == 10 else r"\('balanced',\)"
    with pytest.raises(ct.InvalidInputError, match=r"weights.form: expected one of " + allowed):
        ct.certify_network(P, heads)
    weights = heads if not isinstance(heads, dict) else P.reduction.invert(P, np.zeros(P.program.shape))
    if isinstance(heads, dict):
        weights.form = heads["form"]
    with pytest.raises(ct.InvalidInputError, match="weights.form"):
        ct.nonconvex_objective(P, weights)


def gated_mhsa_by_hand(X, W1, W2, gate, Hg):
    """Outputs sum_j (D_g(j)(X_i) * (X_i W1j X_i^T)) X_i W2j per token, D_g[t, s] = 1[x_t^T H_g x_s >= 0]."""
    out = np.zeros(X.shape[:2] + (W2.shape[2],))
    for j in range(len(W1)):
        mask = np.einsum("ita,ab,isb->its", X, Hg[gate[j]], X) >= 0
        scores = np.einsum("ita,ak,isk->its", X, W1[j], X) * mask
        out += scores @ X @ W2[j]
    return out


def test_issue33_gated_mhsa_heads_are_certified(data):
    from cvxtransformer.nn.mhsa import GatedMHSA

    X, _ = data
    Y = X[:, :, :c] @ np.array([[1.0, 0.5], [-0.5, 1.0]]) + 0.1 * np.roll(X[:, :, :c], 1, axis=1)
    P = ct.make_problem(X, Y, program="gated_mhsa", beta=1.0, gates=2, gate_seed=4)
    P = P.with_beta(0.1 * P.beta_max())
    solved = ct.solve(P, "clarabel", tol=1e-9)
    exact, heads = solved.certificate, ct.recover_weights(P, solved.Z)
    heads.W2 = 0.8 * heads.W2                                     # off the optimum: a positive gap
    by_hand = (0.5 * np.sum((gated_mhsa_by_hand(X, heads.W1, heads.W2, heads.gate, P.program.H) - Y) ** 2)
               + P.beta / 2 * (np.sum(heads.W1 ** 2) + np.sum(heads.W2 ** 2)))
    certs = [ct.certify_network(P, heads), ct.certify_network(P, dict(W1=heads.W1, W2=heads.W2, gate=heads.gate)),
             ct.certify_network(P, GatedMHSA.from_weights(heads, P.program.H, n))]
    for cert in certs:
        assert cert.network == "(gated MHSA)" and cert.program == "gated_mhsa"
        assert cert.objective == pytest.approx(by_hand, rel=1e-10)
        assert cert.lower_bound == cert.certificate.dual_objective <= cert.objective
        assert cert.lower_bound <= exact.primal_objective * (1 + 1e-9)
        assert cert.gap >= cert.objective - exact.primal_objective - 1e-9 * exact.primal_objective > 0
    with pytest.raises(ct.InvalidInputError, match="weights: expected GatedMHSAHeads"):
        ct.certify_network(P, dict(W1=heads.W1, W2=heads.W2))


def test_issue33_every_family_bound_below_objective_for_any_scaling(data):
    """Random heads of every family, at any rescaling that keeps the outputs: lower_bound <= objective."""
    X, Y = data
    rng = np.random.default_rng(5)
    U1, U2 = sample_gates(H, n, d, seed=3)
    cases = [(8, Y[:, 0], {}), (10, Y, {}), (12, Y, dict(U1=U1, U2=U2)), ("mhsa", X[:, :, :c], {}),
             ("gated_mhsa", X[:, :, :c], dict(gates=2))]
    for program, y, options in cases:
        P = ct.make_problem(X, y, program=program, beta=1.0, **options)
        P = P.with_beta(0.3 * P.beta_max())
        for scale in (1e-3, 1.0, 1e3):
            if program in (8, 10, 12):
                m, out = 3, P.program.n_outputs
                W1, W2 = rng.dirichlet(np.ones(n), size=m), rng.standard_normal((m, d))
                W3 = rng.standard_normal((m, out))
                gate = rng.integers(0, H, m) if program == 12 else None
                variants = [AttentionHeads(W1, W2 * scale, W3 / scale, gate, form) for form in ("balanced", "lemma1")]
            else:
                W1, W2 = 0.3 * rng.standard_normal((2, d, d)), 0.3 * rng.standard_normal((2, d, c))
                variants = [dict(W1=W1 * scale, W2=W2 / scale, **({"gate": np.array([0, 1])} if options else {}))]
            for heads in variants:
                cert = ct.certify_network(P, heads, refine_time=2.0)
                assert cert.lower_bound <= cert.objective, (program, scale)
                assert cert.gap >= 0 and cert.certificate.primal_objective <= cert.objective * (1 + 1e-12)


def test_issue33_a_bound_above_the_objective_raises_never_a_negative_gap():
    from cvxtransformer.verify import _checked_bound

    with pytest.raises(ct.InvalidInputError, match="network: its objective 2.27 is below the certified lower bound"):
        _checked_bound(15.1, 2.27, "the penalty")
    assert _checked_bound(2.27 * (1 + 1e-13), 2.27, "") == 2.27       # rounding: a gap of 0
    assert _checked_bound(1.5, 2.27, "") == 1.5
