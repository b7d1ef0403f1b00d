"""A researcher's first frictions (issue 36, items 4 to 8): one API for beta / beta_frac and class
labels across make_problem, the command line and the estimators; mistyped options named with the
closest real one; the wrote line of ``solve --out`` and verify's first line; ``dir(ct)``; a scaler
for 3-d X in a scikit-learn Pipeline."""
import json

import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.cli import COMMANDS, build_parser, main


@pytest.fixture
def X():
    return np.random.default_rng(3).standard_normal((36, 4, 3))


# ----------------------------------------------------------------------------- item 4: beta / beta_frac
@pytest.mark.parametrize("program, loss", [(8, "squared"), (10, "logistic"), ("mhsa", "squared")])
def test_issue36_beta_frac_is_the_fraction_of_beta_max(X, program, loss):
    y = X[:, 0, 0] if loss == "squared" else np.where(X[:, 1, 2] > 0, 1.0, -1.0)
    by_beta = ct.make_problem(X, y, program=program, loss=loss, beta=1.0)
    by_frac = ct.make_problem(X, y, program=program, loss=loss, beta_frac=0.3)
    assert by_frac.beta == pytest.approx(0.3 * by_beta.beta_max(), rel=1e-14)
    assert by_frac.beta_max() == pytest.approx(by_beta.beta_max(), rel=1e-14)
    np.testing.assert_array_equal(by_frac.T, by_beta.T)


def test_issue36_beta_frac_one_is_where_zero_becomes_optimal(X):
    """beta_max as its definition says: Z = 0 is optimal at beta_frac = 1 and not below it."""
    y = X[:, 0, 0]
    at = ct.solve(ct.make_problem(X, y, program=8, beta_frac=1.0), solver="clarabel")
    below = ct.solve(ct.make_problem(X, y, program=8, beta_frac=0.9), solver="clarabel")
    assert at.certified and below.certified
    assert np.abs(at.Z).max() == 0 and np.abs(below.Z).max() > 1e-3


@pytest.mark.parametrize("kwargs, match", [
    ({}, r"beta, beta_frac: expected exactly one of them, got neither; pass beta .* or beta_frac"),
    (dict(beta=1.0, beta_frac=0.1), r"beta, beta_frac: expected exactly one of them, got both"),
    (dict(beta_frac=0.0), r"beta_frac: expected a finite number > 0, got 0.0"),
    (dict(beta_frac=float("nan")), r"beta_frac: expected a finite number > 0, got nan"),
])
def test_issue36_beta_and_beta_frac_exactly_one(X, kwargs, match):
    with pytest.raises(ct.InvalidInputError, match=match):
        ct.make_problem(X, X[:, 0, 0], program=8, **kwargs)


# ----------------------------------------------------------------------------- item 4: class labels
@pytest.mark.parametrize("loss, names", [("logistic", ["no", "yes"]), ("cross_entropy", ["cat", "cow", "dog"])])
def test_issue36_string_labels_make_the_problem_of_the_mapped_integers(X, loss, names):
    index = np.digitize(X[:, 0, 0], [-0.3, 0.3]) % len(names)
    labels = np.array(names)[index]  # names are sorted: class k is names[k]
    codes = 2 * index - 1 if loss == "logistic" else index
    by_name = ct.make_problem(X, labels, program=10, loss=loss, beta_frac=0.2)
    by_code = ct.make_problem(X, codes, program=10, loss=loss, beta_frac=0.2)
    assert by_name.classes.tolist() == names and by_code.classes is None
    np.testing.assert_array_equal(by_name.T, by_code.T)
    assert by_name.beta == by_code.beta and by_name.with_beta(1.0).classes.tolist() == names
    # the command line and the estimators map the same way (one function)
    from cvxtransformer.cli.options import encode_labels

    mapped, classes = encode_labels(labels, loss)
    np.testing.assert_array_equal(mapped, codes)
    assert classes.tolist() == names


def test_issue36_the_estimator_the_command_line_and_make_problem_agree(X, tmp_path, capsys):
    pytest.importorskip("sklearn", reason="the estimators need scikit-learn")
    labels = np.where(X[:, 2, 1] > 0.2, "dog", "cat")
    problem = ct.make_problem(X, labels, program=10, loss="logistic", beta_frac=0.3)
    model = ct.AttentionClassifier(program=10, loss="logistic", beta_frac=0.3).fit(X, labels)
    np.testing.assert_array_equal(model.problem_.T, problem.T)
    assert model.beta_ == problem.beta and model.classes_.tolist() == problem.classes.tolist()
    np.savez(tmp_path / "d.npz", X=X, y=labels)
    assert main(["solve", str(tmp_path / "d.npz"), "--program", "10", "--loss", "logistic", "--beta-frac", "0.3",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["beta"] == pytest.approx(problem.beta, rel=1e-14) and summary["classes"] == ["cat", "dog"]


def test_issue36_labels_that_cannot_be_classes(X):
    with pytest.raises(ct.InvalidInputError, match=r"y: expected 2 classes for the logistic loss, got 3 classes"):
        ct.make_problem(X, np.array(["a", "b", "c"] * 12), program=10, loss="logistic", beta=1.0)
    with pytest.raises(ct.InvalidInputError, match=r"y: expected numeric targets for the squared loss"):
        ct.make_problem(X, np.array(["a", "b"] * 18), program=10, beta=1.0)


# ----------------------------------------------------------------------------- item 5: typos
@pytest.mark.parametrize("typo, option", [("--beta_frac", "--beta-frac"), ("--programm", "--program"),
                                          ("--max_iter", "--max-iter"), ("--gate_seed", "--gate-seed")])
def test_issue36_a_mistyped_option_is_named_with_the_closest_one(tmp_path, capsys, typo, option):
    argv = ["solve", str(tmp_path / "absent.npz"), "--program", "8", "--loss", "squared", "--beta", "1"]
    argv = [typo if a == option else a for a in argv] + ([typo, "5"] if option not in argv else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"cvxtransformer solve: error: unrecognized argument {typo}: did you mean {option}? "
                   "(see cvxtransformer solve --help)\n")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_issue36_every_command_names_an_unknown_option(capsys, command):
    assert main([command, "--no-such-option-at-all"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"cvxtransformer {command}: error: unrecognized argument --no-such-option-at-all" in err


def test_issue36_abbreviations_and_values_are_not_typos():
    args = build_parser("solve").parse_args(["solve", "d.npz", "--program", "8", "--los", "squared", "--beta-f", "0.5",
                                             "--out=r.npz"])
    assert (args.loss, args.beta_frac, args.out) == ("squared", 0.5, "r.npz")


# ----------------------------------------------------------------------------- item 7
def test_issue36_dir_shows_the_api_and_no_helper_import():
    names = dir(ct)
    assert "importlib" not in names and not [n for n in names if n.startswith("_") and n != "__version__"]
    assert set(ct.__all__) <= set(names) and "make_problem" in names and "TokenStandardScaler" in names


def test_issue36_solve_help_lists_every_program(capsys):
    from cvxtransformer.core.registry import MODULES

    assert main(["solve", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    names = [str(name) for families in MODULES.values() for name in families]
    assert {"gated_mhsa", "mhsa", "mixer"} <= set(names)
    assert "{" + ",".join(names) + "}" in text  # --program's choices
    for name in names:  # and what each is, in --program's help
        assert f"{name}: " in text, name


def test_issue36_solve_out_says_what_it_wrote_and_verify_how_z_was_solved(X, tmp_path, capsys):
    np.savez(tmp_path / "d.npz", X=X, y=X[:, 0, :2])
    out = str(tmp_path / "r.npz")
    argv = ["--program", "10", "--loss", "squared", "--beta-frac", "0.2"]
    assert main(["solve", str(tmp_path / "d.npz"), *argv, "--solver", "clarabel", "--out", out, "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"wrote {out}" and "verdict" in lines[-2]
    assert main(["solve", str(tmp_path / "d.npz"), *argv, "--solver", "clarabel", "--out", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["out"] == out
    assert main(["verify", str(tmp_path / "d.npz"), out, *argv]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"program (10), squared loss, Z from {out} (solved by clarabel, primal form)")
    np.savez(tmp_path / "z.npz", Z=np.load(out)["Z"])  # a Z from elsewhere: no summary
    assert main(["verify", str(tmp_path / "d.npz"), str(tmp_path / "z.npz"), *argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["given_Z"] == str(tmp_path / "z.npz") and summary["solver"] is None


def test_issue36_token_scaler_in_a_pipeline(X):
    pytest.importorskip("sklearn", reason="the estimators need scikit-learn")
    from sklearn.pipeline import make_pipeline

    X = 4.0 + np.array([1.0, 10.0, 0.1]) * X
    y = X[:, 1, 0] - 20 * X[:, 2, 2]
    mean, std = X.mean(axis=(0, 1)), X.std(axis=(0, 1))  # over samples and tokens, per feature
    pipe = make_pipeline(ct.TokenStandardScaler(), ct.AttentionRegressor(program=8, beta_frac=0.05)).fit(X, y)
    alone = ct.AttentionRegressor(program=8, beta_frac=0.05).fit((X - mean) / std, y)
    np.testing.assert_allclose(pipe[-1].coef_, alone.coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(pipe.predict(X[:5]), alone.predict((X[:5] - mean) / std), rtol=1e-9, atol=1e-12)
    other = np.random.default_rng(0).standard_normal((3, 7, 3))  # another number of tokens
    np.testing.assert_allclose(pipe[0].transform(other), (other - mean) / std, rtol=1e-12)
    with pytest.raises(ct.InvalidInputError, match=r"X: expected tokens of dimension d = 3, as in fit"):
        pipe[0].transform(other[:, :, :2])
