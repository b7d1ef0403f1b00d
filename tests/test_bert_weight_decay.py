"""benchmarks/bert_weight_decay.py (docs/bert_student_teacher.md, section "Ordinary weight decay") on a tiny DATA
file: its numbers against independent CVXPY solves written here, its choices against its validation scores, and
the page's generated block."""
import json
import os
import sys
import warnings

import cvxpy as cp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


def data(path, N=18, n=3, d=2, seed=0):
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((n, d, n, d)) * (rng.random((n, 1, n, 1)) < 0.6)  # output (t, e) from input (k, f)
    splits = {}
    for name, size in (("", N), ("_val", 8), ("_test", 8)):
        X = rng.standard_normal((size, n, d))
        splits["X" + name] = X
        splits["y" + name] = np.einsum("ikf,tekf->ite", X, B) + 0.3 * rng.standard_normal((size, n, d))
    np.savez(path, **splits)
    return splits


def optimum(X, T, beta, nuclear):
    """Z (c, n, d) and P(Z*) of program (10) (group lasso of each (output, token) row) or 10wd (nuclear norm of each
    token's c x d matrix), written directly: ``yhat_il = sum_k Z[l, k] . x_ik``."""
    N, n, d = X.shape
    c = T.shape[1]
    Z = [cp.Variable((c, d)) for _ in range(n)]
    yhat = sum(X[:, k, :] @ Z[k].T for k in range(n))
    penalty = sum(cp.normNuc(Zk) if nuclear else cp.sum(cp.norm(Zk, 2, axis=1)) for Zk in Z)
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(yhat - T) + beta * penalty))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problem.solve(solver="CLARABEL", tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    return np.stack([Zk.value for Zk in Z], axis=1), problem.value


def loss_per_sample(X, y, Z):
    yhat = np.einsum("ikf,lkf->il", X, Z)
    return 0.5 * float(np.sum((yhat - y.reshape(len(y), -1)) ** 2)) / len(y)


def test_bert_weight_decay_script_on_a_tiny_data_file(tmp_path, capsys):
    from bert_weight_decay import QUICK_GRID, run

    splits = data(tmp_path / "DATA.npz")
    doc = tmp_path / "page.md"
    doc.write_text("before\n<!-- generated: weight decay, block -->\nSTALE-LINE\n<!-- end generated: weight decay, block -->\nafter\n")
    figures = tmp_path / "figures"
    assert run(["--quick", "--data", str(tmp_path / "DATA.npz"), "--figures", str(figures), "--doc", str(doc)]) == 0
    r = json.loads((figures / "results.json").read_text())
    assert (figures / "validation.png").stat().st_size > 0
    X, y = splits["X"], splits["y"]
    T = y.reshape(len(y), -1)
    A = np.einsum("il,ikf->lkf", T, X)  # A^T T: (c, n, d)
    beta_max = {"10": np.linalg.norm(A, axis=2).max(),
                "10wd": max(np.linalg.norm(A[:, k, :], 2) for k in range(X.shape[1]))}
    text = doc.read_text()
    assert text.startswith("before\n<!-- generated: weight decay, block by `python benchmarks/bert_weight_decay.py`")
    assert "STALE-LINE" not in text and text.endswith("<!-- end generated: weight decay, block -->\nafter\n")
    for program in ("10", "10wd"):
        p = r["programs"][program]
        assert p["beta_max"] == pytest.approx(beta_max[program], rel=1e-12)
        grid = p["grid"]
        assert [g["beta_fraction"] for g in grid] == QUICK_GRID
        for g in grid:
            assert g["relative_gap"] <= 1e-6 and g["test_loss"] is None  # no test loss before the choice
        chosen = p["chosen"]
        assert chosen["validation_loss"] == min(g["validation_loss"] for g in grid)
        Z, p_star = optimum(X, T, chosen["beta"], program == "10wd")
        assert chosen["beta"] == pytest.approx(chosen["beta_fraction"] * beta_max[program], rel=1e-12)
        assert chosen["primal_objective"] == pytest.approx(p_star, rel=1e-6)
        assert chosen["dual_objective"] <= p_star * (1 + 1e-9)
        for split in ("", "_val", "_test"):
            name = {"": "train", "_val": "validation", "_test": "test"}[split]
            assert chosen[f"{name}_loss"] == pytest.approx(loss_per_sample(splits["X" + split], splits["y" + split], Z),
                                                           rel=1e-4)
        if program == "10":
            support = int(np.sum(np.linalg.norm(Z, axis=2) > 1e-5 * np.abs(Z).max()))
        else:
            s = np.linalg.svd(np.swapaxes(Z, 0, 1), compute_uv=False)
            support = int(np.sum(s > 1e-5 * s.max()))
        assert chosen["support_size"] == support
        # the network: tuned on its own program's beta_max, certified against D(V) at its beta
        m = p["network"]
        assert m["beta_max"] == pytest.approx(beta_max[program], rel=1e-12)
        assert m["validation_loss"] == min(row["validation_loss"] for row in m["grid"])
        row = next(g for g in grid if g["beta_fraction"] == m["beta_fraction"])
        assert m["certified_lower_bound"] == pytest.approx(row["dual_objective"], rel=1e-9)
        assert m["certified_gap"] == pytest.approx(m["objective"] - m["certified_lower_bound"], rel=1e-12)
        assert m["certified_gap"] >= -1e-6 * abs(m["objective"])
        assert m["heads"] == (row["support_size"] if program == "10wd" else Z.shape[0] * Z.shape[1])
        assert f"**{chosen['primal_objective']:.6g}**" in text and f"| {m['heads']} |" in text
    capsys.readouterr()


def test_bert_native_width_script_measures_compare_with_its_new_default(tmp_path):
    """bert_native_width.py on a tiny DATA file with sequence targets (c = n d >= 2 outputs): compare trains network
    (9w) with as many heads as 10wd's optimum needs, and each command is measured in its own child process."""
    from bert_native_width import run

    data(tmp_path / "DATA.npz")
    doc = tmp_path / "page.md"
    marker = "native width, threads-1"
    doc.write_text(f"<!-- generated: {marker} -->\nSTALE-LINE\n<!-- end generated: {marker} -->\n")
    assert run(["--data", str(tmp_path / "DATA.npz"), "--threads", "1", "--figures", str(tmp_path),
                "--doc", str(doc), "--keep", str(tmp_path / "work")]) == 0
    r = json.loads((tmp_path / "threads-1.json").read_text())
    m, s = r["run"], r["compare"]
    assert r["data"] is None and m["exit_code"] == 0 and s["certified"]
    assert m["max_rss_bytes"] > 50 * 2 ** 20  # the child's own peak: it imports torch
    assert 0 < m["user_seconds"] + m["system_seconds"] <= m["wall_seconds"] * os.cpu_count() + 1
    assert set(s["models"]) == {"alternative_wd", "softmax"} and set(s["convex"]) == {"10", "10wd"}
    assert s["models"]["alternative_wd"]["heads"] == s["convex"]["10wd"]["support_size"] >= 1
    with open(tmp_path / "work" / "RUN" / "compare.json") as f:
        assert json.load(f)["convex"]["10wd"]["solve_seconds"] == s["convex"]["10wd"]["solve_seconds"]
    text = doc.read_text()
    assert "STALE-LINE" not in text and "`python benchmarks/bert_native_width.py --threads 1`" in text
    assert "exact solve of (10wd)" in text and "OPENBLAS_NUM_THREADS = MKL_NUM_THREADS = 1" in text
