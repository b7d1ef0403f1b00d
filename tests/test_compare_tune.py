"""``compare --tune`` and the fairness rules: the same splits for every model, the choice made on the
validation split alone, and the training loss, regulariser and objective reported apart (each
recomputed here from the saved weights, with numpy)."""
import json

import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.cli import main
from cvxtransformer.comparison import run as comparison_run
from cvxtransformer.comparison import tuning
from cvxtransformer.datasets import student_teacher

GRID = ["--lr-grid", "0.01,0.1", "--beta-grid", "0.02,0.3"]


@pytest.fixture
def data(tmp_path):
    X, Y = student_teacher(N=80, n=4, d=3, c=2, heads=2, noise=0.1, seed=0)
    splits = dict(X=X[:40], y=Y[:40], X_val=X[40:60], y_val=Y[40:60], X_test=X[60:], y_test=Y[60:])
    path = tmp_path / "data.npz"
    np.savez(path, **splits)
    return {"path": str(path), "tmp": tmp_path, **splits}


def compare(capsys, data, out, *extra):
    code = main(["compare", data["path"], "--program", "10", "--loss", "squared", "--tune", *GRID, "--steps", "30",
                 "--models", "alternative,softmax,convex", "--heads", "4", "--eval-every", "10", "--out-dir", str(out),
                 "--json", "--quiet",
                 *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


# ----------------------------------------------------------------------------- forward passes, in numpy
def predict(model, w, X):
    if model == "alternative":
        return np.einsum("jk,ikd,jd->ij", w["W1"], X, w["W2"]) @ w["W3"]
    if model == "softmax":  # read at token 0 (vector targets)
        d = X.shape[2]
        scores = np.einsum("id,ikd->ik", X[:, 0] @ w["Wq"], X @ w["Wk"]) / np.sqrt(d)
        P = np.exp(scores - scores.max(axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        return np.einsum("ik,ikd->id", P, X @ w["Wv"]) @ w["Wo"]
    return np.einsum("lkd,ikd->il", w["Z"], X)  # convex (10)


def penalty(model, w, beta):
    if model == "alternative":
        return beta / 2 * (np.sum(w["W2"] ** 2) + np.sum(np.abs(w["W3"]).sum(axis=1) ** 2))
    if model == "softmax":
        return beta / 2 * sum(np.sum(w[k] ** 2) for k in ("Wq", "Wk", "Wv", "Wo"))
    return beta * np.linalg.norm(w["Z"], axis=-1).sum()


def loss_sum(Yhat, Y):
    return 0.5 * np.sum((Yhat - Y) ** 2)


# ----------------------------------------------------------------------------- tests
def test_choose_takes_the_smallest_finite_validation_score():
    assert tuning.choose([0.5, float("nan"), 0.2, float("inf"), 0.2]) == 2
    assert tuning.choose([float("nan"), float("inf")]) == 0


@pytest.mark.slow
def test_tuned_report_is_recomputed_from_the_saved_weights_on_the_same_splits(data, capsys):
    out = data["tmp"] / "run"
    s = compare(capsys, data, out)
    beta_max = ct.make_problem(data["X"], data["y"], program=10, loss="squared", beta=1.0).beta_max()
    t = s["tuning"]
    assert t["split"] == "validation" and t["lr_grid"] == [0.01, 0.1] and t["beta_grid"] == [0.02, 0.3]
    np.testing.assert_allclose(t["betas"], [0.02 * beta_max, 0.3 * beta_max], rtol=1e-12)
    assert s["splits"] == {"train": 40, "validation": 20, "test": 20}
    for model in ("alternative", "softmax", "convex"):
        m, tm = s["models"][model], t["models"][model]
        scores = [r["validation_loss"] for r in tm["grid"]]
        assert [(r["lr"], r["beta_fraction"]) for r in tm["grid"]] == [(0.01, 0.02), (0.01, 0.3), (0.1, 0.02),
                                                                      (0.1, 0.3)]
        best = tm["grid"][int(np.argmin(scores))]
        assert (m["lr"], m["beta"]) == (best["lr"], best["beta"]) == (tm["chosen"]["lr"], tm["chosen"]["beta"])
        assert tm["reproduced"] is True
        with np.load(out / f"{model}.npz") as f:
            w = {k: f[k] for k in f.files}
        # every number of the report, from the weights and the splits of DATA
        assert m["validation_loss"] == pytest.approx(loss_sum(predict(model, w, data["X_val"]), data["y_val"]) / 20,
                                                     rel=1e-9)
        assert m["test_loss"] == pytest.approx(loss_sum(predict(model, w, data["X_test"]), data["y_test"]) / 20,
                                               rel=1e-9)
        assert m["loss_sum"] == pytest.approx(loss_sum(predict(model, w, data["X"]), data["y"]), rel=1e-9)
        assert m["regularizer"] == pytest.approx(penalty(model, w, m["beta"]), rel=1e-9)
        assert m["objective"] == pytest.approx(m["loss_sum"] + m["regularizer"], rel=1e-12)
    # the bound of (9) and of the convex model at their own beta is D(V) of program (10) at that beta
    for model in ("alternative", "convex"):
        m = s["models"][model]
        P = ct.make_problem(data["X"], data["y"], program=10, loss="squared", beta=m["beta"])
        optimum = ct.solve(P, "clarabel", tol=1e-9).certificate.primal_objective
        assert m["certified_lower_bound"] <= optimum <= m["certified_lower_bound"] * (1 + 1e-6)
        assert m["certified_gap"] == pytest.approx(m["objective"] - m["certified_lower_bound"])
    with np.load(out / "convex.npz") as f:
        P = ct.make_problem(data["X"], data["y"], program=10, loss="squared", beta=s["models"]["convex"]["beta"])
        assert s["models"]["convex"]["objective"] == pytest.approx(P.primal_objective(f["Z"]), rel=1e-12)
    # the exact convex solution, tuned over the same beta grid
    cx = s["convex"]["10"]
    rows = t["convex_exact"]["10"]["grid"]
    assert cx["beta"] == rows[int(np.argmin([r["validation_loss"] for r in rows]))]["beta"] == s["beta"]
    Z = np.load(out / "convex_p10.npz")["Z"]
    assert cx["validation_loss"] == pytest.approx(loss_sum(predict("convex", {"Z": Z}, data["X_val"]), data["y_val"]) / 20)
    assert cx["test_loss"] == pytest.approx(loss_sum(predict("convex", {"Z": Z}, data["X_test"]), data["y_test"]) / 20)
    assert cx["loss_sum"] + cx["regularizer"] == pytest.approx(cx["primal_objective"], rel=1e-12)
    assert cx["certified"] and all(r["certified"] for r in rows)
    for name in ("tuning.png", "objective.png", "attention.png", "test_loss.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG", name


@pytest.mark.slow
def test_the_test_split_never_influences_the_choice(data, capsys):
    """Run B has the validation split as its test split, with the targets negated: a choice made on
    the test split would pick the worst validation fit there. The validation scores and the choices
    must not move, while the test losses do."""
    a = compare(capsys, data, data["tmp"] / "a")
    swapped = data["tmp"] / "swapped.npz"
    np.savez(swapped, X=data["X"], y=data["y"], X_val=data["X_val"], y_val=data["y_val"], X_test=data["X_val"],
             y_test=-data["y_val"])
    b = compare(capsys, dict(data, path=str(swapped)), data["tmp"] / "b")

    def scores(s):
        return {m: [(r["lr"], r["beta"], r["validation_loss"], r["objective"]) for r in v["grid"]]
                for m, v in s["tuning"]["models"].items()}

    assert scores(a) == scores(b)
    exact = [[(r["beta"], r["validation_loss"], r["primal_objective"]) for r in s["tuning"]["convex_exact"]["10"]["grid"]]
             for s in (a, b)]
    assert exact[0] == exact[1]
    for model in ("alternative", "softmax", "convex"):
        ma, mb = a["models"][model], b["models"][model]
        assert (ma["lr"], ma["beta"]) == (mb["lr"], mb["beta"])
        assert mb["test_loss"] != ma["test_loss"]
        # on B the test targets are -y_val: a choice that had seen them would fit them, not y_val
        assert mb["validation_loss"] < 0.5 * np.sum(data["y_val"] ** 2) / 20 < mb["test_loss"]
    assert a["beta"] == b["beta"]


@pytest.mark.slow
def test_no_test_number_is_computed_before_every_choice_is_made(data, capsys, monkeypatch):
    """The order of the protocol, observed: the test split reaches no training and no evaluation
    until the last validation choice."""
    events = []
    X_test = data["X_test"]
    real_choose, real_train, real_summary = tuning.choose, comparison_run.Plan.train, tuning.convex_summary

    def is_test(split):
        return split is not None and split[0].shape == X_test.shape and np.array_equal(split[0], X_test)

    def choose(scores):
        events.append("choose")
        return real_choose(scores)

    def train_model(plan, model, problem, lr, heads, evaluation):
        events.append("train on test" if is_test(evaluation) else "train")
        return real_train(plan, model, problem, lr, heads, evaluation)

    def convex_summary(result, problem, test, val=None):
        events.append("test" if is_test(test) else "summary")
        return real_summary(result, problem, test, val)

    monkeypatch.setattr(tuning, "choose", choose)
    monkeypatch.setattr(comparison_run.Plan, "train", train_model)
    monkeypatch.setattr(tuning, "convex_summary", convex_summary)
    compare(capsys, data, data["tmp"] / "run")
    last_choice = max(i for i, e in enumerate(events) if e == "choose")
    assert events.count("choose") == 4 and events.count("train") == 12  # 3 models x 4 points, 1 exact program
    assert all(e in ("train", "choose") for e in events[:last_choice])
    assert events[last_choice + 1:].count("train on test") == 3 and "test" in events[last_choice + 1:]


@pytest.mark.slow
def test_fixed_mode_reports_loss_and_regulariser_apart_and_trains_the_convex_model(data, capsys):
    out = data["tmp"] / "fixed"
    code = main(["compare", data["path"], "--program", "10", "--loss", "squared", "--beta-frac", "0.1", "--steps",
                 "50", "--models", "alternative,softmax,convex", "--heads", "4", "--out-dir", str(out), "--json",
                 "--quiet"])
    s = json.loads(capsys.readouterr().out)
    assert code == 0 and "tuning" not in s and s["lr"] == 0.01
    for model, m in s["models"].items():
        assert m["beta"] == s["beta"] and m["objective"] == pytest.approx(m["loss_sum"] + m["regularizer"], rel=1e-12)
    conv = s["models"]["convex"]
    assert conv["network"] == "(10)" and conv["bounding_program"] == 10 and conv["heads"] == 2 * 4  # groups c * n
    assert conv["certified_lower_bound"] == s["dual_objective"] and conv["certified_gap"] >= 0
    P = ct.make_problem(data["X"], data["y"], program=10, loss="squared", beta=s["beta"])
    assert conv["objective"] == pytest.approx(P.primal_objective(np.load(out / "convex.npz")["Z"]), rel=1e-12)


@pytest.mark.slow
def test_distance_of_each_attention_map_to_the_teacher(data, capsys):
    teacher = np.full((4, 4), 0.1) + 0.6 * np.eye(4)
    path = data["tmp"] / "teacher.npz"
    np.savez(path, X=data["X"], y=data["y"], X_test=data["X_test"], y_test=data["y_test"], teacher_attention=teacher)
    out = data["tmp"] / "t"
    assert main(["compare", str(path), "--program", "10", "--loss", "squared", "--beta-frac", "0.2", "--steps", "5",
                 "--out-dir", str(out), "--json", "--quiet"]) == 0
    s = json.loads(capsys.readouterr().out)
    dist = s["attention_distance_to_teacher"]
    # vector targets: one output row, compared with the teacher's row 0 ([CLS])
    norms = np.linalg.norm(np.load(out / "convex_p10.npz")["Z"], axis=-1).sum(axis=0)
    expected = 0.5 * np.abs(norms / norms.sum() - teacher[0] / teacher[0].sum()).sum()
    assert dist["convex (10), exact: token group norms"] == pytest.approx(expected, rel=1e-12)
    assert dist["uniform map (reference)"] == pytest.approx(0.5 * np.abs(0.25 - teacher[0] / teacher[0].sum()).sum())


@pytest.mark.parametrize("extra, match, keep", [
    (["--tune"], "DATA: --tune needs X_val and y_val", "no_val"),
    (["--tune", "--beta", "1"], "--beta: not with --tune", None),
    (["--tune", "--beta-frac", "0.1"], "--beta-frac: not with --tune", None),
    (["--tune", "--lr", "0.1"], "--lr: not with --tune", None),
    (["--lr-grid", "0.1", "--beta", "1"], "--lr-grid: only with --tune", None),
    (["--beta-grid", "0.1", "--beta", "1"], "--beta-grid: only with --tune", None),
    ([], "--beta: one of --beta, --beta-frac or --tune is required", None),
    (["--tune", "--lr-grid", "0.1,0"], "--lr-grid: expected a number > 0", None),
    (["--tune", "--beta-grid", ","], "--beta-grid: expected a comma-separated list", None),
    (["--tune", "--heads", "2,3"], "--heads: expected one head count with --tune", None),
    (["--tune"], "DATA: ", "half_val"),
    (["--tune"], "X_val: expected the token shape of X", "bad_val"),
    (["--beta", "1"], "teacher_attention: expected shape (4, 4)", "bad_teacher"),
])
def test_tuning_user_errors_exit_2_with_one_line_and_write_nothing(data, capsys, extra, match, keep):
    variants = {"no_val": dict(X=data["X"], y=data["y"]),
                "half_val": dict(X=data["X"], y=data["y"], X_val=data["X_val"]),
                "bad_val": dict(X=data["X"], y=data["y"], X_val=data["X_val"][:, :3], y_val=data["y_val"]),
                "bad_teacher": dict(X=data["X"], y=data["y"], teacher_attention=np.ones((3, 4)))}
    path = data["path"]
    if keep:
        path = str(data["tmp"] / f"{keep}.npz")
        np.savez(path, **variants[keep])
    out = data["tmp"] / "never"
    code = main(["compare", path, "--program", "10", "--loss", "squared", "--out-dir", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("cvxtransformer compare: error:"), err
    assert match in err
    assert not out.exists()


def test_the_convex_model_needs_a_group_lasso_program(data, capsys):
    assert main(["compare", data["path"], "--program", "mhsa", "--loss", "squared", "--beta", "1", "--models", "convex",
                 "--out-dir", str(data["tmp"] / "never")]) == 2
    assert "--models: expected softmax or linear_mhsa with program (mhsa), got 'convex'; convex joins programs 8, 10, " \
           "12" in capsys.readouterr().err
