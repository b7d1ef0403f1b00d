"""Output that pipes, reads and labels right (issue 23, item 4): a closed pipe ends quietly, negative
numbers in scientific notation get the option's own error, one named number a line, a progress line
for long solves (silenced by --quiet), string labels mapped as the estimators map them, and the
energy plot's key matching its colours."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import cvxtransformer as ct
from cvxtransformer.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = ["--program", "10", "--loss", "squared", "--beta-frac", "0.2"]


@pytest.fixture
def data(tmp_path):
    X = np.random.default_rng(0).standard_normal((40, 4, 3))
    path = tmp_path / "data.npz"
    np.savez(path, X=X, y=X[:, 0, :2])
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["solve", "DATA", *CORE, "--solver", "fista", "--json"], ["compare", "--help"]])
def test_a_closed_pipe_ends_quietly(data, argv):
    """The reader goes away before the command writes (``| head``): no traceback, the exit code of SIGPIPE."""
    argv = [data if a == "DATA" else a for a in argv]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "cvxtransformer", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait()
    assert err == "" and code in (0, 141), err  # --help may fit the pipe's buffer before it closes
    if argv[0] == "solve":
        assert code == 141


@pytest.mark.parametrize("option, value, match", [
    ("--tol", "-1e-6", "argument --tol: expected a relative gap in (0, 1), e.g. 1e-6, got -1e-6"),
    ("--beta-frac", "-2E-3", "argument --beta-frac: expected a number > 0, got -2E-3"),
    ("--tol", "-.5", "argument --tol: expected a relative gap in (0, 1), e.g. 1e-6, got -.5"),
])
def test_negative_numbers_get_the_options_own_error(data, capsys, option, value, match):
    argv = ["solve", data, "--program", "10", "--loss", "squared", "--beta", "1", option, value]
    if option == "--beta-frac":
        argv.remove("--beta"), argv.remove("1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err


NUMBER = re.compile(r"(?<![\w(])[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?(?![\w)])")


def numbers_per_line(text):
    """Numbers on each line outside its parenthesised note (names such as P(Z), D(V), (9) excluded)."""
    counts = []
    for line in text.splitlines():
        value = re.sub(r"\s\s\(.*\)$", "", line)[27:] if line.startswith("  ") else ""
        counts.append(len(NUMBER.findall(value)))
    return counts


def test_the_certificate_prints_one_named_number_a_line(data, capsys, tmp_path, monkeypatch):
    from cvxtransformer.nn import trainer

    out = str(tmp_path / "r.npz")
    assert main(["solve", data, *CORE, "--solver", "fista", "--out", out]) == 0
    assert main(["verify", data, out, *CORE]) == 0  # with the refined dual point
    real = trainer.train
    monkeypatch.setattr(trainer, "train", lambda *a, **k: real(*a, **dict(k, steps=20)))
    assert main(["demo"]) == 0
    text = capsys.readouterr().out
    assert max(numbers_per_line(text)) == 1
    for name in ("relative gap", "relative gap, Z alone", "relative gap, refined", "refinement ended", "tolerance",
                 "certified gap", "relative certified gap", "certified lower bound"):
        assert re.search(rf"^  {re.escape(name)}\s{{2,}}\S", text, re.M), name
    refined = [line for line in text.splitlines() if line.startswith("  refinement ended")]
    assert refined and all(line.endswith("(its own iterate, not Z)") for line in refined)


def test_a_long_solve_says_so_and_quiet_silences_it(data, capsys, monkeypatch):
    import time

    from cvxtransformer.cli import convex
    from cvxtransformer.solvers.proxgrad import ProxGrad

    real = ProxGrad.solve

    def slow(self, *args, **kwargs):
        time.sleep(0.5)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ProxGrad, "solve", slow)
    monkeypatch.setattr(convex, "HEARTBEAT", 0.05)
    assert main(["solve", data, *CORE, "--solver", "fista", "--json"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err and err[0].startswith("cvxtransformer: fista on the primal of program (10), N = 40 samples, "
                                     "Z of shape (2, 4, 3) (24 coefficients): running for 0 s")
    assert main(["solve", data, *CORE, "--solver", "fista", "--json", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_the_heartbeat_repeats_until_the_block_ends():
    import io
    import time

    from cvxtransformer.solving import heartbeat

    stream = io.StringIO()
    with heartbeat("work", after=0.02, every=0.05, stream=stream):
        time.sleep(0.3)
    lines = stream.getvalue().splitlines()
    assert 3 <= len(lines) <= 7 and all(line.startswith("cvxtransformer: work: running for ") for line in lines)
    time.sleep(0.1)
    assert len(stream.getvalue().splitlines()) == len(lines)  # stopped with the block


@pytest.mark.slow
def test_string_labels_are_mapped_as_the_estimators_map_them(tmp_path, capsys):
    X = np.random.default_rng(1).standard_normal((45, 4, 3))
    codes = np.digitize(X[:, 0, 0], [-0.4, 0.4])  # 0, 1, 2
    names = np.array(["cat", "dog", "emu"])[codes]
    np.savez(tmp_path / "s.npz", X=X[:35], y=names[:35], X_test=X[35:], y_test=names[35:])
    np.savez(tmp_path / "i.npz", X=X[:35], y=codes[:35])
    args = ["--program", "10", "--loss", "cross_entropy", "--beta", "2", "--json"]
    assert main(["solve", str(tmp_path / "s.npz"), *args, "--out", str(tmp_path / "r.npz")]) == 0
    s = json.loads(capsys.readouterr().out)
    assert main(["solve", str(tmp_path / "i.npz"), *args]) == 0
    i = json.loads(capsys.readouterr().out)
    assert s["classes"] == ["cat", "dog", "emu"] and s["class_mapping"] == "cat -> 0, dog -> 1, emu -> 2"
    assert s["primal_objective"] == pytest.approx(i["primal_objective"], rel=1e-10)
    assert np.load(tmp_path / "r.npz")["classes"].tolist() == ["cat", "dog", "emu"]
    assert main(["verify", str(tmp_path / "s.npz"), str(tmp_path / "r.npz"), *args]) == 0
    assert json.loads(capsys.readouterr().out)["certified"] is True
    # for the logistic loss: classes sorted, the first -> -1 (the estimators' mapping, tested below)
    numeric = ct.make_problem(X, np.where(codes == 1, 1, -1), program=8, loss="logistic", beta=1.0)
    reference = ct.solve(numeric.with_beta(0.3 * numeric.beta_max()), "clarabel")
    two = np.where(codes == 1, "yes", "no")
    np.savez(tmp_path / "two.npz", X=X, y=two)
    assert main(["solve", str(tmp_path / "two.npz"), "--program", "8", "--loss", "logistic", "--beta-frac", "0.3",
                 "--json"]) == 0
    logistic = json.loads(capsys.readouterr().out)
    assert logistic["class_mapping"] == "no -> -1, yes -> +1"
    assert logistic["primal_objective"] == pytest.approx(reference.certificate.primal_objective, rel=1e-8)
    # compare maps the test split with the training classes
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "s.npz"), *args, "--models", "alternative", "--steps", "5",
                 "--out-dir", str(out), "--quiet"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["classes"] == ["cat", "dog", "emu"] and json.loads((out / "compare.json").read_text())["classes"]
    assert c["models"]["alternative"]["test_accuracy"] is not None


def test_the_command_line_maps_labels_as_the_estimators_do(tmp_path, capsys):
    pytest.importorskip("sklearn", reason="the estimators need scikit-learn")
    X = np.random.default_rng(1).standard_normal((45, 4, 3))
    dog = np.digitize(X[:, 0, 0], [-0.4, 0.4]) == 1
    clf = ct.AttentionClassifier(program=8, loss="logistic", beta_frac=0.3).fit(X, dog)
    np.savez(tmp_path / "two.npz", X=X, y=np.where(dog, "yes", "no"))
    assert main(["solve", str(tmp_path / "two.npz"), "--program", "8", "--loss", "logistic", "--beta-frac", "0.3",
                 "--json"]) == 0
    primal = json.loads(capsys.readouterr().out)["primal_objective"]
    assert primal == pytest.approx(clf.certificate_.primal_objective, rel=1e-8)


@pytest.mark.parametrize("y, loss, match", [
    (np.array(["a", "b"] * 20), "squared", "y: expected numeric targets for the squared loss"),
    (np.array(["a", "b", "c"] * 13 + ["a"]), "logistic", "y: expected 2 classes for the logistic loss, got 3"),
])
def test_string_labels_that_cannot_be_mapped(tmp_path, capsys, y, loss, match):
    X = np.random.default_rng(1).standard_normal((40, 4, 3))
    np.savez(tmp_path / "s.npz", X=X, y=y)
    assert main(["solve", str(tmp_path / "s.npz"), "--program", "8", "--loss", loss, "--beta", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err


def test_compare_refuses_test_labels_it_has_not_seen(tmp_path, capsys):
    X = np.random.default_rng(1).standard_normal((40, 4, 3))
    np.savez(tmp_path / "s.npz", X=X[:30], y=np.array(["a", "b"] * 15), X_test=X[30:], y_test=np.array(["a", "z"] * 5))
    assert main(["compare", str(tmp_path / "s.npz"), "--program", "10", "--loss", "cross_entropy", "--beta", "1",
                 "--out-dir", str(tmp_path / "never")]) == 2
    assert "y_test: labels ['z'] are not among the classes ['a', 'b']" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_the_energy_plots_key_names_every_colour_it_uses(monkeypatch):
    from cvxtransformer.energy import plots

    kept = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: kept.setdefault("fig", fig))
    rel = np.array([[-0.1, 0.2, -0.3], [-0.2, 0.1, 0.4], [-0.05, 0.3, -0.1]])  # always, never, sometimes
    plots.plot_layers({"model": "m", "relative_change": rel, "control_fraction_descended": np.eye(3)}, "unused.png")
    ax = kept["fig"].axes[0]
    dots = {line.get_color() for line in ax.get_lines() if line.get_marker() == "."}
    legend = ax.get_legend()
    keyed = {h.get_color(): t.get_text() for h, t in zip(legend.legend_handles, legend.get_texts())
             if h.get_marker() == "."}
    assert dots == set(keyed) == {"C2", "C3", "C1"}
    assert keyed == {"C2": "descends on every sentence", "C1": "on some sentences", "C3": "on none"}
    assert "green" not in ax.get_title() and "red" not in ax.get_title()
