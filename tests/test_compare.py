"""``cvxtransformer compare``: JSON, weights, plots, certified gaps, and user errors."""
import json
import os

import numpy as np
import pytest
import torch

from cvxtransformer.cli import main
from cvxtransformer.datasets import student_teacher


@pytest.fixture
def data(tmp_path):
    X, Y = student_teacher(N=50, n=4, d=3, c=2, heads=2, noise=0.05, seed=0)
    path = tmp_path / "data.npz"
    np.savez(path, X=X[:40], y=Y[:40], X_test=X[40:], y_test=Y[40:])
    Xs, Ys = student_teacher(N=30, n=4, d=3, c=2, teacher="softmax", sequence=True, seed=1)
    seq = tmp_path / "sequence.npz"
    np.savez(seq, X=Xs, y=Ys)
    return {"vector": str(path), "sequence": str(seq), "tmp": tmp_path}


def compare(capsys, argv):
    code = main(["compare"] + argv + ["--json", "--quiet"])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


@pytest.mark.slow
def test_compare_writes_plots_weights_and_json(data, capsys):
    out = data["tmp"] / "run"
    code, s, err = compare(capsys, [data["vector"], "--program", "10", "--loss", "squared", "--beta-frac", "0.2",
                                    "--models", "alternative,gated,softmax", "--steps", "60", "--heads", "5",
                                    "--gates", "3", "--out-dir", str(out)])
    assert code == 0 and err == ""
    assert s["certified"] and s["primal_objective"] >= s["dual_objective"]
    assert set(s["models"]) == {"alternative", "gated", "softmax"} and set(s["convex"]) == {"10", "12"}
    for model in ("alternative", "gated"):
        m = s["models"][model]
        bound = s["convex"][str(m["bounding_program"])]["dual_objective"]
        assert m["bounding_program"] == {"alternative": 10, "gated": 12}[model]
        assert m["certified_lower_bound"] == bound
        assert m["certified_gap"] == pytest.approx(m["objective"] - bound) and m["certified_gap"] >= 0
        assert m["seconds"] > 0 and m["bound_applies"] is True and m["heads"] == 5
    soft = s["models"]["softmax"]
    assert soft["certified_gap"] is None and soft["bound_applies"] is False
    assert soft["objective_minus_convex_optimum"] == pytest.approx(soft["objective"] - s["primal_objective"])
    assert s["models"]["alternative"]["certified_lower_bound"] == s["dual_objective"]
    for name in ("objective.png", "attention.png", "test_loss.png", "compare.json", "convex_p10.npz",
                 "convex_p12.npz"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "objective.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "compare.json").read_text())["models"]["gated"]["objective"] == \
        s["models"]["gated"]["objective"]
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    with np.load(out / "alternative.npz") as f:
        assert f["W1"].shape == (5, 4) and f["W2"].shape == (5, 3) and f["W3"].shape == (5, 2)
        np.testing.assert_allclose(f["W1"].sum(axis=1), 1.0)
        assert np.all(f["W1"] >= 0)
        assert f["objective_history"].shape == (61,)
        assert f["objective_history"][-1] == s["models"]["alternative"]["objective"]
    with np.load(out / "gated.npz") as f:
        assert f["gate"].shape == (5,) and f["U1"].shape == (3, 4) and f["U2"].shape == (3, 3)
        assert f["W3"].shape == (5, 2) and np.all((f["gate"] >= 0) & (f["gate"] < 3))
    with np.load(out / "softmax.npz") as f:
        assert f["Wq"].shape == f["Wk"].shape == f["Wv"].shape == (3, 3) and f["Wo"].shape == (3, 2)


@pytest.mark.slow
def test_the_reported_objective_is_the_saved_networks_objective(data, capsys):
    import cvxtransformer as ct

    out = data["tmp"] / "run"
    _, s, _ = compare(capsys, [data["vector"], "--program", "10", "--loss", "squared", "--beta", "2.0",
                               "--models", "alternative", "--steps", "40", "--out-dir", str(out)])
    with np.load(data["vector"]) as f:
        X, y = f["X"], f["y"]
    with np.load(out / "alternative.npz") as f:
        weights = ct.AttentionHeads(f["W1"], f["W2"], f["W3"])
    problem = ct.make_problem(X, y, program=10, loss="squared", beta=2.0)
    value = ct.nonconvex_objective(problem, weights)
    assert s["models"]["alternative"]["objective"] == pytest.approx(value, rel=1e-12)
    assert value >= ct.certify(problem, np.load(out / "convex_p10.npz")["Z"]).dual_objective


@pytest.mark.slow
def test_sequence_targets_program_12_defaults_and_text_output(data, capsys):
    out = data["tmp"] / "seq"
    code = main(["compare", data["sequence"], "--program", "12", "--loss", "squared", "--beta-frac", "0.3",
                 "--steps", "20", "--gates", "2", "--optimizer", "sgd", "--lr", "1e-4", "--batch-size", "10",
                 "--out-dir", str(out), "--quiet"])
    text = capsys.readouterr().out
    assert code == 0
    assert "certified gap" in text and "not covered by the bound" in text
    s = json.loads((out / "compare.json").read_text())
    # several outputs: the default is network (11) with ordinary weight decay, bounded by 12wd on the same gates,
    # with as many heads as its optimum needs (the ranks of its token matrices, summed)
    assert list(s["models"]) == ["gated_wd", "softmax"] and s["sequence_targets"] is True
    assert s["models"]["gated_wd"]["bounding_program"] == "12wd"
    assert s["models"]["gated_wd"]["heads"] == max(1, s["convex"]["12wd"]["support_size"])
    assert not (out / "test_loss.png").exists() and (out / "attention.png").exists()


@pytest.mark.slow
def test_same_seed_same_numbers(data, capsys):
    argv = [data["vector"], "--program", "8", "--loss", "squared", "--beta-frac", "0.3", "--steps", "30"]
    with np.load(data["vector"]) as f:
        np.savez(data["tmp"] / "scalar.npz", X=f["X"], y=f["y"][:, 0])
    argv[0] = str(data["tmp"] / "scalar.npz")
    _, a, _ = compare(capsys, argv + ["--out-dir", str(data["tmp"] / "a")])
    _, b, _ = compare(capsys, argv + ["--out-dir", str(data["tmp"] / "b")])
    assert a["program"] == 8 and a["models"]["alternative"]["bounding_program"] == 8
    for model in ("alternative", "softmax"):
        assert a["models"][model]["objective"] == b["models"][model]["objective"]


@pytest.mark.parametrize("extra, match", [
    (["--models", "alternative,transformer"], "--models: expected a comma-separated list"),
    (["--steps", "0"], "--steps: expected an integer >= 1"),
    (["--lr", "-1"], "--lr: expected a number > 0"),
    (["--lr", "0"], "--lr: expected"),
    (["--optimizer", "lbfgs"], "--optimizer: invalid choice"),
    (["--heads", "0"], "--heads: expected an integer in [1, 1000000]"),
    (["--batch-size", "1000"], "batch_size: expected at most"),
    (["--beta", "-1"], "--beta: expected a number > 0"),
    (["--gates", "0"], "--gates"),
    (["--solver", "cplex"], "--solver: invalid choice"),
])
def test_user_errors_exit_2_with_one_line_and_write_nothing(data, capsys, extra, match):
    out = data["tmp"] / "never"
    argv = ["compare", data["vector"], "--program", "10", "--loss", "squared", "--out-dir", str(out)]
    if "--beta" not in extra:
        argv += ["--beta-frac", "0.2"]
    code = main(argv + extra)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("cvxtransformer compare: error:")
    assert match in err
    assert not out.exists()


def test_data_errors(data, capsys):
    bad = data["tmp"] / "bad.npz"
    with np.load(data["vector"]) as f:
        np.savez(bad, X=f["X"], y=f["y"], X_test=f["X_test"])
    base = ["--program", "10", "--loss", "squared", "--beta", "1", "--out-dir"]
    assert main(["compare", str(bad)] + base + [str(data["tmp"] / "o1")]) == 2
    assert "only one of X_test, y_test" in capsys.readouterr().err
    assert main(["compare", str(data["tmp"] / "missing.npz")] + base + [str(data["tmp"] / "o2")]) == 2
    assert "not found" in capsys.readouterr().err
    a_file = data["tmp"] / "file"
    a_file.write_text("x")
    assert main(["compare", data["vector"]] + base + [str(a_file)]) == 2
    assert "--out-dir: expected a folder" in capsys.readouterr().err
    assert main(["compare", data["vector"], "--program", "8", "--loss", "squared", "--beta", "1",
                 "--out-dir", str(data["tmp"] / "o3")]) == 2
    assert "y: expected shape (N,) for program (8)" in capsys.readouterr().err
    assert not any((data["tmp"] / f"o{i}").exists() for i in (1, 2, 3))


@pytest.mark.slow
def test_demo_reports_the_certified_gap_of_the_adam_trained_alternative_network(capsys):
    assert main(["demo", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    alt = s["alternative_adam"]
    assert alt["certified_lower_bound"] == s["dual_objective"] and s["program"] == "10wd" and alt["network"] == "(9w)"
    assert alt["heads"] == s["support_size"] >= 1  # as many heads as the optimum needs
    assert alt["certified_gap"] == pytest.approx(alt["objective"] - s["dual_objective"])
    assert alt["objective"] >= s["dual_objective"] and alt["certified_gap"] > 0


@pytest.mark.slow
def test_the_api_and_the_command_give_the_same_numbers_on_the_same_seed(data, capsys):
    import cvxtransformer as ct

    out = data["tmp"] / "cli"
    code, s, _ = compare(capsys, [data["vector"], "--program", "10", "--loss", "squared", "--beta-frac", "0.2",
                                  "--models", "alternative,gated,softmax", "--steps", "40", "--heads", "3,5",
                                  "--gates", "2", "--seed", "3", "--out-dir", str(out)])
    with np.load(data["vector"]) as f:
        X, y, X_test, y_test = f["X"], f["y"], f["X_test"], f["y_test"]
    P = ct.make_problem(X, y, program=10, loss="squared", beta=1.0)
    result = ct.compare(P.with_beta(0.2 * P.beta_max()), models=["alternative", "gated", "softmax"], steps=40,
                        heads=[3, 5], gates=2, seed=3, test=(X_test, y_test))
    d = result.to_dict()
    assert code == 0 and result.certified
    assert set(s["models"]) == set(result.models) == {"alternative_m3", "alternative_m5", "gated_m3", "gated_m5",
                                                      "softmax"}
    assert s["beta"] == d["beta"] == result.problem.beta
    for key in ("primal_objective", "dual_objective"):
        assert s[key] == pytest.approx(d[key], rel=1e-12) and d[key] == pytest.approx(getattr(result.certificate, key))
    for name, m in s["models"].items():
        run = result.models[name]
        assert run.objective == m["objective"] and run.test_loss == m["test_loss"]
        assert run.certified_lower_bound == pytest.approx(m["certified_lower_bound"], rel=1e-12)
        assert (run.certified_gap is None) == (m["certified_gap"] is None)
        with np.load(out / f"{name}.npz") as f:
            np.testing.assert_array_equal(run.curve[1], f["objective_history"])
    assert s["labels"] == d["labels"] and d["labels"]["alternative_m5"] == "alternative (9), m = 5"


@pytest.mark.slow
def test_a_classifier_reports_accuracy_and_one_attention_row_per_class(tmp_path):
    import cvxtransformer as ct

    X, Y = student_teacher(N=60, n=4, d=3, c=3, heads=2, noise=0.05, seed=0)
    y = np.argmax(Y, axis=1)
    P = ct.make_problem(X[:45], y[:45], program=10, loss="cross_entropy", beta=1.0)
    result = ct.compare(P.with_beta(0.2 * P.beta_max()), models="alternative,softmax", steps=30, heads=4,
                        test=(X[45:], y[45:]))
    run = result.models["alternative"]
    with torch.no_grad():
        scores = run.network(*run.network.encode_inputs(X[45:])).numpy()
    assert run.test_accuracy == pytest.approx(np.mean(np.argmax(scores, axis=1) == y[45:]))
    text = str(result)
    assert "alternative (9), m = 4: lr 0.01" in text and f"test {run.test_accuracy:.4f}" in text
    maps = result.attention_maps()
    assert maps["alternative (9), m = 4: group norms"][0].shape == (3, 4)  # one row per class
    assert maps["alternative (9), m = 4: group norms"][1] == "class l"
    Z = result.solutions[10].Z
    np.testing.assert_allclose(maps["convex (10), exact: token group norms"][0], np.linalg.norm(Z, axis=-1))
    files = result.plot(tmp_path / "plots")
    assert files == ["objective.png", "attention.png", "test_loss.png"]
    assert all((tmp_path / "plots" / f).read_bytes()[:4] == b"\x89PNG" for f in files)
