"""Program (6) of Sahiner et al. (linear multi-head self-attention, nuclear norm), end to end:
a closed-form optimum digit by digit, the index convention, recovery into network (5), Adam against
the certified bound, the path, the command line, and bad input. Solver x loss agreement, strong
duality, KKT and beta_max are in the grid of test_solvers.py (its CASES include "mhsa")."""
import json

import cvxpy as cp
import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.core.mhsa import LinearMHSAReduction
from cvxtransformer.nn.mhsa import LinearMHSA
from cvxtransformer.nn.trainer import train

from conftest import MHSA_CASES, case_id, random_problem

X1 = np.array([[[0.6, 0.8]]])  # one sample, one token, a unit vector: G = x x^T
Y1 = np.array([[[3.0, 4.0]]])   # sequence target (N, n, c) = (1, 1, 2), ||y|| = 5


def one_head_instance(beta=1.0):
    """P(Z) = 1/2 ||p^T Z Q - y||^2 + beta ||Z||_* with p = x (x) x and Q = x (x) I_c orthonormal, so the
    optimum is the nuclear-norm prox of the rank-one target p y^T Q^T: Z* = (1 - beta/||y||)_+ p y^T Q^T,
    P* = 1/2 (beta^2 if beta < ||y||) + beta (||y|| - beta), beta_max = ||y||."""
    x, y = X1[0, 0], Y1[0, 0]
    p = np.kron(x, x)                      # rows (k, a): x_k x_a
    Q = np.kron(x[:, None], np.eye(2))     # rows (l, b): x_l e_b
    w = max(0.0, 1 - beta / np.linalg.norm(y)) * y
    return ct.make_problem(X1, Y1, program="mhsa", beta=beta), np.outer(p, w) @ Q.T, w


def test_closed_form_one_head_one_sample_digit_by_digit():
    problem, Z_star, w = one_head_instance(beta=1.0)
    np.testing.assert_allclose(w, [2.4, 3.2], rtol=1e-15)
    assert problem.beta_max() == pytest.approx(5.0, rel=1e-15)
    # Z* = 0.8 p y^T Q^T, with p = (0.36, 0.48, 0.48, 0.64) and Q^T rows x (x) e_b
    np.testing.assert_allclose(Z_star[0], [0.36 * 2.4 * 0.6, 0.36 * 3.2 * 0.6, 0.36 * 2.4 * 0.8, 0.36 * 3.2 * 0.8],
                               rtol=1e-15)
    cert = ct.certify(problem, Z_star, refine=False)
    assert cert.primal_objective == pytest.approx(4.5, rel=1e-15)   # 1/2 (0.6^2 + 0.8^2) + 1 * 4
    assert abs(cert.duality_gap) <= 1e-14 and cert.support_size == 1
    np.testing.assert_allclose(cert.V, [[0.6, 0.8]], rtol=1e-14)   # V* = y - w
    assert cert.kkt_stationarity <= 1e-14 and cert.kkt_dual_feasibility == 0.0
    for solver, rtol in (("clarabel", 1e-7), ("scs", 1e-4), ("fista", 1e-9)):
        result = ct.solve(problem, solver, tol=1e-9 if solver != "scs" else 1e-6)
        np.testing.assert_allclose(result.Z, Z_star, rtol=rtol, atol=rtol)
        assert result.certificate.primal_objective == pytest.approx(4.5, rel=rtol)
    # recovery: one head W1 = 2 x x^T, W2 = 2 x (0.6, 0.8), and the network reproduces w
    heads = ct.recover_weights(problem, Z_star)
    assert heads.heads == 1
    W1, W2 = heads.W1[0], heads.W2[0]
    if W1[0, 0] < 0:  # the SVD's sign is arbitrary; the head is (W1, W2) or (-W1, -W2)
        W1, W2 = -W1, -W2
    np.testing.assert_allclose(W1, 2 * np.outer(X1[0, 0], X1[0, 0]), rtol=1e-14)
    np.testing.assert_allclose(W2, 2 * np.outer(X1[0, 0], [0.6, 0.8]), rtol=1e-14)
    assert 0.5 * (np.sum(W1 ** 2) + np.sum(W2 ** 2)) == pytest.approx(4.0, rel=1e-14)  # = ||Z*||_*
    # above beta_max: exactly zero
    problem0, Z0, _ = one_head_instance(beta=5.0)
    assert np.all(Z0 == 0) and np.all(ct.solve(problem0, "clarabel").Z == 0)


@pytest.mark.parametrize("pooled", [False, True])
def test_index_convention_one_head_is_x_w1_xt_x_w2(pooled):
    rng = np.random.default_rng(0)
    N, n, d, c = 6, 5, 3, 2
    X = rng.standard_normal((N, n, d))
    W1, W2 = rng.standard_normal((d, d)), rng.standard_normal((d, c))
    # SPEC.md: Z = u v^T with u[k*d + a] = W1[a, k], v[l*c + b] = W2[l, b]
    u = np.array([W1[a, k] for k in range(d) for a in range(d)])
    v = np.array([W2[l, b] for l in range(d) for b in range(c)])
    Z = np.outer(u, v)
    y = rng.standard_normal((N, c)) if pooled else rng.standard_normal((N, n, c))
    problem = ct.make_problem(X, y, program="mhsa", beta=1.0)
    assert problem.program.pooled == pooled
    f = np.stack([X[i] @ W1 @ X[i].T @ X[i] @ W2 for i in range(N)])  # (N, n, c)
    expected = f.mean(axis=1) if pooled else f.reshape(N, n * c)
    np.testing.assert_allclose(problem.program.forward(Z), expected, rtol=1e-12)
    # the block form of SPEC.md: Yhat_i = sum_{k,l} G_i[k,l] X_i Z^{(k,l)}
    i = 2
    G = X[i].T @ X[i]
    blocks = sum(G[k, l] * X[i] @ Z[k * d:(k + 1) * d, l * c:(l + 1) * c] for k in range(d) for l in range(d))
    np.testing.assert_allclose(blocks, f[i], rtol=1e-12)
    # <A Z, V> = <Z, A^T V>
    V = rng.standard_normal(expected.shape)
    assert np.sum(problem.program.forward(Z) * V) == pytest.approx(np.sum(Z * problem.program.adjoint(V)), rel=1e-12)
    # the network (5), in numpy and in torch, at this head
    heads = ct.MHSAHeads(W1[None], W2[None])
    np.testing.assert_allclose(LinearMHSAReduction.predict(X, heads, pooled), expected, rtol=1e-12)
    net = LinearMHSA.from_weights(heads, n, pooled=pooled)
    np.testing.assert_allclose(net(torch.tensor(X)).detach().numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(net.effective_coefficients(), Z, rtol=1e-14)


def test_cvxpy_design_matches_the_map():
    problem = random_problem("mhsa", "squared", "sequence", seed=5)
    Z = np.random.default_rng(1).standard_normal(problem.program.shape)
    expr = problem.program.cvxpy_forward(cp.Constant(Z))
    np.testing.assert_allclose(expr.value, problem.program.forward(Z), rtol=1e-12)


@pytest.mark.parametrize("case", MHSA_CASES, ids=case_id)
def test_recovered_network_in_numpy_and_torch_equals_P(case):
    problem = random_problem(*case, seed=3)
    result = ct.solve(problem, "clarabel", tol=1e-9)
    heads = ct.recover_weights(problem, result.Z)
    P = result.certificate.primal_objective
    assert heads.heads == problem.regularizer.rank(result.Z) >= 1
    assert ct.nonconvex_objective(problem, heads) == pytest.approx(P, rel=1e-9)
    p = problem.program
    net = LinearMHSA.from_weights(heads, p.n, pooled=p.pooled)
    value = net.objective(net.encode_inputs(p.X), problem.T, problem.loss, problem.beta).item()
    assert value == pytest.approx(P, rel=1e-9)
    np.testing.assert_allclose(net.effective_coefficients(), result.Z, atol=1e-10 * np.abs(result.Z).max())


@pytest.mark.slow
def test_adam_with_enough_heads_reaches_the_optimum_and_one_head_cannot():
    problem = random_problem("mhsa", "squared", "sequence", seed=7, N=30, n=3, d=3, frac=0.2)
    result = ct.solve(problem, "clarabel", tol=1e-9, refine=True)
    r = result.certificate.support_size
    assert r >= 2  # the instance needs two heads at least
    bound = result.certificate.dual_objective
    P_star = result.certificate.primal_objective
    p = problem.program
    runs = {}
    for heads in (1, 2 * r):
        net = LinearMHSA(p.n, p.d, problem.T.shape[1], heads, seed=0)
        runs[heads] = train(net, p.X, problem.T, "squared", problem.beta, lr=0.02, steps=3000)
        assert np.all(runs[heads].history.objective >= bound)  # P(Z*) bounds every network (5)
    assert runs[2 * r].objective <= 1.01 * P_star
    # one head: rank-one coefficients, whose convex objective is at most the network's (the bound's
    # argument), strictly above the optimum; the certified gap says so
    one = runs[1].objective
    Z1 = runs[1].network.effective_coefficients()
    assert problem.regularizer.rank(Z1) == 1
    assert problem.primal_objective(Z1) <= one + 1e-9
    assert one - bound >= 0.01 * P_star


def test_path_and_rank_screening_are_safe():
    problem = random_problem("mhsa", "cross_entropy", "classes", seed=8, N=60, n=4, d=3)
    path = ct.solve_path(problem, n_betas=5, ratio=0.1, tol=1e-8)
    assert np.all(path[0].result.Z == 0)
    for point in path:
        assert point.certified and point.n_blocks == problem.program.n_blocks
        reference = ct.solve(problem.with_beta(point.beta), "clarabel", tol=1e-9)
        rank = reference.certificate.support_size
        assert point.n_blocks - point.screened >= rank  # the proved rank bound holds at the optimum
        assert abs(point.result.certificate.primal_objective - reference.certificate.primal_objective) <= \
            1e-6 * abs(reference.certificate.primal_objective)
    assert any(point.screened > 0 for point in path)


@pytest.mark.slow
def test_command_line_solve_verify_compare(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4, 3))
    data = tmp_path / "d.npz"
    np.savez(data, X=X, y=rng.standard_normal((30, 4, 2)))
    out = tmp_path / "r.npz"
    args = ["--program", "mhsa", "--loss", "squared", "--beta-frac", "0.3"]
    assert main(["solve", str(data), *args, "--solver", "fista", "--out", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["program"] == "mhsa" and s["certified"] and s["support_size"] >= 1
    assert np.load(out)["Z"].shape == (9, 6)
    assert main(["verify", str(data), str(out), *args, "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["certified"] and v["primal_objective"] == pytest.approx(s["primal_objective"], rel=1e-14)
    run = tmp_path / "cmp"
    assert main(["compare", str(data), *args, "--steps", "200", "--out-dir", str(run), "--json", "--quiet"]) == 0
    c = json.loads(capsys.readouterr().out)
    r = c["convex"]["mhsa"]["support_size"]
    assert {m["heads"] for m in c["models"].values()} == {max(1, r - 1), r, 2 * r} - {0}
    for m in c["models"].values():
        assert m["bound_applies"] and m["certified_gap"] >= 0 and m["network"] == "(5)"
    assert (run / "singular_values.png").stat().st_size > 0 and (run / "objective.png").stat().st_size > 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(X=np.full((5, 3, 2), np.nan)), r"X: expected finite values"),
    (dict(X=np.zeros((0, 3, 2)), y=np.zeros((0, 3, 1))), r"X: expected non-empty"),
    (dict(y=np.zeros((5, 4, 1))), r"y: expected sequence targets of shape \(N, n=3, c\)"),
    (dict(y=np.zeros((4, 3, 1))), r"y: expected 5 targets"),
    (dict(loss="logistic", y=np.zeros(5)), r"y: expected labels in \{-1, \+1\}"),
    (dict(loss="cross_entropy", y=np.full(5, 0.5)), r"y: expected integer class labels"),
    (dict(beta=0.0), r"beta: expected a finite number > 0"),
    (dict(U1=np.zeros((2, 3)), U2=np.zeros((2, 2))), r"U1, U2: expected no gate vectors for program \(mhsa\)"),
])
def test_bad_input_for_the_mhsa_program(kwargs, match):
    args = dict(X=np.ones((5, 3, 2)), y=np.ones((5, 3, 1)), program="mhsa", loss="squared", beta=1.0)
    args.update(kwargs)
    with pytest.raises(ct.InvalidInputError, match=match):
        ct.make_problem(**args)


def test_bad_solutions_and_solvers_for_the_mhsa_program(monkeypatch):
    problem = random_problem("mhsa", "squared", "sequence")
    with pytest.raises(ct.InvalidInputError, match=r"Z: expected shape \(9, 6\)"):
        ct.certify(problem, np.zeros((6, 9)))
    with pytest.raises(ct.InvalidInputError, match="Z: expected finite values"):
        ct.certify(problem, np.full((9, 6), np.inf))
    with pytest.raises(ct.InvalidInputError, match=r"solver: expected .auto. or one of \[.clarabel., .fista., .scs.\], got .mosek."):
        ct.solve(problem, "mosek")

    def fail(self, *a, **k):
        raise cp.error.SolverError("numerical trouble")

    from cvxpy.reductions.solvers.solving_chain import SolvingChain

    monkeypatch.setattr(SolvingChain, "solve_via_data", fail)  # the solver's call, after CVXPY's compilation
    with pytest.raises(ct.SolverError, match=r"solver: scs failed on the dual of program \(6\) \(linear MHSA\)"):
        ct.solve(problem, "scs", form="dual")


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (2, 5, 3)], ids=["tall", "wide", "stack"])
def test_rows_form_of_the_nuclear_norm_is_the_prox_digit_by_digit(shape):
    """min_Z 1/2 ||Z - M||^2 + beta ||Z||_* is singular-value thresholding of M, in closed form: the
    "rows" epigraph (max(p, q) PSD cones of side min(p, q) + 1 sharing one matrix) reaches it, and so
    does CVXPY's normNuc, for a tall and a wide matrix and a stack."""
    from cvxtransformer.core.regularizers import NuclearNorm

    M = np.random.default_rng(3).standard_normal(shape) * 3
    beta = 1.5
    s = np.linalg.svd(M, compute_uv=False)
    t = np.maximum(s - beta, 0.0)
    optimum = float(np.sum(0.5 * (s - t) ** 2 + beta * t))
    Z = cp.Variable(shape)
    reg = NuclearNorm(beta)
    values = {}
    for form in ("rows", "joint"):
        penalty, cones = reg.cvxpy_penalty(Z, form)
        assert len(cones) == (0 if form == "joint" else int(np.prod(shape[:-2])) * max(shape[-2:]))
        problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(Z - M) + penalty), cones)
        values[form] = problem.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
        np.testing.assert_allclose(values[form], optimum, rtol=1e-8)
        np.testing.assert_allclose(reg.value(Z.value), penalty.value, rtol=1e-7)  # the epigraph is tight
    np.testing.assert_allclose(values["rows"], values["joint"], rtol=1e-8)


def test_the_rows_form_is_chosen_where_its_cones_are_cheaper():
    """"auto" takes the rows where max(p, q) eigendecompositions of side min(p, q) + 1 cost fewer flops than
    one of side p + q: Z (144, 24) of "mhsa" with d = 12, c = 2 (144 * 25^3 < 168^3), not a square Z."""
    from cvxtransformer.core.regularizers import NuclearNorm

    assert NuclearNorm.resolve_form(144, 24) == NuclearNorm.resolve_form(24, 144) == "rows"
    assert NuclearNorm.resolve_form(144, 144) == "joint"  # 144 * 145^3 = 4.4e8 > 288^3 = 2.4e7
    assert NuclearNorm.resolve_form(144, 24, "joint") == "joint"
    assert NuclearNorm.psd_cones(144, 24, "rows") == (144, 325)
    assert NuclearNorm.psd_cones(144, 24, "joint") == (1, 168 * 169 // 2)
    with pytest.raises(ct.InvalidInputError, match="nuclear_form"):
        ct.solve(random_problem("mhsa", "squared", "sequence", seed=7), "scs", nuclear_form="cols")


def test_scs_takes_the_rows_form_and_reaches_the_normnuc_optimum(monkeypatch):
    """SCS gets the "rows" PSD cones (Clarabel the joint one), and its certified optimum is that of an
    independent CVXPY problem written with cp.normNuc on the dense design."""
    from cvxtransformer.core.regularizers import NuclearNorm

    problem = random_problem("mhsa", "squared", "sequence", seed=7)
    program = problem.program
    Z = cp.Variable(program.shape)
    fit = program.design() @ cp.reshape(Z, (-1, program.c), order="C") - problem.T.reshape(-1, program.c)
    reference = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(fit) + problem.beta * cp.normNuc(Z))).solve(
        solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    forms, penalty = [], NuclearNorm.cvxpy_penalty

    def spy(self, blocks, form="joint"):
        forms.append(form)
        return penalty(self, blocks, form)

    monkeypatch.setattr(NuclearNorm, "cvxpy_penalty", spy)
    for solver, form in (("scs", "rows"), ("clarabel", "joint")):
        result = ct.solve(problem, solver, tol=1e-7, refine=False)
        assert NuclearNorm.resolve_form(*program.shape, forms[-1]) == form
        assert result.certificate.certified and result.certificate.relative_gap <= 1e-7
        np.testing.assert_allclose(result.certificate.primal_objective, reference, rtol=1e-7)
