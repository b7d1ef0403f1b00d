"""The gated-ReLU multi-head self-attention program ("gated_mhsa"), end to end: a hand-checkable
instance digit by digit, one head as a rank-one Z_g, the reduction to program (6), recovery into the
network in numpy and torch, Adam against the certified bound, the working set of gates and screening,
the command line, the estimators and bad input. Solver x loss agreement, strong duality, KKT, beta_max,
screening, refinement and the distributed backend are in the grids of test_solvers.py, test_builders.py,
test_certificate.py, test_refine.py, test_fista.py and test_distributed.py (their CASES include it)."""
import json

import numpy as np
import pytest
import torch

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.core.mhsa import GatedMHSAHeads, GatedMHSAReduction
from cvxtransformer.nn.mhsa import GatedMHSA, ReluMHSA
from cvxtransformer.testing import check_training_against_bound

from conftest import GATED_MHSA_CASES, case_id, gates_through_the_command_line, random_problem, run_doc_examples

# One sample, n = 2 tokens, d = 1: x = (2, -1); two gates h = +1 and h = -1.
X1 = np.array([[[2.0], [-1.0]]])
H1 = np.array([[[1.0]], [[-1.0]]])
Y1 = np.array([[[1.0], [0.0]]])  # one target per token, c = 1


def test_hand_checkable_instance_digit_by_digit():
    # scores x_t h x_s: gate +1 gives [[4, -2], [-2, 1]], gate -1 its negative
    D = ct.attention_masks(X1, H1)  # D[i, t, g, s]
    np.testing.assert_array_equal(D[0, :, 0, :], [[1, 0], [0, 1]])
    np.testing.assert_array_equal(D[0, :, 1, :], [[0, 1], [1, 0]])
    problem = ct.make_problem(X1, Y1, program="gated_mhsa", loss="squared", beta=4.0, H=H1)
    p = problem.program
    assert p.shape == (2, 1, 1) and not p.pooled
    # gated Gram matrices G^g_t = sum_s D_g[t, s] x_s^2: gate 1 (4, 1), gate 2 (1, 4)
    op = p.operator()
    Xc, K, Dm = op._data(0, 1)
    np.testing.assert_array_equal(K.numpy().ravel(), [4.0, 1.0])
    np.testing.assert_array_equal(op._query_grams(K, Dm, 0).numpy().ravel(), [4.0, 1.0])
    np.testing.assert_array_equal(op._query_grams(K, Dm, 1).numpy().ravel(), [1.0, 4.0])
    # a head W1 = 3, W2 = 0.5 on gate 1: f_t = x_t W1 W2 G_t = (2*3*0.5*4, -1*3*0.5*1) = (12, -1.5)
    heads = GatedMHSAHeads(np.array([[[3.0]]]), np.array([[[0.5]]]), np.array([0]))
    np.testing.assert_array_equal(GatedMHSAReduction.predict(X1, heads, H1, pooled=False), [[12.0, -1.5]])
    Z = GatedMHSAReduction.coefficients(problem, heads)
    np.testing.assert_array_equal(Z.ravel(), [1.5, 0.0])
    np.testing.assert_array_equal(p.forward(Z), [[12.0, -1.5]])
    # the map is yhat = a_1 z_1 + a_2 z_2 with a_g[t] = x_t G^g_t: a_1 = (8, -1), a_2 = (2, -4)
    np.testing.assert_array_equal(p.adjoint(np.array([[1.0, 0.0]])).ravel(), [8.0, 2.0])
    np.testing.assert_array_equal(p.adjoint(np.array([[0.0, 1.0]])).ravel(), [-1.0, -4.0])
    # so the program is a lasso: beta_max = max(|a_1.y|, |a_2.y|) = 8, and at beta = 4 only gate 1 is
    # active: z_1 = (8 - 4)/|a_1|^2 = 4/65 (a_2.(y - a_1 z_1) = 2 - 20 * 4/65 = 50/65 <= 4)
    assert problem.beta_max() == 8.0
    Z_star = np.array([4.0 / 65, 0.0]).reshape(2, 1, 1)
    r = Y1.ravel() - np.array([8.0, -1.0]) * 4.0 / 65
    P_star = 0.5 * r @ r + 4.0 * 4.0 / 65
    cert = ct.certify(problem, Z_star, refine=False)
    assert cert.primal_objective == pytest.approx(P_star, rel=1e-15)
    assert abs(cert.duality_gap) <= 1e-15 and cert.kkt_stationarity <= 1e-15 and cert.kkt_dual_feasibility == 0.0
    np.testing.assert_allclose(cert.V, [r], rtol=1e-15)  # V* = y - yhat
    for solver in ("clarabel", "scs", "fista"):
        result = ct.solve(problem, solver, tol=1e-9 if solver != "scs" else 1e-6)
        np.testing.assert_allclose(result.Z, Z_star, atol=1e-6 if solver == "scs" else 1e-9)
        assert result.Z[1, 0, 0] == 0.0  # gate 2 exactly zero: the gap-safe rule proves it
    recovered = ct.recover_weights(problem, Z_star)
    assert recovered.gate.tolist() == [0] and abs(recovered.W1[0, 0, 0]) == pytest.approx(2 / 65 ** 0.5, rel=1e-14)
    assert ct.nonconvex_objective(problem, recovered) == pytest.approx(P_star, rel=1e-14)


@pytest.mark.parametrize("pooled", [False, True])
def test_a_rank_one_Zg_is_one_head_on_its_gate(pooled):
    rng = np.random.default_rng(0)
    N, n, d, c, P = 6, 5, 3, 2, 3
    X, H = rng.standard_normal((N, n, d)), rng.standard_normal((P, d, d))
    W1, W2 = rng.standard_normal((d, d)), rng.standard_normal((d, c))
    u = np.array([W1[a, k] for k in range(d) for a in range(d)])  # u[k*d + a] = W1[a, k]
    v = np.array([W2[l, b] for l in range(d) for b in range(c)])  # v[l*c + b] = W2[l, b]
    Z = np.zeros((P, d * d, d * c))
    Z[1] = np.outer(u, v)
    y = rng.standard_normal((N, c)) if pooled else rng.standard_normal((N, n, c))
    problem = ct.make_problem(X, y, program="gated_mhsa", beta=1.0, H=H)
    D = np.stack([[[float(X[i, t] @ H[1] @ X[i, s] >= 0) for s in range(n)] for t in range(n)] for i in range(N)])
    f = np.stack([(D[i] * (X[i] @ W1 @ X[i].T)) @ X[i] @ W2 for i in range(N)])  # (N, n, c)
    expected = f.mean(axis=1) if pooled else f.reshape(N, n * c)
    np.testing.assert_allclose(problem.program.forward(Z), expected, rtol=1e-12, atol=1e-12)
    heads = GatedMHSAHeads(W1[None], W2[None], np.array([1]))
    np.testing.assert_array_equal(GatedMHSAReduction.coefficients(problem, heads), Z)
    net = GatedMHSA.from_weights(heads, H, n, pooled=pooled)
    np.testing.assert_allclose(net(*net.encode_inputs(X)).detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(net.effective_coefficients(), Z)
    # the adjoint and the CVXPY design agree with the map
    V = rng.standard_normal(expected.shape)
    assert np.sum(problem.program.forward(Z) * V) == pytest.approx(np.sum(Z * problem.program.adjoint(V)), rel=1e-12)
    design = problem.program.design()
    np.testing.assert_allclose(design @ Z.reshape(-1, c), expected.reshape(design.shape[0], c), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(problem.program.design(2, 5), design[(2 if pooled else 2 * n):(5 if pooled else 5 * n)])


@pytest.mark.parametrize("target", ["sequence", "vector"])
def test_one_gate_open_everywhere_is_program_6(target):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((25, 4, 3))
    y = rng.standard_normal((25, 4, 2)) if target == "sequence" else rng.standard_normal((25, 2))
    lin = ct.make_problem(X, y, program="mhsa", beta=1.0)
    gated = ct.make_problem(X, y, program="gated_mhsa", beta=1.0, H=np.zeros((1, 3, 3)))  # x^T 0 x = 0 >= 0
    assert gated.program.shape == (1,) + lin.program.shape
    Z = rng.standard_normal(lin.program.shape)
    V = rng.standard_normal((25, lin.program.n_outputs))
    np.testing.assert_allclose(gated.program.forward(Z[None]), lin.program.forward(Z), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(gated.program.adjoint(V)[0], lin.program.adjoint(V), rtol=1e-13, atol=1e-12)
    assert gated.beta_max() == pytest.approx(lin.beta_max(), rel=1e-13)
    assert float(gated.program.block_norms()[0]) == pytest.approx(float(lin.program.block_norms()), rel=1e-12)
    np.testing.assert_allclose(gated.program.design(), lin.program.design(), rtol=1e-14)
    beta = 0.2 * lin.beta_max()
    a = ct.solve(lin.with_beta(beta), "clarabel", tol=1e-10)
    b = ct.solve(gated.with_beta(beta), "clarabel", tol=1e-10)
    assert b.certificate.primal_objective == pytest.approx(a.certificate.primal_objective, rel=1e-9)
    np.testing.assert_allclose(b.Z[0], a.Z, atol=1e-6 * np.abs(a.Z).max())
    # the same heads (up to the sign of each singular pair), all on gate 0
    ha, hb = ct.recover_weights(lin.with_beta(beta), a.Z), ct.recover_weights(gated.with_beta(beta), b.Z[0][None])
    assert hb.heads == ha.heads >= 1 and hb.gate.tolist() == [0] * ha.heads
    for j in range(ha.heads):
        sign = np.sign(np.sum(ha.W1[j] * hb.W1[j]))
        np.testing.assert_allclose(sign * hb.W1[j], ha.W1[j], atol=1e-8)
        np.testing.assert_allclose(sign * hb.W2[j], ha.W2[j], atol=1e-8)


@pytest.mark.parametrize("case", GATED_MHSA_CASES, ids=case_id)
def test_recovered_network_in_numpy_and_torch_equals_P(case):
    problem = random_problem(*case, seed=3)
    result = ct.solve(problem, "clarabel", tol=1e-9)
    heads = ct.recover_weights(problem, result.Z)
    P = result.certificate.primal_objective
    ranks = problem.regularizer.ranks(result.Z)
    assert heads.heads == ranks.sum() >= 1 and np.array_equal(np.bincount(heads.gate, minlength=len(ranks)), ranks)
    assert ct.nonconvex_objective(problem, heads) == pytest.approx(P, rel=1e-9)
    p = problem.program
    net = GatedMHSA.from_weights(heads, p.H, p.n, pooled=p.pooled)
    assert net.objective(net.encode_inputs(p.X), problem.T, problem.loss, problem.beta).item() == pytest.approx(P, rel=1e-9)
    np.testing.assert_allclose(net.effective_coefficients(), result.Z, atol=1e-10 * np.abs(result.Z).max())


@pytest.mark.slow
def test_adam_with_enough_heads_reaches_the_optimum_and_one_head_cannot():
    problem = random_problem("gated_mhsa", "squared", "sequence", seed=7, N=30, n=3, d=3, gates=2, frac=0.2)
    p = problem.program
    check_training_against_bound(problem, lambda m: GatedMHSA(p.n, p.d, problem.T.shape[1], m, p.H, seed=0),
                                 lr=0.05, steps=1000)


def test_relu_attention_is_the_same_heads_with_a_relu_on_the_scores():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((4, 3, 2))
    net = ReluMHSA(3, 2, 3 * 2, heads=2, seed=1)
    W1, W2 = net.W1.detach().numpy(), net.W2.detach().numpy()
    f = sum(np.maximum(X @ W1[j] @ X.transpose(0, 2, 1), 0) @ X @ W2[j] for j in range(2))
    np.testing.assert_allclose(net(*net.encode_inputs(X)).detach().numpy(), f.reshape(4, 6), rtol=1e-12)


def test_gate_working_set_and_screening_are_safe():
    problem = random_problem("gated_mhsa", "cross_entropy", "classes", seed=8, N=60, n=4, d=3, gates=8, frac=0.5)
    reference = ct.solve(problem, "clarabel", tol=1e-9)
    ranks = problem.regularizer.ranks(reference.Z)
    assert 0 < np.count_nonzero(ranks) < 8  # some gates are zero at the optimum
    with_ws = ct.solve(problem, "fista", tol=1e-8, screen_norms="exact")
    whole = ct.solve(problem, "fista", tol=1e-8, working_set=False)
    for result in (with_ws, whole):
        assert result.certified
        assert result.certificate.primal_objective == pytest.approx(reference.certificate.primal_objective, rel=1e-6)
    sizes = [h.working_set for h in with_ws.history if h.kind == "certified" and h.working_set]
    assert sizes and max(sizes) < 8 * 81  # Z (8, 9, 9): never every gate
    mask = with_ws.screened
    assert mask.shape == (8, 9) and mask.all(axis=1).any()  # whole gates proved zero
    assert np.all(with_ws.Z[mask.all(axis=1)] == 0.0) and np.all(ranks[mask.all(axis=1)] == 0)
    assert np.all((~mask).sum(axis=1) >= ranks)  # the proved rank bound of each gate holds at the optimum
    path = ct.solve_path(problem, n_betas=3, ratio=0.3, tol=1e-7)
    assert all(point.certified for point in path) and np.all(path[0].result.Z == 0)
    assert all(point.n_blocks == 8 * 9 == point.screened_mask.size for point in path)


@pytest.mark.parametrize("chunk", [1, 7])
def test_chunks_and_float32_give_the_same_map(chunk):
    problem = random_problem("gated_mhsa", "squared", "sequence", seed=9, N=23)
    p = problem.program
    op, full = p.operator("cpu", torch.float64, chunk), p.operator()
    Z = torch.from_numpy(np.random.default_rng(0).standard_normal(p.shape))
    V = torch.from_numpy(np.random.default_rng(1).standard_normal((p.N, p.n_outputs)))
    torch.testing.assert_close(op.forward(Z), full.forward(Z), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op.adjoint(V), full.adjoint(V), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(op.operator_norms(), full.operator_norms(), rtol=1e-10, atol=0)
    bounds = op.operator_norm_bounds()
    assert torch.all(bounds >= full.operator_norms() * (1 - 1e-12))
    J = torch.tensor([2, 0])
    torch.testing.assert_close(op.restrict(J).forward(Z[J]), full.forward(Z * torch.tensor([1.0, 0, 1])[:, None, None]),
                               rtol=1e-12, atol=1e-12)
    op32 = p.operator("cpu", torch.float32, chunk)
    torch.testing.assert_close(op32.forward(Z.float()).double(), full.forward(Z), rtol=1e-4, atol=1e-4)


def test_command_line_solve_and_verify_with_gates_in_data_and_result(tmp_path, capsys):
    X, y, args, s, v, saved, folder = gates_through_the_command_line(tmp_path, capsys, "gated_mhsa", "H", (30, 4, 2))
    assert s["program"] == "gated_mhsa" and s["certified"] and s["support_size"] >= 1
    np.testing.assert_array_equal(saved["H"], ct.sample_gate_matrices(3, 3, seed=5))
    assert saved["Z"].shape == (3, 9, 6)
    # verify takes the gates from RESULT, whatever --gates says
    assert v["certified"] and v["primal_objective"] == pytest.approx(s["primal_objective"], rel=1e-14)
    # a DATA folder with H.npy: its gates are used
    assert folder["beta_max"] == pytest.approx(
        ct.make_problem(X, y, program="gated_mhsa", H=saved["H"][:2], beta=1.0).beta_max(), rel=1e-12)


def test_estimators_match_the_functional_api():
    pytest.importorskip("sklearn")
    from cvxtransformer.estimators import GatedMHSAClassifier, GatedMHSARegressor

    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((40, 4, 3)), rng.standard_normal((40, 4, 2))
    model = GatedMHSARegressor(gates=3, gate_seed=2, beta_frac=0.2).fit(X, y)
    problem = ct.make_problem(X, y, program="gated_mhsa", gates=3, gate_seed=2, beta=1.0)
    reference = ct.solve(problem.with_beta(0.2 * problem.beta_max()))
    np.testing.assert_allclose(model.coef_, reference.Z, atol=1e-12)
    assert model.certificate_.certified and model.coef_.shape == (3, 9, 6)
    X6 = rng.standard_normal((5, 6, 3))  # another number of tokens
    expected = ct.make_problem(X6, np.zeros((5, 6, 2)), program="gated_mhsa", H=problem.program.H,
                               beta=1.0).program.forward(model.coef_)
    np.testing.assert_allclose(model.predict(X6), expected.reshape(5, 6, 2), rtol=1e-12)
    labels = np.where(X[:, :, 0].sum(axis=1) > 0, "yes", "no")
    clf = GatedMHSAClassifier(loss="logistic", gates=2, beta_frac=0.1).fit(X, labels)
    assert clf.certificate_.certified and clf.score(X, labels) > 0.7
    assert set(clf.predict(X)) <= {"yes", "no"}


@pytest.mark.parametrize("kwargs, match", [
    (dict(H=np.zeros((2, 3))), r"H: expected shape \(P, 2, 2\)"),
    (dict(H=np.zeros((2, 2, 3))), r"H: expected shape \(P, 2, 2\) for tokens of dimension d = 2, got shape \(2, 2, 3\)"),
    (dict(H=np.full((1, 2, 2), np.nan)), r"H: expected finite values"),
    (dict(H=np.zeros((0, 2, 2))), r"H: expected at least one gate matrix \(P >= 1\)"),
    (dict(H=np.ones((1, 2, 2)) * 1j), r"H: expected real numbers, got complex values"),
    (dict(H=[["a"]]), r"H: expected a numeric array"),
    (dict(gates=0), r"gates: expected an integer >= 1, got 0"),
    (dict(gates=2.5), r"gates: expected an integer >= 1"),
    (dict(gate_seed="x"), r"gate_seed: expected an integer"),
    (dict(U1=np.zeros((2, 3)), U2=np.zeros((2, 2))), r"U1, U2: expected no gate vectors for program \(gated_mhsa\)"),
    (dict(program="mhsa", H=np.zeros((1, 2, 2))), r"H: expected no gate matrices for program \(mhsa\).*'gated_mhsa'"),
    (dict(program=12, H=np.zeros((1, 2, 2))), r"H: expected no gate matrices for program \(12\)"),
    (dict(program="gated"), r"program: expected one of 8, 10, 12, '10wd', '12wd', 'mhsa', 'gated_mhsa'"),
    (dict(y=np.zeros((5, 4, 1))), r"y: expected sequence targets of shape \(N, n=3, c\)"),
    (dict(beta=-1.0), r"beta: expected a finite number > 0"),
])
def test_bad_input_for_the_gated_program(kwargs, match):
    args = dict(X=np.ones((5, 3, 2)), y=np.ones((5, 3, 1)), program="gated_mhsa", loss="squared", beta=1.0)
    args.update(kwargs)
    with pytest.raises(ct.InvalidInputError, match=match):
        ct.make_problem(**args)


def test_bad_heads_solutions_and_command_lines(tmp_path, capsys):
    problem = random_problem("gated_mhsa", "squared", "sequence")
    with pytest.raises(ct.InvalidInputError, match=r"Z: expected shape \(3, 9, 6\)"):
        ct.certify(problem, np.zeros((9, 6)))
    good = np.zeros((1, 3, 3)), np.zeros((1, 3, 2))
    with pytest.raises(ct.InvalidInputError, match=r"weights.gate: expected 1 integers in \[0, 3\)"):
        GatedMHSAReduction.coefficients(problem, GatedMHSAHeads(*good, np.array([3])))
    with pytest.raises(ct.InvalidInputError, match=r"weights: expected W1, W2 of shapes"):
        GatedMHSAReduction.coefficients(problem, GatedMHSAHeads(np.zeros((1, 2, 3)), good[1], np.array([0])))
    with pytest.raises(ct.InvalidInputError, match=r"H: expected gate matrices of shape \(P, 3, 3\)"):
        GatedMHSA(4, 3, 8, 2, H=np.zeros((2, 3)))
    with pytest.raises(ct.InvalidInputError, match=r"gate: expected gate indices in \[0, 2\)"):
        GatedMHSA(4, 3, 8, 2, H=np.zeros((2, 3, 3)), gate=[0, 2])
    data, result = tmp_path / "d.npz", tmp_path / "r.npz"
    X = np.random.default_rng(0).standard_normal((10, 4, 3))
    np.savez(data, X=X, y=X[:, :, :2])
    np.savez(result, Z=np.zeros((3, 9, 6)), H=np.zeros((3, 3, 4)))
    args = ["--program", "gated_mhsa", "--loss", "squared", "--beta", "1"]
    assert main(["verify", str(data), str(result), *args]) == 2
    assert "H: expected shape (P, 3, 3)" in capsys.readouterr().err
    np.savez(data, X=X, y=X[:, :, :2], H=np.full((2, 3, 3), np.nan))
    assert main(["solve", str(data), *args]) == 2
    assert "H: expected finite values" in capsys.readouterr().err


def test_compare_trains_the_gated_and_relu_networks_against_the_certified_bound(tmp_path):
    problem = random_problem("gated_mhsa", "squared", "sequence", seed=7, N=30, n=3, d=3, gates=2, frac=0.2)
    out = ct.compare(problem, steps=40, lr=0.05)
    ranks = problem.regularizer.ranks(out.solutions["gated_mhsa"].Z)
    r = int(ranks.sum())
    gated = {run.network.heads: run for run in out.models.values() if run.model == "gated_mhsa"}
    assert sorted(gated) == [r - 1, r, 2 * r]
    # at sum_g rank(Z*_g) heads each gate g holds rank(Z*_g) of them
    np.testing.assert_array_equal(np.bincount(gated[r].network.gate, minlength=len(ranks)), ranks)
    for run in gated.values():
        assert run.report["bound_applies"] and run.certified_gap >= 0
        assert run.certified_lower_bound == out.certificate.dual_objective
    relu = [run for run in out.models.values() if run.model == "relu_mhsa"]
    assert len(relu) == 3 and all(not run.report["bound_applies"] and run.certified_gap is None for run in relu)
    assert all(run.report["objective_minus_convex_optimum"] == pytest.approx(
        run.objective - out.certificate.primal_objective, rel=1e-12) for run in relu)
    files = out.save(tmp_path)
    assert "singular_values.png" in files and (tmp_path / "singular_values.png").stat().st_size > 0
    np.testing.assert_array_equal(np.load(tmp_path / "convex_gated_mhsa.npz")["Z"], out.solutions["gated_mhsa"].Z)
    assert np.load(tmp_path / f"gated_mhsa_m{r}.npz")["H"].shape == problem.program.H.shape


def test_the_example_of_docs_gated_mhsa_runs(capsys):
    run_doc_examples("gated_mhsa.md")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("True") and lines[-1] == "True"
