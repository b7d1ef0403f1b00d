"""Programs "10wd" and "12wd": networks (9) and (11) with ordinary weight decay, a nuclear norm per token
(docs/conventions.md, the last section). Every number is checked against an independent CVXPY formulation
written here (``cp.normNuc`` of each token's c x d matrix), beta_max against its definition computed from X and
the targets, and the networks against their own objective written here in plain torch. The generic grids
(test_solvers.py, test_builders.py, test_certificate.py, test_refine.py, test_fista.py, test_distributed.py,
test_out_of_core.py) cover both programs too: their CASES include them."""
import json
import warnings

import cvxpy as cp
import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.core.attention import AttentionHeads
from cvxtransformer.core.errors import InvalidInputError
from cvxtransformer.core.regularizers import GroupLasso, TokenNuclearNorm
from cvxtransformer.testing import check_gap, check_kkt, check_recovery, check_strong_duality


def _data(seed=0, N=60, n=4, d=3, c=3, loss="squared", rank_one=True):
    """Targets from a teacher whose token matrices are rank one and spread over the c outputs (where a
    nuclear norm and a sum of group norms differ most), plus noise; class labels for cross-entropy."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, n, d))
    B = np.einsum("kl,ke->kle", rng.standard_normal((n, c)), rng.standard_normal((n, d)))  # (n, c, d), rank 1 each
    if not rank_one:
        B = rng.standard_normal((n, c, d))
    B[1:] *= rng.random((n - 1, 1, 1)) < 0.6
    Y = np.einsum("ikd,kld->il", X, B) + 0.3 * rng.standard_normal((N, c))
    return X, (np.argmax(Y, axis=1) if loss == "cross_entropy" else Y)


def reference(problem):
    """p* of the program written directly in CVXPY: ``Z_j (c, n d)`` per gate j, ``yhat_i = sum_j M_ij Z_j x_i``,
    ``beta sum_{j,k} ||Z_j[:, k d:(k+1) d]||_*``; the loss from its definition (summed)."""
    X, T, beta = problem.program.X, problem.T, problem.beta
    N, n, d = X.shape
    c = T.shape[1]
    M = problem.program.mask if problem.program.mask is not None else np.ones((N, 1))
    Z = [cp.Variable((c, n * d)) for _ in range(M.shape[1])]
    Xf = X.reshape(N, n * d)
    yhat = sum(cp.multiply(np.repeat(M[:, [j]], c, axis=1), Xf @ Zj.T) for j, Zj in enumerate(Z))
    if problem.loss.name == "squared":
        loss = 0.5 * cp.sum_squares(yhat - T)
    else:  # cross-entropy, T one-hot
        loss = cp.sum(cp.log_sum_exp(yhat, axis=1)) - cp.sum(cp.multiply(T, yhat))
    penalty = beta * sum(cp.normNuc(Zj[:, k * d:(k + 1) * d]) for Zj in Z for k in range(n))
    prob = cp.Problem(cp.Minimize(loss + penalty))
    with warnings.catch_warnings():  # "Solution may be inaccurate" at tolerances near float64's rounding
        warnings.simplefilter("ignore")
        prob.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, max_iter=500)
    return prob.value


def beta_max_by_definition(problem):
    """``max_{j,k} ||sum_i M_ij V_i x_ik^T||_2`` at ``V = -grad L(0)`` (squared: T; cross-entropy: T - 1/c)."""
    X, T = problem.program.X, problem.T
    V = T if problem.loss.name == "squared" else T - 1.0 / T.shape[1]
    M = problem.program.mask if problem.program.mask is not None else np.ones((len(X), 1))
    blocks = np.einsum("ij,il,ike->jkle", M, V, X)  # (h, n, c, d)
    return max(np.linalg.norm(B, 2) for B in blocks.reshape(-1, *blocks.shape[2:]))


def problem_of(program, loss, kind="vector", seed=0, frac=0.2, **kw):
    X, Y = _data(seed, loss=loss)
    if kind == "sequence":
        Y = np.random.default_rng(seed).standard_normal((len(X), X.shape[1], 2))
    gates = {}
    if program == "12wd":
        rng = np.random.default_rng(seed + 7)
        gates = dict(U1=rng.standard_normal((3, X.shape[1])), U2=rng.standard_normal((3, X.shape[2])))
    P = ct.make_problem(X, Y, program=program, loss=loss, beta=1.0, **gates, **kw)
    return P.with_beta(frac * P.beta_max())


GRID = [("10wd", "squared", "vector"), ("10wd", "squared", "sequence"), ("10wd", "cross_entropy", "vector"),
        ("12wd", "squared", "vector"), ("12wd", "cross_entropy", "vector")]
SOLVES = [("clarabel", "primal"), ("clarabel", "dual"), ("scs", "primal"), ("scs", "dual"), ("fista", "primal")]


@pytest.fixture(scope="module")
def references():
    return {case: (problem_of(*case), reference(problem_of(*case))) for case in GRID}


@pytest.mark.parametrize("solver,form", SOLVES, ids=lambda v: v)
@pytest.mark.parametrize("case", GRID, ids=lambda c: "-".join(c))
def test_every_loss_solver_and_form_reaches_the_independent_optimum(references, case, solver, form):
    problem, p_star = references[case]
    result = ct.solve(problem, solver, form=form, tol=1e-8)
    cert = result.certificate
    assert abs(cert.primal_objective - p_star) <= 1e-6 * p_star, (cert.primal_objective, p_star)
    assert cert.dual_objective <= p_star * (1 + 1e-9)  # a certified lower bound is below the independent optimum
    check_gap(problem, result, 1e-8)
    check_kkt(result, 1e-3, 1e-4)
    check_recovery(problem, result, rtol=1e-9)
    # heads = the ranks of the token matrices summed, recomputed here from Z
    Z4 = result.Z.reshape(problem.program.canonical_shape)
    ranks = [np.linalg.matrix_rank(Z4[j, :, k, :]) for j in range(Z4.shape[0]) for k in range(Z4.shape[2])]
    assert cert.support_size == cert.heads_recovered == sum(ranks) >= 1


def test_the_dual_program_attains_the_primal_optimum():
    problem = problem_of("12wd", "cross_entropy")
    check_strong_duality(problem, ct.solve(problem, "clarabel", tol=1e-9), ct.solve(problem, "clarabel", "dual", tol=1e-9),
                         1e-7)


def test_direct_formulation_and_float32_fista_agree():
    problem, p_star = problem_of("10wd", "squared"), None
    p_star = reference(problem)
    direct = ct.solve(problem, "clarabel", tol=1e-9, formulation="direct")
    assert direct.formulation == "direct" and abs(direct.certificate.primal_objective - p_star) <= 1e-7 * p_star
    single = ct.solve(problem, "fista", tol=1e-5, dtype="float32")
    assert single.certified and single.certificate.primal_objective - p_star <= 1.1e-5 * p_star


@pytest.mark.parametrize("program,loss", [("10wd", "squared"), ("10wd", "cross_entropy"), ("12wd", "squared")])
def test_beta_max_is_exact(program, loss):
    problem = problem_of(program, loss)
    bm = problem.beta_max()
    assert bm == pytest.approx(beta_max_by_definition(problem), rel=1e-12)
    above = problem.with_beta(bm * (1 + 1e-9))  # Z = 0 is optimal: certified from Z = 0 alone, gap 0
    cert = ct.certify(above, np.zeros(problem.program.shape), refine=False)
    assert cert.certified and cert.duality_gap <= 1e-12 * cert.primal_objective and cert.kkt_dual_feasibility == 0
    below = ct.solve(problem.with_beta(bm * (1 - 1e-3)), "clarabel", tol=1e-9)  # the top direction enters
    assert below.certified and below.certificate.support_size >= 1
    assert below.certificate.primal_objective < cert.primal_objective


def test_with_one_output_it_is_program_10():
    X, Y = _data(3)
    y = Y[:, :1]
    wd, ten = (ct.make_problem(X, y, program=p, beta=1.0) for p in ("10wd", 10))
    assert wd.beta_max() == pytest.approx(ten.beta_max(), rel=1e-15)
    wd, ten = wd.with_beta(0.3 * wd.beta_max()), ten.with_beta(0.3 * ten.beta_max())
    Z = np.random.default_rng(4).standard_normal(ten.program.shape)
    assert wd.primal_objective(Z) == pytest.approx(ten.primal_objective(Z), rel=1e-14)
    a, b = ct.solve(wd, "clarabel", tol=1e-10), ct.solve(ten, "clarabel", tol=1e-10)
    assert abs(a.certificate.primal_objective - b.certificate.primal_objective) <= 1e-9 * b.certificate.primal_objective
    np.testing.assert_allclose(a.Z, b.Z, atol=1e-6)
    # the regulariser itself: one row per token matrix is a group norm
    assert TokenNuclearNorm(2.0).value(Z) == pytest.approx(GroupLasso(2.0).value(Z), rel=1e-14)


def test_token_nuclear_norm_against_numpy():
    rng = np.random.default_rng(5)
    Z = rng.standard_normal((2, 3, 4, 5))  # (h, c, n, d)
    reg = TokenNuclearNorm(0.7)
    mats = [Z[j, :, k, :] for j in range(2) for k in range(4)]
    assert reg.value(Z) == pytest.approx(0.7 * sum(np.linalg.svd(M, compute_uv=False).sum() for M in mats), rel=1e-13)
    assert reg.dual_norm(Z) == pytest.approx(max(np.linalg.norm(M, 2) for M in mats), rel=1e-13)
    step = 0.9
    prox = reg.prox(Z, step)
    for j in range(2):
        for k in range(4):
            U, s, Wh = np.linalg.svd(Z[j, :, k, :], full_matrices=False)
            np.testing.assert_allclose(prox[j, :, k, :], (U * np.maximum(s - 0.63, 0)) @ Wh, atol=1e-13)
    assert reg.rank(prox) == sum(int(np.sum(np.linalg.svd(M, compute_uv=False) > 0.63)) for M in mats)


def test_recovered_heads_are_the_svd_of_each_token_matrix():
    problem = problem_of("12wd", "squared", frac=0.1)
    Z = ct.solve(problem, "clarabel", tol=1e-9).Z
    for form in ("balanced", "lemma1"):
        heads = ct.recover_weights(problem, Z, form)
        assert heads.heads == problem.regularizer.rank(Z) and heads.gate is not None
        assert np.all(heads.W1.sum(axis=1) == 1) and set(np.unique(heads.W1)) <= {0.0, 1.0}
        np.testing.assert_allclose(problem.reduction.coefficients(problem, heads), Z, atol=1e-12)
        assert ct.nonconvex_objective(problem, heads) == pytest.approx(problem.primal_objective(Z), rel=1e-11)
    balanced = ct.recover_weights(problem, Z)
    np.testing.assert_allclose(np.linalg.norm(balanced.W2, axis=1), np.linalg.norm(balanced.W3, axis=1), rtol=1e-12)


# ---- networks trained with ordinary weight decay, in plain torch -------------------------------------------

class PlainNetwork(torch.nn.Module):
    """Network (9w) as a user writes it: softmax attention rows over the tokens, value and output vectors."""

    def __init__(self, n, d, c, heads, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.nn.Parameter(torch.randn(heads, n, generator=g, dtype=torch.float64))
        self.W2 = torch.nn.Parameter(torch.randn(heads, d, generator=g, dtype=torch.float64) / d ** 0.5)
        self.W3 = torch.nn.Parameter(torch.randn(heads, c, generator=g, dtype=torch.float64) / heads ** 0.5)

    def forward(self, X):
        W1 = torch.softmax(self.logits, dim=1)
        return torch.einsum("jk,ikd,jd->ij", W1, X, self.W2) @ self.W3

    def objective(self, X, Y, beta):  # the summed squared loss and ordinary weight decay on W2, W3
        return 0.5 * torch.sum((self(X) - Y) ** 2) + 0.5 * beta * (torch.sum(self.W2 ** 2) + torch.sum(self.W3 ** 2))


def _train(X, Y, beta, heads, seed, steps=800):
    net = PlainNetwork(X.shape[1], X.shape[2], Y.shape[1], heads, seed)
    Xt, Yt = torch.as_tensor(X), torch.as_tensor(Y)
    # torch's Adam with weight_decay: the gradient of the summed loss plus beta/2 ||W||^2 (no decay on the logits)
    opt = torch.optim.Adam([{"params": [net.logits], "weight_decay": 0.0},
                            {"params": [net.W2, net.W3], "weight_decay": beta}], lr=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny products: threads only contend
    try:
        for _ in range(steps):
            opt.zero_grad()
            loss = 0.5 * torch.sum((net(Xt) - Yt) ** 2)
            loss.backward()
            opt.step()
            sched.step()
    finally:
        torch.set_num_threads(threads)
    return net


@pytest.fixture(scope="module")
def instance():
    X, Y = _data(11, N=120, n=4, d=3, c=3)
    ten = ct.make_problem(X, Y, program=10, beta=1.0)
    ten = ten.with_beta(0.1 * ten.beta_max())
    wd = ct.make_problem(X, Y, program="10wd", beta=ten.beta)
    return X, Y, ten, wd, ct.solve(ten, "clarabel", tol=1e-10), ct.solve(wd, "clarabel", tol=1e-10)


def _check_plain_network(instance, seed):
    X, Y, ten, wd, sol10, solwd = instance
    p_wd, p_10 = solwd.certificate.primal_objective, sol10.certificate.primal_objective
    net = _train(X, Y, wd.beta, heads=2 * solwd.certificate.support_size, seed=seed)
    with torch.no_grad():
        own = float(net.objective(torch.as_tensor(X), torch.as_tensor(Y), wd.beta))
    weights = {"W1": torch.softmax(net.logits, dim=1), "W2": net.W2, "W3": net.W3}  # tensors that require grad
    cert = ct.certify_network(wd, weights)
    assert cert.network == "(9w)" and cert.objective == pytest.approx(own, rel=1e-12)  # the user's own objective
    assert cert.lower_bound <= own and cert.gap >= own - p_wd - 1e-9 * p_wd
    assert own >= p_wd * (1 - 1e-9) and own <= 1.01 * p_wd, (own, p_wd)
    # measured against program (10) the same network is below its optimum: (10) does not bound (9w)
    assert own < p_10, (own, p_10)
    return own


def test_ordinary_weight_decay_in_plain_torch_is_bounded_by_10wd_not_by_10(instance):
    X, Y, ten, wd, sol10, solwd = instance
    assert solwd.certificate.primal_objective < sol10.certificate.primal_objective * (1 - 1e-3)
    _check_plain_network(instance, 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_ordinary_weight_decay_five_seeds(instance, seed):
    _check_plain_network(instance, seed)


def test_certify_network_takes_heads_dicts_and_tensors(instance):
    X, Y, ten, wd, sol10, solwd = instance
    rng = np.random.default_rng(0)
    W1 = rng.dirichlet(np.ones(4), size=5)
    W2, W3 = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    Yhat = np.einsum("jk,ikd,jd->ij", W1, X, W2) @ W3
    own = 0.5 * np.sum((Yhat - Y) ** 2) + 0.5 * wd.beta * (np.sum(W2 ** 2) + np.sum(W3 ** 2))
    for given in (AttentionHeads(W1, W2, W3), dict(W1=W1, W2=W2, W3=W3),
                  {k: torch.tensor(v, requires_grad=True) for k, v in dict(W1=W1, W2=W2, W3=W3).items()}):
        cert = ct.certify_network(wd, given)
        assert cert.objective == pytest.approx(own, rel=1e-12) and cert.heads == 5
        assert cert.lower_bound <= solwd.certificate.primal_objective and "||w_3j||_2^2" in cert.penalty
    # against program (10) the certificate states its penalty and points to the weight-decay program
    cert10 = ct.certify_network(ten, dict(W1=W1, W2=W2, W3=W3))
    assert "||w_3j||_1^2" in cert10.penalty and "10wd" in cert10.penalty
    assert cert10.objective > own  # its l1-squared penalty is larger than the user's


def test_a_weight_decay_module_measured_against_program_10_is_refused_naming_the_penalty(instance):
    from cvxtransformer.nn.networks import WeightDecayAttention

    X, Y, ten, wd, sol10, solwd = instance
    net = WeightDecayAttention.from_weights(ct.recover_weights(wd, solwd.Z))  # the optimum of (9w): below p*(10)
    assert ct.certify_network(wd, net).gap == pytest.approx(solwd.certificate.duality_gap, abs=1e-7)
    with pytest.raises(InvalidInputError, match=r"^network: its objective .* is below the certified lower bound .*"
                                                r"\|\|w_3j\|\|_1\^2.*10wd"):
        ct.certify_network(ten, net)


def test_certify_network_bad_weights(instance):
    X, Y, ten, wd, sol10, solwd = instance
    W1, W2, W3 = np.full((2, 4), 0.25), np.ones((2, 3)), np.ones((2, 3))
    cases = [(dict(W1=W1, W2=W2, W3=np.ones((2, 2))), "weights"),        # W3 of the wrong width
             (dict(W1=W1 + 0.1, W2=W2, W3=W3), "weights.W1"),              # rows off the simplex
             (dict(W1=W1, W2=np.full((2, 3), np.nan), W3=W3), "weights.W2")]  # NaN
    for weights, name in cases:
        with pytest.raises(InvalidInputError) as err:
            ct.certify_network(wd, weights)
        assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)
    gated = ct.make_problem(X, Y, program="12wd", beta=wd.beta, gates=2)
    with pytest.raises(InvalidInputError, match=r"^weights.gate: expected each head's gate"):
        ct.certify_network(gated, dict(W1=W1, W2=W2, W3=W3))  # a 12wd dict without gates
    cert = ct.certify_network(gated, dict(W1=W1, W2=W2, W3=W3, gate=np.array([0, 1])))
    assert cert.network == "(11w)" and cert.lower_bound <= cert.objective


def test_logistic_loss_is_refused_naming_programs_8_and_12():
    X, Y = _data(0)
    for program in ("10wd", "12wd"):
        with pytest.raises(InvalidInputError, match=r"^loss: .*use program 8 or 12"):
            ct.make_problem(X, np.sign(Y[:, 0]), program=program, loss="logistic", beta=1.0)


def test_networks_9w_and_11w_load_the_recovered_heads_exactly():
    from cvxtransformer.nn.networks import GatedWeightDecayAttention, WeightDecayAttention

    problem = problem_of("12wd", "squared", frac=0.1)
    result = ct.solve(problem, "clarabel", tol=1e-9)
    heads = ct.recover_weights(problem, result.Z, "lemma1")
    net = GatedWeightDecayAttention.from_weights(heads, problem.program.U1, problem.program.U2)
    value = float(net.objective(net.encode_inputs(problem.program.X), problem.T, "squared", problem.beta).detach())
    assert value == pytest.approx(result.certificate.primal_objective, rel=1e-11)
    flat = problem_of("10wd", "cross_entropy", frac=0.1)
    solved = ct.solve(flat, "clarabel", tol=1e-9)
    net = WeightDecayAttention.from_weights(ct.recover_weights(flat, solved.Z))
    value = float(net.objective(net.encode_inputs(flat.program.X), flat.T, "cross_entropy", flat.beta).detach())
    assert value == pytest.approx(solved.certificate.primal_objective, rel=1e-11)
    assert ct.certify_network(flat, net).gap == pytest.approx(solved.certificate.duality_gap, abs=1e-7)


def test_compare_trains_ordinary_weight_decay_by_default_with_several_outputs():
    X, Y = _data(2, N=80)
    P = ct.make_problem(X, Y, program=10, beta=1.0)
    P = P.with_beta(0.2 * P.beta_max())
    out = ct.compare(P, steps=200)
    assert set(out.models) == {"alternative_wd", "softmax"} and set(out.solutions) == {10, "10wd"}
    run = out.models["alternative_wd"]
    support = out.solutions["10wd"].certificate.support_size
    assert run.network.heads == support  # the optimum's support: the ranks of its token matrices, summed
    assert run.certified_lower_bound == out.solutions["10wd"].certificate.dual_objective <= run.objective
    one = ct.compare(ct.make_problem(X, Y[:, 0], program=10, beta=P.beta), steps=20)
    assert set(one.models) == {"alternative", "softmax"}  # one output: the two penalties coincide
    named = ct.compare(P, models="alternative", steps=20)  # the l1-squared network by name, bounded by (10)
    assert named.models["alternative"].certified_lower_bound == named.solutions[10].certificate.dual_objective


def test_estimators_and_path_take_the_weight_decay_programs():
    pytest.importorskip("sklearn")
    X, Y = _data(6)
    est = ct.ConvexRegressor(program="10wd", beta_frac=0.2).fit(X, Y)
    P = ct.make_problem(X, Y, program="10wd", beta_frac=0.2)
    assert est.certificate_.primal_objective == pytest.approx(reference(P), rel=1e-6)
    points = ct.solve_path(P, n_betas=4)
    assert all(p.result.certified for p in points) and points[0].result.certificate.support_size == 0
    last = points[-1]
    assert last.result.certificate.primal_objective == pytest.approx(reference(P.with_beta(last.beta)), rel=1e-6)


def test_command_line_solve_and_verify(tmp_path, capsys):
    X, Y = _data(8)
    rng = np.random.default_rng(1)
    U1, U2 = rng.standard_normal((2, X.shape[1])), rng.standard_normal((2, X.shape[2]))
    data = tmp_path / "d.npz"
    np.savez(data, X=X, y=Y, U1=U1, U2=U2)
    out = tmp_path / "r.npz"
    args = ["--program", "12wd", "--loss", "squared", "--beta-frac", "0.2"]
    assert main(["solve", str(data), *args, "--solver", "fista", "--out", str(out), "--json"]) == 0
    solved = json.loads(capsys.readouterr().out)
    P = ct.make_problem(X, Y, program="12wd", beta=1.0, U1=U1, U2=U2).with_beta_frac(0.2)
    assert solved["program"] == "12wd" and abs(solved["primal_objective"] - reference(P)) <= 1e-6 * reference(P)
    assert np.load(out)["Z"].shape == (2, 3, 4, 3)
    assert main(["verify", str(data), str(out), *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["certified"]
    assert main(["solve", str(data), "--program", "10wd", "--loss", "logistic", "--beta", "1"]) == 2
    assert "use program 8 or 12" in capsys.readouterr().err


def test_networks_take_heads_as_torch_gives_them():
    """The package's networks load heads from float32 tensors that require grad (a softmax's rows are within
    float32's rounding of the simplex: projected, not refused) and compute their objective in float64."""
    from cvxtransformer.nn.networks import GatedWeightDecayAttention, WeightDecayAttention

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 4, generator=g, requires_grad=True)  # float32, torch's default
    W2, W3 = torch.randn(5, 3, generator=g, requires_grad=True), torch.randn(5, 2, generator=g, requires_grad=True)
    heads = AttentionHeads(torch.softmax(logits, dim=1), W2, W3)
    net = WeightDecayAttention.from_weights(heads)
    assert net.W1.dtype == torch.float64
    np.testing.assert_allclose(net.W1.detach().sum(dim=1).numpy(), 1.0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(net.W2.detach().numpy(), W2.detach().double().numpy(), rtol=0, atol=0)
    X = np.random.default_rng(0).standard_normal((7, 4, 3))
    U1, U2 = np.ones((2, 4)), np.ones((2, 3))
    gated = GatedWeightDecayAttention.from_weights(AttentionHeads(heads.W1, W2, W3, gate=np.array([0, 1, 0, 1, 0])),
                                                   U1, U2)
    assert gated.heads == 5 and gated.encode_inputs(X)[1].shape == (7, 5)
